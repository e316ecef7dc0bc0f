"""`kafscale local` refuses option combinations that cannot start, before starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafscale.broker.app import StartupError
from kafscale.broker.config import BrokerSettings
from kafscale.broker.local import LocalOptions, check_options

pytestmark = pytest.mark.unit

LISTENERS = BrokerSettings(listeners="PLAINTEXT://127.0.0.1:19990")


def test_listeners_with_several_brokers_need_the_proxy(tmp_path: Path) -> None:
    options = LocalOptions(data_dir=tmp_path, brokers=2, port=19990, host="127.0.0.1")
    with pytest.raises(StartupError, match="--listeners are one broker's listeners"):
        check_options(LISTENERS, options)


@pytest.mark.parametrize(("brokers", "proxy"), [(1, False), (2, True), (3, True)])
def test_listeners_are_fine_for_one_broker_or_behind_the_proxy(
    tmp_path: Path, brokers: int, proxy: bool
) -> None:
    options = LocalOptions(data_dir=tmp_path, brokers=brokers, port=19990, host="h", proxy=proxy)
    check_options(LISTENERS, options)


def test_several_brokers_without_listeners_take_consecutive_ports(tmp_path: Path) -> None:
    options = LocalOptions(data_dir=tmp_path, brokers=3, port=19990, host="127.0.0.1")
    check_options(BrokerSettings(), options)
    assert list(options.listen_ports()) == [19990, 19991, 19992]
