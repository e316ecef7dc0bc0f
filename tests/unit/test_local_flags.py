"""``ignored_flags``: what ``kafscale local`` refuses instead of ignoring (the real command line
is ``test_cli_config_errors.py``'s)."""

from __future__ import annotations

from typing import Any

import pytest

from kafscale.broker.local_flags import LocalFlags, ignored_flags, listener_flag_clashes
from kafscale.broker.store_settings import StorageSettings

DEFAULT_STORE = StorageSettings()  # kind s3, no endpoint: local keeps <data-dir>/objects
S3_STORE = StorageSettings(endpoint="http://127.0.0.1:9000")
DIR_STORE = StorageSettings(kind="local")


def problems(storage: StorageSettings = DEFAULT_STORE, **kwargs: Any) -> list[str]:
    given = kwargs.pop("given", {})
    return ignored_flags(LocalFlags(given=given, **kwargs), storage)


def test_nothing_given_is_fine() -> None:
    assert problems() == []
    assert problems(brokers=3, port=65533, proxy=False) == []


def test_a_bucket_without_an_s3_endpoint_is_refused() -> None:
    [line] = problems(bucket="b")
    assert line.startswith("--bucket needs --s3-endpoint")
    assert "<data-dir>/objects" in line


def test_a_bucket_with_an_s3_endpoint_is_fine() -> None:
    assert problems(S3_STORE, bucket="b", s3_endpoint="http://127.0.0.1:9000") == []
    # the broker flag for the endpoint is as good
    assert problems(S3_STORE, given={"storage": {"endpoint": "http://127.0.0.1:9000"}}) == []


@pytest.mark.parametrize("name", ["bucket", "region", "access_key_id", "secret_access_key", "kind"])
def test_s3_flags_without_an_endpoint_are_refused(name: str) -> None:
    [line] = problems(given={"storage": {name: "x"}})
    assert line.startswith(f"--storage-{name.replace('_', '-')} is for an S3 store")


def test_s3_flags_with_a_local_directory_store_are_refused() -> None:
    given = {"storage": {"kind": "local", "endpoint": "http://s3", "bucket": "b"}}
    lines = problems(DIR_STORE, given=given)
    assert [line.split()[0] for line in lines] == ["--storage-bucket", "--storage-endpoint"]
    assert problems(DIR_STORE, given={"storage": {"kind": "local", "local_dir": "/d"}}) == []


def test_a_local_dir_of_a_store_that_is_not_a_directory_is_refused() -> None:
    [line] = problems(given={"storage": {"local_dir": "/d"}})
    assert line.startswith("--storage-local-dir is used with --storage-kind local")
    [line] = problems(S3_STORE, given={"storage": {"local_dir": "/d"}}, s3_endpoint="http://s3")
    assert line.startswith("--storage-local-dir is not used with an S3 store")


@pytest.mark.parametrize(
    ("given", "flag", "instead"),
    [
        ({"listener": {"port": 9093}}, "--listener-port", "give --port"),
        ({"listener": {"host": "0.0.0.0"}}, "--listener-host", "give --host"),
        ({"etcd": {"endpoints": ["http://e:2379"]}}, "--etcd-endpoints", "kafscale broker"),
    ],
)
def test_settings_local_makes_itself_are_refused(
    given: dict[str, Any], flag: str, instead: str
) -> None:
    [line] = problems(given=given)
    assert line.startswith(f"{flag} is not used by kafscale local") and instead in line


def test_other_broker_flags_pass() -> None:
    given = {"listener": {"advertised_host": "me", "admin_port": 18080}, "etcd": {"timeout_s": 9}}
    assert problems(given=given) == []


@pytest.mark.parametrize(
    ("brokers", "port", "proxy", "flag"),
    [
        (0, 9092, False, "--brokers"),
        (-1, 9092, False, "--brokers"),
        (1, 0, False, "--port"),
        (1, 70000, False, "--port"),
        (3, 65534, False, "--port"),  # 65534..65536
        (2, 65534, True, "--port"),  # proxy 65534, brokers 65535, 65536
    ],
)
def test_a_cluster_that_cannot_listen_is_refused(
    brokers: int, port: int, proxy: bool, flag: str
) -> None:
    [line] = problems(brokers=brokers, port=port, proxy=proxy)
    assert line.startswith(flag)


def test_port_and_host_beside_listeners_are_refused_unless_the_listeners_have_them() -> None:
    """Without ``--proxy`` the broker listens on the listeners only: ``--port 9000 --listeners
    PLAINTEXT://127.0.0.1:9092`` left 9000 closed, ``--host 0.0.0.0`` bound loopback only."""
    listeners = [("127.0.0.1", 9092)]
    flags = LocalFlags(given={}, port=9000, host="0.0.0.0", port_given=True, host_given=True)
    refused, warned = listener_flag_clashes(flags, listeners)
    assert refused == [
        "--port 9000 is not used with --listeners: the broker listens on their ports (9092) "
        "(give the port there, or leave --port out)",
        "--host 0.0.0.0 is not used with --listeners: the broker binds their hosts "
        "(127.0.0.1), --host only its admin port (give the host there, or leave --host out)",
    ]
    assert warned == []
    same = LocalFlags(given={}, port=9092, host="127.0.0.1", port_given=True, host_given=True)
    assert listener_flag_clashes(same, listeners) == (
        [],
        [
            "--port 9092 is not needed with --listeners, which open it",
            "--host 127.0.0.1 is not needed with --listeners, which bind it",
        ],
    )
    everywhere = LocalFlags(given={}, host="::", host_given=True)
    assert listener_flag_clashes(everywhere, [("", 9092)]) == (
        [],
        ["--host :: is not needed with --listeners, which bind it"],
    )


def test_with_the_proxy_port_must_be_a_listeners_and_host_binds_the_brokers() -> None:
    """The documented ``kafscale local --proxy --port 9092 --listeners EXTERNAL://...:9092``:
    ``--port`` also places the brokers after it, ``--host`` binds them: no message."""
    listeners = [("127.0.0.1", 9092)]
    documented = LocalFlags(given={}, proxy=True, port=9092, host="0.0.0.0", port_given=True)
    assert listener_flag_clashes(documented, listeners) == ([], [])
    elsewhere = LocalFlags(given={}, proxy=True, port=9000, port_given=True, host_given=True)
    [line], [] = listener_flag_clashes(elsewhere, listeners)
    assert line.startswith("--port 9000 is not used with --listeners: the proxy listens on")


def test_defaults_and_no_listeners_pass() -> None:
    assert listener_flag_clashes(LocalFlags(given={}), [("127.0.0.1", 9092)]) == ([], [])
    given = LocalFlags(given={}, port=9000, port_given=True, host_given=True)
    assert listener_flag_clashes(given, []) == ([], [])
