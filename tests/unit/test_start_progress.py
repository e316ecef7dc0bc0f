"""The start limit of a child process counts from its last sign of progress (``start_progress``):
a start slowed by a loaded machine is waited for, a stuck one is given up in ``stall_s``."""

from __future__ import annotations

from kafscale.broker.start_progress import Sample, StartProgress


def watch(log_bytes: int = 0) -> StartProgress:
    return StartProgress(started_s=100.0, stall_s=30.0, max_s=600.0, log_bytes=log_bytes)


def test_a_start_that_keeps_using_cpu_is_waited_for_past_the_stall_limit() -> None:
    progress = watch()
    for second in range(1, 200):
        progress.observe(Sample(100.0 + second, cpu_s=second * 0.01, log_bytes=0))
    assert progress.verdict(299.5) is None


def test_a_growing_log_is_progress_too() -> None:
    progress = watch(log_bytes=500)  # what an earlier run of the same log file left
    progress.observe(Sample(125.0, cpu_s=None, log_bytes=600))
    assert progress.verdict(150.0) is None
    assert progress.verdict(155.0) is not None


def test_no_cpu_and_no_log_for_the_stall_limit_gives_up_and_says_why() -> None:
    progress = watch()
    progress.observe(Sample(101.0, cpu_s=1.5, log_bytes=10))
    progress.observe(Sample(130.9, cpu_s=1.5, log_bytes=10))
    assert progress.verdict(130.9) is None
    verdict = progress.verdict(131.0)
    assert verdict is not None and "no progress" in verdict and "30 s" in verdict
    assert progress.summary() == "1.50 s of CPU used, 10 bytes of log written"


def test_an_unreadable_cpu_time_is_not_progress() -> None:
    progress = watch()
    progress.observe(Sample(120.0, cpu_s=None, log_bytes=0))
    assert progress.verdict(130.0) is not None


def test_the_cap_bounds_a_start_that_is_busy_but_never_ready() -> None:
    progress = watch()
    for second in range(1, 601):
        progress.observe(Sample(100.0 + second, cpu_s=float(second), log_bytes=second))
    verdict = progress.verdict(700.0)
    assert verdict is not None and "cap" in verdict
