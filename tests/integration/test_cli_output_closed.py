"""A command whose reader stops reading (``kafscale status | head``) ends quietly.

``head`` exits after its lines and the pipe closes under the command's next write: Python
raised ``BrokenPipeError`` there (a traceback on the terminal, exit status 1), and once more
when it flushed stdout at exit. Unix tools end silently with 141 (128 + SIGPIPE); so does
``kafscale`` now. A real ``kafscale`` process whose stdout pipe the test closes before the
command writes anything (its imports take far longer than that close).
"""

from __future__ import annotations

import subprocess

import pytest
from harness import children
from harness.children import settings_free_env

from kafscale.broker.child_process import KAFSCALE
from kafscale.entry import EXIT_BROKEN_PIPE

pytestmark = pytest.mark.integration


def test_a_reader_that_stops_reading_ends_the_command_without_a_traceback() -> None:
    process = children.spawn(
        [KAFSCALE, "config-reference"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=settings_free_env(),
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `| head` that has read its lines and exited
    try:
        code = process.wait(120)
    finally:
        process.kill()
    said = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    assert said == ""
    assert code == EXIT_BROKEN_PIPE == 141
