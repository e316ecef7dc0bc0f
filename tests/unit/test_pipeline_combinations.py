"""The Spark source's connection options and ``KAFSCALE_*`` variables go through the broker's
rules for settings that cannot apply together (``settings_combinations``): refused ones are a
``SourceOptionError`` naming each option or variable, the harmless ones a warning."""

from __future__ import annotations

import logging
import re

import pytest

from kafscale.pipeline.options import (
    SourceOptionError,
    connection_options,
    parse_connection,
    parse_read_options,
)

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_kafscale_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("KAFSCALE_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"storage.kind": "local", "storage.bucket": "b"},
            "option storage.bucket is for an S3 store, but option storage.kind is local",
        ),
        (
            {"storage.local_dir": "/data"},
            "option storage.local_dir is for a local store, but option storage.kind is s3 "
            "(the default)",
        ),
        (
            {"storage.access_key_id": "AKIA"},
            "option storage.access_key_id is set without option storage.secret_access_key",
        ),
        (
            {"etcd.username": "spark"},
            "option etcd.username is set without option etcd.password",
        ),
        (
            {"etcd.cert_file": "/c.crt", "etcd.endpoints": "https://etcd:2379"},
            "option etcd.cert_file is set without option etcd.key_file",
        ),
    ],
)
def test_options_the_broker_would_refuse_together_are_refused(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(SourceOptionError, match="^" + re.escape(message)):
        parse_read_options({"subscribe": "t", **options}, streaming=False)


def test_a_variable_and_an_option_that_clash_are_named_as_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job started beside a broker reads its S3 variables: asking for a local directory
    then would read another store than the brokers write."""
    monkeypatch.setenv("KAFSCALE_STORAGE__BUCKET", "kafscale")
    monkeypatch.setenv("KAFSCALE_ETCD__PASSWORD", "secret")
    with pytest.raises(SourceOptionError) as raised:
        parse_connection({"storage.kind": "local", "storage.local_dir": "/data"})
    assert str(raised.value).startswith(
        "KAFSCALE_STORAGE__BUCKET is for an S3 store, but option storage.kind is local"
    )
    assert "KAFSCALE_ETCD__PASSWORD is set without option etcd.username" in str(raised.value)
    # An empty option unsets what a variable set: nothing is left to clash.
    connection = parse_connection({"etcd.password": "", "storage.prefix": "p"})
    assert connection.etcd.password is None


def test_tls_files_for_an_http_etcd_are_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kafscale.pipeline.options")
    parse_connection({"etcd.ca_file": "/ca.crt", "etcd.endpoints": "http://etcd:2379"})
    assert [r.getMessage() for r in caplog.records] == [
        "option etcd.ca_file is used only for https:// endpoints, and option etcd.endpoints "
        "are all http://: it is not read"
    ]


@pytest.mark.parametrize(
    "options",
    [
        {"storage.kind": "local", "storage.local_dir": "/data"},
        {"storage.bucket": "b", "storage.endpoint": "http://s3:9000"},
        {
            "storage.bucket": "b",
            "storage.access_key_id": "id",
            "storage.secret_access_key": "key",
            "etcd.username": "u",
            "etcd.password": "p",
        },
    ],
)
def test_a_resolved_connection_passed_on_as_options_is_accepted(options: dict[str, str]) -> None:
    """``connection_options`` gave every store setting, a bucket beside kind=local too."""
    connection = parse_connection(options)
    assert parse_connection(connection_options(connection)) == connection


def test_a_list_variable_that_is_not_json_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pydantic-settings raised a bare SettingsError naming only the section."""
    monkeypatch.setenv("KAFSCALE_ETCD__ENDPOINTS", "http://etcd:2379")
    with pytest.raises(SourceOptionError, match=r"KAFSCALE_ETCD__ENDPOINTS.*is not JSON"):
        parse_connection({})
