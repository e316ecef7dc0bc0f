"""Java share consumers (``KafkaShareConsumer``, kafka-clients 4.3) run as group members.

Each member is one JVM running a test's ``ShareMember.java``: it prints one line per record it
gets and acknowledges, and polls until its standard input closes. The test knows how many
deliveries the group must make; once the members together printed that many, their inputs are
closed and each closes its consumer. A member is never left to wait out an idle time: one of
two members on one partition may get no record at all, and used to poll on for a minute.
Whether anything more would have come is the caller's to prove (e.g. the share-partition's
stored start offset past every record: nothing is left to deliver).
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness import children
from harness.java_client import java_program

Delivery = tuple[str, int, int]
"""(value, offset, delivery count) as a member printed it."""


@dataclass
class _Member:
    process: subprocess.Popen[str]
    stderr: IO[str]
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def deliveries(self) -> list[Delivery]:
        return [
            (parts[1], int(parts[2]), int(parts[3]))
            for line in list(self.lines)
            if (parts := line.split()) and parts[0] == "record"
        ]


def _start(command: list[str], stderr: IO[str]) -> _Member:
    """A member started; its error output goes to a file, not a pipe: the JVM's logging never
    blocks it."""
    process = children.spawn(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
    )
    member = _Member(process, stderr)
    member.reader = threading.Thread(target=member.read, name="java-share-member", daemon=True)
    member.reader.start()
    return member


def _stop(member: _Member, timeout_s: float) -> list[Delivery]:
    """Wait for the member's ``done`` (its input closed): its deliveries."""
    member.process.wait(timeout=timeout_s)
    assert member.reader is not None
    member.reader.join(timeout=timeout_s)
    code = member.process.returncode
    done = code == 0 and member.lines[-1:] == ["done"]
    assert done, f"exit {code}, output ends {member.lines[-3:]}: {_err(member)}"
    return member.deliveries()


def _err(member: _Member) -> str:
    member.stderr.seek(0)
    return member.stderr.read()[-3000:]


def run_share_members(
    source: Path,
    args: list[str],
    count: int,
    deliveries: int,
    timeout_s: float = 120,
) -> list[list[Delivery]]:
    """``count`` members of ``source``'s ShareMember (``args``: bootstrap, group, topic, mode)
    run at once until together they printed ``deliveries`` records: what each printed."""
    command = [*java_program(source, "ShareMember"), *args]
    with contextlib.ExitStack() as files:
        members = [
            _start(command, files.enter_context(tempfile.TemporaryFile("w+"))) for _ in range(count)
        ]
        return _run(members, deliveries, timeout_s)


def _run(members: list[_Member], deliveries: int, timeout_s: float) -> list[list[Delivery]]:
    try:
        deadline = time.monotonic() + timeout_s
        while sum(len(m.deliveries()) for m in members) < deliveries:
            got = sum(len(m.deliveries()) for m in members)
            for m in members:
                assert m.process.poll() is None, f"a member exited after {got}: {_err(m)}"
            assert time.monotonic() < deadline, f"{got} of {deliveries} deliveries"
            time.sleep(0.05)
        for member in members:  # every member told at once: they close side by side
            assert member.process.stdin is not None
            member.process.stdin.close()
        return [_stop(member, timeout_s) for member in members]
    finally:
        for member in members:  # a failed or timed-out member: no JVM outlives the test
            if member.process.poll() is None:
                member.process.kill()
                member.process.wait()
