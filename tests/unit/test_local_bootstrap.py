"""The ``bootstrap.servers`` `kafscale local`'s banner prints is what its brokers tell clients
(their registrations: what Metadata answers), not ``localhost`` whatever was given."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafscale.broker.app import registration
from kafscale.broker.config import BrokerSettings, ListenerSettings
from kafscale.broker.local import LocalOptions, advertised_bootstrap, local_settings

pytestmark = pytest.mark.unit

ETCD_URL = "http://127.0.0.1:2379"


def banner_bootstrap(base: BrokerSettings, options: LocalOptions) -> str:
    """The banner's bootstrap of the brokers ``options`` start from ``base``, each registered
    as the broker registers itself, on the port it was given."""
    infos = []
    for index in range(options.brokers):
        settings = local_settings(base, options, ETCD_URL, index)
        ports = {item.name: item.port for item in settings.listener_plan()}
        infos.append(registration(settings, index + 1, ports, None))
    return advertised_bootstrap(infos)


@pytest.mark.parametrize(
    ("advertised_host", "bootstrap"),
    [(None, "localhost:19990,localhost:19991"), ("myhost", "myhost:19990,myhost:19991")],
)
def test_the_banner_gives_the_host_clients_are_told(
    tmp_path: Path, advertised_host: str | None, bootstrap: str
) -> None:
    options = LocalOptions(data_dir=tmp_path, brokers=2, port=19990, host="0.0.0.0")
    base = BrokerSettings(listener=ListenerSettings(advertised_host=advertised_host))
    assert banner_bootstrap(base, options) == bootstrap


def test_the_banner_gives_the_advertised_listener(tmp_path: Path) -> None:
    options = LocalOptions(data_dir=tmp_path, brokers=1, port=19990, host="0.0.0.0")
    base = BrokerSettings(
        listeners="PLAINTEXT://0.0.0.0:19990",
        advertised_listeners="PLAINTEXT://kafka.example:29092",
    )
    assert banner_bootstrap(base, options) == "kafka.example:29092"
