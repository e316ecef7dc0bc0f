"""Configuration mistakes told in one line each, naming the variable or flag the user typed.

pydantic-settings reports a misspelt setting inside a known section (``KAFSCALE_STORAGE__BUCKT``)
as a four-line validation error in its own terms (``storage.buckt``, "Extra inputs are not
permitted", a link), and silently ignores one whose section is misspelt or whose ``__`` is a
single ``_`` (``KAFSCALE_ETCD_ENDPOINTS``): the broker then starts on the default and fails
later on something the user did not ask for (etcd at 127.0.0.1:2379). Both are decided here,
from the settings models and the environment passed in: pure functions, no I/O.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from kafscale.broker.settings_cli import ENV_PREFIX, env_name, flag_name, iter_fields, list_fields

# How alike a name must be to a setting's to count as a misspelling of it: one letter or one
# underscore off in a name of 20 or more characters (KAFSCALE_ETCD_ENDPOINTS: 0.98).
CLOSE_ENOUGH = 0.9


def setting_paths(models: Iterable[type[BaseModel]]) -> list[tuple[str, ...]]:
    """Every setting of ``models`` (a broker's and a proxy's share most), each once."""
    return list(dict.fromkeys(path for model in models for path, _ in iter_fields(model)))


def misspelt_variables(environ: Mapping[str, str], models: Sequence[type[BaseModel]]) -> list[str]:
    """One line per ``KAFSCALE_*`` variable that names no setting and no section of ``models``
    but is a near miss of a setting's variable, with the name meant. Names inside a known
    section are left to the model's own validation; names like no setting (the operator's
    ``KAFSCALE_OPERATOR_*``, ``KAFSCALE_POD_NAME``, a test harness's own) pass."""
    paths = setting_paths(models)
    known = {env_name(path) for path in paths}
    sections = {env_name(path[:1]) + "__" for path in paths if len(path) > 1}
    lines = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        if any(upper.startswith(section) for section in sections):
            continue
        meant = difflib.get_close_matches(upper, known, n=1, cutoff=CLOSE_ENOUGH)
        if meant:
            lines.append(f"{name} is not a setting; did you mean {meant[0]}?")
    return lines


def describe_errors(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """One line per error of ``exc``: the setting as variable and flag, what is wrong, and for an
    unknown name the setting it is closest to."""
    paths = setting_paths([model])
    return [_describe(error, paths) for error in exc.errors()]


def _describe(error: Any, paths: list[tuple[str, ...]]) -> str:
    path = tuple(str(part) for part in error["loc"])
    if not path:  # a check across settings: its message names them
        return str(error["msg"])
    where = f"{'.'.join(path)} ({env_name(path)} or {flag_name(path)})"
    if error["type"] == "extra_forbidden":
        dotted = {".".join(p): p for p in paths}
        meant = difflib.get_close_matches(".".join(path), dotted, n=1, cutoff=0.6)
        hint = f"; did you mean {env_name(dotted[meant[0]])}?" if meant else ""
        return f"{where} is not a setting{hint}"
    given = error.get("input")
    shown = f" (given {given!r})" if isinstance(given, str | int | float) else ""
    return f"{where}: {error['msg']}{shown}"


def unparsable_variables(environ: Mapping[str, str], model: type[BaseModel]) -> list[str]:
    """One line per variable of a setting holding several values (etcd endpoints, super users)
    whose value is not JSON: pydantic-settings decodes those as JSON and raised a bare
    ``SettingsError`` naming only the section (a traceback, before this check)."""
    return [
        f"{'.'.join(path)} ({name}): {environ[name]!r} is not JSON; give a JSON list, "
        f'e.g. \'["a", "b"]\' (the flag {flag_name(path)} also takes a,b)'
        for path, name in unparsable_settings(environ, model)
    ]


def unparsable_settings(
    environ: Mapping[str, str], model: type[BaseModel]
) -> list[tuple[tuple[str, ...], str]]:
    """(setting, variable) of every list setting of ``model`` whose variable is not JSON."""
    expected = {env_name(path): path for path in list_fields(model)}
    found = []
    for name in sorted(environ):
        path = expected.get(name.upper())
        if path is None or not environ[name].strip():
            continue
        try:
            json.loads(environ[name])
        except ValueError:
            found.append((path, name))
    return found
