"""``kafscale local`` run as a user runs it: in its own process group (as a terminal's job),
waited for until its banner says it is running, stopped with Ctrl-C, and read back with a
plain confluent-kafka consumer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from harness import children
from harness.children import child_env
from kafscale.broker.child_process import KAFSCALE

START_TIMEOUT_S = 60.0


def launch_local(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """``kafscale local ARGS`` with its output appended to ``log``, without waiting."""
    return children.spawn(
        [KAFSCALE, "local", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=child_env(os.environ),
        start_new_session=True,  # its own process group, as a terminal gives it
    )


def wait_running(process: subprocess.Popen[bytes], log: Path) -> str:
    """Wait for the banner ("KafScale is running"); returns the log so far. Fails with the log
    if the process exits first or the banner takes longer than ``START_TIMEOUT_S``."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while "KafScale is running" not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.1)
    return log.read_text(errors="replace")


def start_local(data_dir: Path, port: int, brokers: int, log: Path) -> subprocess.Popen[bytes]:
    """``kafscale local`` with ``brokers`` brokers from ``port`` up, running."""
    process = launch_local(
        [
            *("--data-dir", str(data_dir), "--port", str(port), "--brokers", str(brokers)),
            *("--log-flush-interval-ms", "50"),
        ],
        log,
    )
    wait_running(process, log)
    return process


def as_in_a_terminal() -> None:
    """Run in the child: Ctrl-C's default, as in a terminal's foreground job. A test run started
    in the background of a non-interactive shell inherits SIGINT ignored, and a Python started
    that way never turns it into KeyboardInterrupt: a Ctrl-C during its imports was lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_with_ctrl_c(process: subprocess.Popen[bytes]) -> int:
    """Ctrl-C in a terminal: SIGINT to the whole foreground process group, children included.
    A process that does not stop in time is killed (never left running) and the test fails."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        return process.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        return -1


def consume(bootstrap: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    """The values of up to ``expected`` records from offset 0 of each partition (30 s at most)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "local-test", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.3)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    return values
