"""A misspelt or invalid setting stops every command at once with one line on stderr that names
the variable or flag typed and, for a misspelling, the one meant; exit status 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import children
from harness.brokers import BrokerCluster
from harness.children import child_env
from harness.ports import closed_port, free_port_run

from kafscale.broker.child_process import KAFSCALE

pytestmark = pytest.mark.integration


def run_kafscale(args: list[str], variables: dict[str, str], home: Path) -> list[str]:
    """``kafscale ARGS`` with only ``variables`` of the KAFSCALE_* kind; its stderr lines."""
    env = child_env(
        {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KAFSCALE_"))}
    )
    env |= {"HOME": str(home), **variables}
    done = children.run(
        [KAFSCALE, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    return [line for line in done.stderr.splitlines() if line.strip()]


def test_a_variable_with_one_underscore_for_two_is_refused_not_ignored(tmp_path: Path) -> None:
    """Ignored, the broker went on to the default etcd and object store and failed on those."""
    lines = run_kafscale(
        ["broker", "--storage-kind", "local", "--storage-local-dir", str(tmp_path)],
        {"KAFSCALE_ETCD_ENDPOINTS": '["http://etcd.example:2379"]'},
        tmp_path,
    )
    assert lines == [
        "kafscale: invalid configuration: KAFSCALE_ETCD_ENDPOINTS is not a setting; "
        "did you mean KAFSCALE_ETCD__ENDPOINTS?"
    ]


def test_a_misspelt_setting_of_a_section_is_one_line(tmp_path: Path) -> None:
    lines = run_kafscale(
        ["local", "--data-dir", str(tmp_path / "data")], {"KAFSCALE_STORAGE__BUCKT": "b"}, tmp_path
    )
    assert lines == [
        "kafscale: invalid configuration: storage.buckt (KAFSCALE_STORAGE__BUCKT or "
        "--storage-buckt) is not a setting; did you mean KAFSCALE_STORAGE__BUCKET?"
    ]


@pytest.mark.parametrize("command", ["broker", "proxy"])
def test_a_list_variable_that_is_not_json_is_one_line_not_a_traceback(
    command: str, tmp_path: Path
) -> None:
    """pydantic-settings decodes list settings from JSON and raised a SettingsError naming only
    the section: the command died with a traceback."""
    lines = run_kafscale([command], {"KAFSCALE_AUTHORIZER__SUPER_USERS": "User:admin"}, tmp_path)
    assert lines == [
        "kafscale: invalid configuration: authorizer.super_users "
        "(KAFSCALE_AUTHORIZER__SUPER_USERS): 'User:admin' is not JSON; give a JSON list, "
        'e.g. \'["a", "b"]\' (the flag --authorizer-super-users also takes a,b)'
    ]


@pytest.mark.parametrize("command", ["broker", "proxy", "status"])
def test_a_bad_value_is_one_line_naming_the_flag(command: str, tmp_path: Path) -> None:
    lines = run_kafscale([command, "--listener-port", "abc"], {}, tmp_path)
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "kafscale: invalid configuration: listener.port (KAFSCALE_LISTENER__PORT or "
        "--listener-port): "
    )
    assert lines[0].endswith("(given 'abc')")


@pytest.mark.parametrize("command", ["local", "broker", "proxy", "status"])
def test_a_log_level_logging_does_not_know_is_one_line_not_a_traceback(
    command: str, tmp_path: Path
) -> None:
    """The level reached ``logging.basicConfig`` unchecked, whose ValueError ended every
    command with a traceback."""
    data_dir = ["--data-dir", str(tmp_path / "data")] if command == "local" else []
    lines = run_kafscale([command, "--log-level", "LOUD", *data_dir], {}, tmp_path)
    assert lines == [
        "kafscale: invalid configuration: log_level (KAFSCALE_LOG_LEVEL or --log-level): "
        "not a logging level: use DEBUG, INFO, WARNING, ERROR or CRITICAL (given 'LOUD')"
    ]


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--bucket", "my-bucket"], "--bucket needs --s3-endpoint: "),
        (["--storage-bucket", "my-bucket"], "--storage-bucket is for an S3 store, "),
        (["--etcd-endpoints", "http://127.0.0.1:2379"], "--etcd-endpoints is not used by "),
        (["--listener-port", "19092"], "--listener-port is not used by kafscale local: "),
        (["--brokers", "0"], "--brokers must be at least 1 (given 0)"),
        (
            ["--listeners", "PLAINTEXT://127.0.0.1:1"],
            "--port ",  # the free port given: not among the listeners' (1)
        ),
    ],
)
def test_kafscale_local_refuses_a_flag_it_would_ignore(
    flags: list[str], line: str, tmp_path: Path
) -> None:
    """Each was taken and dropped without a word (``--brokers 0`` ended in a traceback):
    ``--bucket`` alone kept the data in ``<data-dir>/objects`` of a user who thought it in
    the bucket, ``--etcd-endpoints`` started an etcd of its own. One line, status 2, and
    nothing started (no data directory made)."""
    data_dir = tmp_path / "data"
    args = ["local", "--data-dir", str(data_dir), "--port", str(free_port_run(2)), *flags]
    lines = run_kafscale(args, {}, tmp_path)
    assert len(lines) == 1 and lines[0].startswith(f"kafscale: invalid configuration: {line}")
    assert not data_dir.exists()


@pytest.mark.parametrize("named_by", ["--etcd-binary", "KAFSCALE_ETCD_BINARY"])
@pytest.mark.parametrize("which", ["missing", "not executable"])
def test_an_etcd_binary_that_is_not_there_or_not_executable_is_one_line(
    named_by: str, which: str, tmp_path: Path
) -> None:
    """Both were "is not an etcd executable (`PATH --version` printed no etcd version)",
    exit 1, which sent a user with a typo in the path looking for what was wrong with their
    etcd. Now a bad setting as any other: one line saying which, exit 2, nothing started."""
    binary = tmp_path / "no-such-etcd"
    if which == "not executable":
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o644)
    data_dir = tmp_path / "data"
    args = ["local", "--data-dir", str(data_dir), "--port", str(free_port_run(2))]
    given = {"KAFSCALE_ETCD_BINARY": str(binary)} if named_by == "KAFSCALE_ETCD_BINARY" else {}
    flags = ["--etcd-binary", str(binary)] if named_by == "--etcd-binary" else []
    lines = run_kafscale([*args, *flags], given, tmp_path)
    said = "not found" if which == "missing" else "not executable"
    assert lines == [f"kafscale: invalid configuration: {named_by} {binary}: {said}"]
    assert not data_dir.exists()


@pytest.mark.parametrize("named_by", ["--etcd-binary", "KAFSCALE_ETCD_BINARY"])
def test_an_etcd_binary_that_is_no_etcd_is_one_line_before_anything_starts(
    named_by: str, tmp_path: Path
) -> None:
    """``/bin/true`` runs, but its ``--version`` names no etcd. It was a start-up failure,
    exit 1, after the data directory was made; now a bad setting: one line, exit 2."""
    data_dir = tmp_path / "data"
    args = ["local", "--data-dir", str(data_dir), "--port", str(free_port_run(2))]
    given = {"KAFSCALE_ETCD_BINARY": "/bin/true"} if named_by == "KAFSCALE_ETCD_BINARY" else {}
    flags = ["--etcd-binary", "/bin/true"] if named_by == "--etcd-binary" else []
    lines = run_kafscale([*args, *flags], given, tmp_path)
    assert lines == [
        f"kafscale: invalid configuration: {named_by} /bin/true: not an etcd "
        "(`/bin/true --version` names no etcd release)"
    ]
    assert not data_dir.exists()


def test_an_etcd_binary_that_exits_before_serving_is_one_line(tmp_path: Path) -> None:
    """A program that says it is etcd 3.5.17 to ``--version`` and exits without a word when
    run as one (a stub, a wrapper that lost its etcd) is no etcd either: it was "cannot start:
    etcd ... exited; see its log" (an empty one), exit 1."""
    stub = tmp_path / "etcd-stub"
    stub.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "etcd Version: 3.5.17"\nexit 0\n')
    stub.chmod(0o755)
    data_dir = tmp_path / "data"
    args = ["local", "--data-dir", str(data_dir), "--port", str(free_port_run(2))]
    lines = run_kafscale([*args, "--etcd-binary", str(stub)], {}, tmp_path)
    assert lines == [
        f"kafscale: invalid configuration: {stub} (--etcd-binary or KAFSCALE_ETCD_BINARY) is "
        "not an etcd: it exited (status 0) before serving, logging nothing"
    ]


