"""``broker_combinations`` / ``proxy_combinations``: settings given together that one of them
would make meaningless are refused or warned about (the real command line is
``test_cli_config_errors.py``'s; the operator's variables ``test_generated_settings.py``'s)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kafscale.broker.config import BrokerSettings
from kafscale.broker.proxy.config import ProxySettings
from kafscale.broker.settings_cli import build_model
from kafscale.broker.settings_combinations import (
    broker_combinations,
    proxy_combinations,
    storage_refusals,
)
from kafscale.broker.store_settings import StorageSettings


@pytest.fixture(autouse=True)
def _no_kafscale_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("KAFSCALE_"):
            monkeypatch.delenv(key)


def broker(**sections: Any) -> BrokerSettings:
    return build_model(BrokerSettings, sections)


def proxy(**sections: Any) -> ProxySettings:
    return build_model(ProxySettings, sections)


def test_defaults_and_the_usual_stores_pass() -> None:
    assert broker_combinations(broker()).refused == ()
    assert broker_combinations(broker()).warned == ()
    local = {"kind": "local", "local_dir": "/data/objects", "prefix": "p", "timeout_s": 5}
    assert broker_combinations(broker(storage=local)).refused == ()
    s3 = {
        "kind": "s3",
        "bucket": "b",
        "endpoint": "http://s3:9000",
        "region": "eu-west-1",
        "access_key_id": "a",
        "secret_access_key": "s",
    }
    assert broker_combinations(broker(storage=s3)).refused == ()
    assert proxy_combinations(proxy()) == broker_combinations(broker())


@pytest.mark.parametrize(
    "name", ["bucket", "endpoint", "region", "access_key_id", "secret_access_key"]
)
def test_an_s3_setting_with_a_local_store_is_refused(name: str) -> None:
    [line] = storage_refusals(StorageSettings(kind="local", **{name: "x"}))
    assert line.startswith(f"KAFSCALE_STORAGE__{name.upper()} (--storage-{name.replace('_', '-')})")
    assert "KAFSCALE_STORAGE__KIND (--storage-kind) is local" in line


def test_the_default_bucket_given_with_a_local_store_is_still_refused() -> None:
    """Given is given: the user typed it, believing the data would go there."""
    assert storage_refusals(StorageSettings(kind="local", bucket="kafscale")) != []


def test_a_local_dir_with_an_s3_store_is_refused_whether_s3_is_given_or_the_default() -> None:
    [given] = storage_refusals(StorageSettings(kind="s3", local_dir=Path("/d")))
    [default] = storage_refusals(StorageSettings(local_dir=Path("/d")))
    assert given.startswith("KAFSCALE_STORAGE__LOCAL_DIR (--storage-local-dir) is for a local")
    assert "is s3:" in given
    assert "is s3 (the default):" in default


@pytest.mark.parametrize(
    ("given", "lacking"),
    [("access_key_id", "secret_access_key"), ("secret_access_key", "access_key_id")],
)
def test_half_a_pair_of_s3_credentials_is_refused(given: str, lacking: str) -> None:
    [line] = storage_refusals(StorageSettings(**{given: "x"}))
    assert line == (
        f"KAFSCALE_STORAGE__{given.upper()} (--storage-{given.replace('_', '-')}) is set "
        f"without KAFSCALE_STORAGE__{lacking.upper()} (--storage-{lacking.replace('_', '-')}): "
        "give both or neither"
    )


@pytest.mark.parametrize(
    "etcd",
    [{"username": "u"}, {"password": "p"}, {"cert_file": "/c"}, {"key_file": "/k"}],
)
def test_half_an_etcd_login_or_client_certificate_is_refused_by_broker_and_proxy(
    etcd: dict[str, str],
) -> None:
    endpoints = {"endpoints": ["https://etcd:2379"]}
    [line] = broker_combinations(broker(etcd={**etcd, **endpoints})).refused
    assert line.endswith("give both or neither")
    assert proxy_combinations(proxy(etcd={**etcd, **endpoints})).refused == (line,)


def test_etcd_tls_files_with_http_endpoints_only_are_a_warning() -> None:
    tls = {"ca_file": "/ca", "cert_file": "/c", "key_file": "/k"}
    plain = broker_combinations(broker(etcd={**tls, "endpoints": ["http://etcd:2379"]}))
    assert plain.refused == ()
    assert [line.split(" ")[0] for line in plain.warned] == [
        "KAFSCALE_ETCD__CA_FILE",
        "KAFSCALE_ETCD__CERT_FILE",
        "KAFSCALE_ETCD__KEY_FILE",
    ]
    mixed = {**tls, "endpoints": ["http://a:2379", "https://b:2379"]}
    assert broker_combinations(broker(etcd=mixed)).warned == ()


def test_sasl_credentials_for_a_connection_without_sasl_are_a_warning() -> None:
    inter = {"sasl_username": "b", "sasl_password": "p"}
    [user, _password] = broker_combinations(broker(inter_broker=inter)).warned
    assert user.startswith("KAFSCALE_INTER_BROKER__SASL_USERNAME (--inter-broker-sasl-username)")
    assert "KAFSCALE_INTER_BROKER__SECURITY_PROTOCOL" in user
    sasl = broker(
        listeners="SASL://127.0.0.1:9092",
        listener_security_protocol_map="SASL:SASL_PLAINTEXT",
        inter_broker=inter,
    )
    assert broker_combinations(sasl).warned == ()
    [_, _] = proxy_combinations(proxy(upstream=inter)).warned
    with_sasl = {**inter, "security_protocol": "SASL_PLAINTEXT"}
    assert proxy_combinations(proxy(upstream=with_sasl)).warned == ()


def test_super_users_without_the_authorizer_are_a_warning() -> None:
    [line] = broker_combinations(broker(authorizer={"super_users": ["User:a"]})).warned
    assert line.startswith("KAFSCALE_AUTHORIZER__SUPER_USERS (--authorizer-super-users) applies")
    on = {"enabled": True, "super_users": ["User:a"]}
    assert broker_combinations(broker(authorizer=on)).warned == ()
    assert len(proxy_combinations(proxy(authorizer={"super_users": ["User:a"]})).warned) == 1


def test_remote_access_beside_a_token_file_is_a_warning() -> None:
    admin = {"token_file": "/t", "allow_remote_without_token": True}
    [line] = broker_combinations(broker(admin=admin)).warned
    assert "KAFSCALE_ADMIN__TOKEN_FILE (--admin-token-file), which is set" in line
    assert broker_combinations(broker(admin={"allow_remote_without_token": True})).warned == ()


LISTENERS = {
    "listeners": "INTERNAL://:9091,EXTERNAL://:9093",
    "advertised_listeners": "INTERNAL://10.0.0.7:9091,EXTERNAL://kafka.example.com:9093",
    "listener_security_protocol_map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
}


def test_the_one_listeners_address_beside_listeners_is_refused_when_it_is_not_theirs() -> None:
    """Run: ``--listener-port 19093 --listener-advertised-host foo.example --listeners
    PLAINTEXT://127.0.0.2:19092`` listened on 19092 only and told clients 127.0.0.2: the
    port and host given were dropped without a word."""
    given = broker(
        listener={"port": 9092, "advertised_host": "foo.example", "advertised_port": 19999},
        **LISTENERS,
    )
    port, advertised_port, host = broker_combinations(given).refused
    assert port == (
        "KAFSCALE_LISTENER__PORT (--listener-port) is not used beside KAFSCALE_LISTENERS "
        "(--listeners): 9092 is not among the ports of listeners (give it there, or leave it out)"
    )
    assert advertised_port.startswith(
        "KAFSCALE_LISTENER__ADVERTISED_PORT (--listener-advertised-port) is not used beside "
        "KAFSCALE_LISTENERS (--listeners): 19999 is not among the ports of advertised_listeners"
    )
    assert host.startswith(
        "KAFSCALE_LISTENER__ADVERTISED_HOST (--listener-advertised-host) is not used beside "
        "KAFSCALE_LISTENERS (--listeners): foo.example is not among the hosts of "
        "advertised_listeners"
    )
    same = {"listener": {"advertised_host": "foo.example"}, "listeners": "PLAINTEXT://:9092"}
    assert len(proxy_combinations(proxy(**same)).refused) == 1  # the proxy's listeners too


def test_the_one_listeners_address_that_listeners_give_anyway_is_a_warning() -> None:
    given = broker(
        listener={"port": 9093, "advertised_host": "kafka.example.com", "advertised_port": 9091},
        **LISTENERS,
    )
    found = broker_combinations(given)
    assert found.refused == ()
    assert len(found.warned) == 3
    assert found.warned[0] == (
        "KAFSCALE_LISTENER__PORT (--listener-port) is not used beside KAFSCALE_LISTENERS "
        "(--listeners), which give 9093 already: leave it out"
    )


def test_the_bind_host_admin_port_and_rack_beside_listeners_pass() -> None:
    """listener.host is where the admin port binds (listeners or not); admin_port and rack
    apply as well."""
    given = broker(listener={"host": "127.0.0.1", "admin_port": 8081, "rack": "a"}, **LISTENERS)
    assert broker_combinations(given) == broker_combinations(broker(**LISTENERS))
    assert (
        broker_combinations(broker(listener={"port": 9093, "advertised_host": "h"})).refused == ()
    )
