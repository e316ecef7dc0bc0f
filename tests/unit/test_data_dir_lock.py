"""One ``kafscale local`` per data directory: the lock, its refusal and its release."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kafscale.broker.data_dir_lock import LOCK_FILE, data_dir_claimed, in_use_message
from kafscale.broker.startup_error import StartupError

pytestmark = pytest.mark.unit


def test_a_held_directory_is_refused_naming_the_holder_and_free_again_after(
    tmp_path: Path,
) -> None:
    with data_dir_claimed(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(StartupError) as refused, data_dir_claimed(tmp_path):
            pass
        assert str(refused.value) == in_use_message(tmp_path, str(os.getpid()))
    with data_dir_claimed(tmp_path):  # released with the block
        pass


def test_the_refusal_says_what_to_do_with_or_without_a_pid(tmp_path: Path) -> None:
    assert in_use_message(tmp_path, "42") == (
        f"another kafscale local (pid 42) is running on data directory {tmp_path}: stop it "
        "first (Ctrl-C in its terminal), or give this one another --data-dir"
    )
    assert in_use_message(tmp_path, "").startswith("another kafscale local is running on ")


def test_a_directory_that_cannot_hold_the_lock_file_is_one_startup_error(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(StartupError, match="cannot use data directory"), data_dir_claimed(missing):
        pass