def test_kafscale_local_takes_a_bucket_with_its_endpoint_as_before(tmp_path: Path) -> None:
    """``--bucket`` with ``--s3-endpoint`` passes the check (it then needs credentials: the
    start fails on those, status 1, proving it went past the flags)."""
    env = child_env(
        {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KAFSCALE_"))}
    )
    env["HOME"] = str(tmp_path)
    args = [
        *("local", "--data-dir", str(tmp_path / "data"), "--port", str(free_port_run(2))),
        *("--s3-endpoint", f"http://127.0.0.1:{closed_port()}", "--bucket", "my-bucket"),
    ]
    done = children.run(
        [KAFSCALE, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1, done.stderr
    assert "no S3 credentials" in done.stderr


@pytest.mark.parametrize(
    ("command", "flags", "variables", "line"),
    [
        (
            "broker",
            [],
            {"KAFSCALE_STORAGE__KIND": "local", "KAFSCALE_STORAGE__BUCKET": "my-bucket"},
            "KAFSCALE_STORAGE__BUCKET (--storage-bucket) is for an S3 store, but "
            "KAFSCALE_STORAGE__KIND (--storage-kind) is local: ",
        ),
        (
            "broker",
            ["--storage-local-dir", "/var/lib/kafscale"],
            {"KAFSCALE_STORAGE__ENDPOINT": "http://s3.example:9000"},
            "KAFSCALE_STORAGE__LOCAL_DIR (--storage-local-dir) is for a local store, but "
            "KAFSCALE_STORAGE__KIND (--storage-kind) is s3 (the default): ",
        ),
        (
            "proxy",
            ["--etcd-username", "kafscale"],
            {},
            "KAFSCALE_ETCD__USERNAME (--etcd-username) is set without KAFSCALE_ETCD__PASSWORD "
            "(--etcd-password): give both or neither",
        ),
    ],
)
def test_settings_that_cannot_apply_together_are_refused_not_ignored(
    command: str, flags: list[str], variables: dict[str, str], line: str, tmp_path: Path
) -> None:
    """Each was taken and one of the pair dropped without a word: a bucket beside a local store
    kept the data in a directory of a user who thought it in S3 (and a local directory beside
    an S3 store, the other way round); an etcd user without a password connected as nobody.
    Set as variables in a manifest, the broker's log was the only place to notice. One line
    naming both, status 2, before anything starts (etcd is never asked: it is not there)."""
    dead_etcd = ["--etcd-endpoints", f"http://127.0.0.1:{closed_port()}"]
    lines = run_kafscale([command, *dead_etcd, *flags], variables, tmp_path)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"kafscale: invalid configuration: {line}")


@pytest.mark.parametrize("command", ["broker", "proxy"])
def test_the_one_listeners_port_beside_listeners_is_refused_not_ignored(
    command: str, tmp_path: Path
) -> None:
    """Run with both, the broker listened on the listeners' port only, and told clients their
    address: ``--listener-port`` (and the advertised host and port) were dropped without a
    word."""
    ports = free_port_run(2)
    lines = run_kafscale(
        [
            command,
            "--etcd-endpoints",
            f"http://127.0.0.1:{closed_port()}",
            "--listener-port",
            str(ports),
            "--listeners",
            f"PLAINTEXT://127.0.0.1:{ports + 1}",
        ],
        {},
        tmp_path,
    )
    assert lines == [
        "kafscale: invalid configuration: KAFSCALE_LISTENER__PORT (--listener-port) is not used "
        f"beside KAFSCALE_LISTENERS (--listeners): {ports} is not among the ports of listeners "
        "(give it there, or leave it out)"
    ]


def test_super_users_without_the_authorizer_start_the_broker_with_one_warning(
    broker_cluster: BrokerCluster,
) -> None:
    """Harmless (every client may do everything either way) but likely a mistake: the broker
    serves, and says once at start which setting has no effect and why."""
    broker = broker_cluster.start(KAFSCALE_AUTHORIZER__SUPER_USERS='["User:admin"]')
    warnings = [
        line
        for line in broker.log_path.read_text().splitlines()
        if "WARNING" in line and "configuration:" in line
    ]
    assert len(warnings) == 1, warnings
    assert (
        "configuration: KAFSCALE_AUTHORIZER__SUPER_USERS (--authorizer-super-users) applies "
        "only with KAFSCALE_AUTHORIZER__ENABLED (--authorizer-enabled) true, and it is off"
    ) in warnings[0]
