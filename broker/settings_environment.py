"""The settings a process would parse from an environment that is not this process's own.

The operator renders the ``KAFSCALE_*`` variables of broker and proxy pods and must know, before
it rolls them out, whether those pods would start: whether pydantic refuses a value (a wrong
type or range, a half certificate pair a model checks) or ``settings_combinations`` refuses two
settings given together. It decides that here, from the variables it rendered, with the same
models and the same parsing (JSON lists, ``__`` between section and name) the pods use, and
never from its own ``os.environ``.

Pure: the variables in, the settings (or pydantic's ``ValidationError``) out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pydantic_settings import BaseSettings, EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

S = TypeVar("S", bound=BaseSettings)


class _GivenEnvironment(EnvSettingsSource):
    """pydantic-settings' own environment source, reading ``environ`` instead of ``os.environ``
    (the same decoding of nested names and complex values)."""

    def __init__(self, model: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._given = dict(environ)
        super().__init__(model)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._given, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


def settings_from_environment(model: type[S], environ: Mapping[str, str]) -> S:
    """``model`` as a process whose environment is ``environ`` parses it (defaults elsewhere).
    Only the variables given count as set (``model_fields_set``), as in that process."""
    return model(_build_sources=((_GivenEnvironment(model, environ),), {}))
