"""`kafscale local` starts etcd on the last run's ports when it can, so the etcd address its
banner printed (and a user pasted into a Spark job or `kafscale status`) survives a restart."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from kafscale.broker.free_ports import free_port_run
from kafscale.broker.local import ETCD_PORTS_FILE, remembered_ports

pytestmark = pytest.mark.unit


def saved(tmp_path: Path, text: str) -> Path:
    (tmp_path / ETCD_PORTS_FILE).write_text(text)
    return tmp_path


def test_the_last_runs_free_ports_are_taken_again(tmp_path: Path) -> None:
    first = free_port_run(2)
    home = saved(tmp_path, json.dumps({"client": first, "peer": first + 1}))
    assert remembered_ports(home, avoid=()) == (first, first + 1)


@pytest.mark.parametrize("text", ["", "not json", "{}", '{"client": "x", "peer": 1}', "[1, 2]"])
def test_no_file_or_a_bad_one_means_new_ports(tmp_path: Path, text: str) -> None:
    assert remembered_ports(saved(tmp_path, text), avoid=()) == (None, None)
    assert remembered_ports(tmp_path / "missing", avoid=()) == (None, None)


def test_ports_promised_to_a_broker_or_in_use_are_not_taken(tmp_path: Path) -> None:
    first = free_port_run(2)
    home = saved(tmp_path, json.dumps({"client": first, "peer": first + 1}))
    assert remembered_ports(home, avoid={first + 1}) == (None, None)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", first))
        listener.listen()
        assert remembered_ports(home, avoid=()) == (None, None)
