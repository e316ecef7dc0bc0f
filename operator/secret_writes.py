"""Writing one Secret: read what holds its name, decide, write; read and decide again when the
name changes hands between the read and the write.

The operator writes a cluster's Secrets (its certificates, the delegation-token key) and a
KafScaleUser's (its password). Each writer reads the Secret of its name and decides from it
whose it is (:func:`ownership.owned_by`): one of another owner is never written over (the
cluster uses it as it is, a user reports ``SecretConflict``), the owner's own is renewed when it
must be, a free name gets a new one. The write is held to what was read (:meth:`Kube.write`:
the uid of the Secret read, or a create where none was), so a Secret someone puts in its place
between the read and the write is refused (:class:`NameChanged`) rather than taken over. The
name is then read again and the same decision made about the Secret now there, which counts as
another owner's, as if it had been there at the read: the outcome a user can act on, not a
retried ``ApplyFailed`` or ``SecretNotWritten``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kafscale.operator.kube import Kube, KubeError, NameChanged

log = logging.getLogger(__name__)

ATTEMPTS = 3  # reads of a name that keeps changing hands before the writer gives up

T = TypeVar("T")


@dataclass(frozen=True)
class SecretsPass:
    """What a pass of a cluster's Secret writers did: the names written, and the Secrets of
    other owners found under its names and used as they are (name → the Secret), which
    :mod:`secret_usability` judges."""

    written: list[str] = field(default_factory=list)
    found: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __add__(self, other: SecretsPass) -> SecretsPass:
        return SecretsPass([*self.written, *other.written], {**self.found, **other.found})


Decide = Callable[[dict[str, Any] | None], Awaitable[T]]


async def decide_and_write(kube: Kube, namespace: str, name: str, decide: Decide[T]) -> T:
    """``decide(secret)`` on the Secret that holds ``name`` now (None: none); ``decide`` writes,
    if it must, with :meth:`Kube.write` over what it was given. Read again and decided again
    when that write finds the name changed hands; :class:`KubeError` if it keeps doing so."""
    for _ in range(ATTEMPTS):
        secret = await kube.get("v1", "Secret", namespace, name)
        try:
            return await decide(secret)
        except NameChanged as exc:
            log.info(
                "Secret %s/%s changed hands before the write, read again: %s", namespace, name, exc
            )
    raise KubeError(f"Secret {namespace}/{name} kept changing hands meanwhile")
