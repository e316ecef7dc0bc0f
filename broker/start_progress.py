"""Whether a starting child process is still worth waiting for: the decision, without the I/O.

A fixed start limit (30 s, once) failed tests on a loaded machine, not on the product: at load
~20 on two cores a broker's imports alone took longer, though the broker was busy starting the
whole time. A limit long enough for any load would let a broker that hangs (waiting on nothing,
never ready) hold a test for minutes. So the limit counts from the child's last sign of
progress (it used CPU or wrote to its log), and a hard cap bounds a child that keeps busy but
never turns ready. A runnable process on a fair scheduler gets *some* CPU in any stretch of
seconds, however loaded the machine, so "no CPU and no log line for ``stall_s``" means stuck.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """What the waiter saw of the child at one moment (``cpu_s`` None: unreadable)."""

    at_s: float
    cpu_s: float | None
    log_bytes: int


@dataclass(slots=True)
class StartProgress:
    """The start's progress so far: ``observe`` each sample, then ask ``verdict``."""

    started_s: float
    stall_s: float
    max_s: float
    last_progress_s: float = 0.0
    cpu_s: float = 0.0
    log_bytes: int = 0

    def __post_init__(self) -> None:
        self.last_progress_s = self.started_s  # the launch is the first sign of life

    def observe(self, sample: Sample) -> None:
        """More CPU used or more log written than before counts as progress."""
        more_cpu = sample.cpu_s is not None and sample.cpu_s > self.cpu_s
        more_log = sample.log_bytes > self.log_bytes
        if more_cpu or more_log:
            self.last_progress_s = sample.at_s
        if sample.cpu_s is not None:
            self.cpu_s = max(self.cpu_s, sample.cpu_s)
        self.log_bytes = max(self.log_bytes, sample.log_bytes)

    def verdict(self, now_s: float) -> str | None:
        """None to keep waiting, else why to give up (for the failure message)."""
        waited_s = now_s - self.started_s
        if waited_s >= self.max_s:
            return f"not ready after {waited_s:.1f} s (the cap is {self.max_s:g} s)"
        idle_s = now_s - self.last_progress_s
        if idle_s >= self.stall_s:
            return (
                f"not ready after {waited_s:.1f} s, and no progress (no CPU used, no log "
                f"written) for the last {idle_s:.1f} s (the limit is {self.stall_s:g} s)"
            )
        return None

    def summary(self) -> str:
        return f"{self.cpu_s:.2f} s of CPU used, {self.log_bytes} bytes of log written"
