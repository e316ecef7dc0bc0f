"""A Java test program run as a session: one JVM answering many calls over stdin/stdout.

A JVM with the Kafka client costs ~2.5 s of CPU to start; a test that makes dozens of admin
calls (``TokenAdmin``, ``QuotaAdmin``) pays that once per module instead of once per call. The
program, run with the single argument ``serve``, reads one call a line (its arguments separated
by tabs), runs it as a run with those arguments would (a new Admin with its own settings each
time), prints what that run prints and then ``end RC`` with the exit code that run would have.
"""

from __future__ import annotations

import queue
import subprocess
import threading

from harness import children
from harness.children import end_by_stdin

CALL_TIMEOUT_S = 120.0


class JavaSession:
    """``command`` (ending in ``serve``) started once; ``call`` is one run of the program."""

    def __init__(self, command: list[str]) -> None:
        self.process = children.spawn(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._lock = threading.Lock()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # the JVM is gone

    def call(self, *args: str) -> tuple[int, list[str]]:
        """The exit code and output lines a run with ``args`` would have had."""
        assert self.process.stdin is not None
        assert all("\t" not in arg and "\n" not in arg for arg in args), args
        with self._lock:
            self.process.stdin.write("\t".join(args) + "\n")
            self.process.stdin.flush()
            lines: list[str] = []
            while True:
                line = self._lines.get(timeout=CALL_TIMEOUT_S)
                assert line is not None, f"the Java session exited ({self.process.poll()})"
                if line.startswith("end "):
                    return int(line.split()[1]), lines
                lines.append(line)

    def close(self) -> None:
        """Ends the session (stdin closed: the program returns) or kills it."""
        end_by_stdin(self.process, 30)
        self._reader.join(10)
