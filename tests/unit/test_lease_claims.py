"""``claim_lease``: what a broker does with a partition's lease key when it acquires it."""

from __future__ import annotations

import pytest

from kafscale.broker.metadata.etcd_txn import KeyValue
from kafscale.broker.metadata.lease_claims import LeaseClaim, claim_lease

ME = b"2"
SESSION = 0x7080A21E99937D00
OLD_SESSION = 0x7080A21E99937C1D


def lease_key(value: bytes, lease: int) -> KeyValue:
    return KeyValue("/kafscale/c/leases/partitions/t/0", value, 10, 12, 2, lease)


def test_an_absent_key_is_created() -> None:
    assert claim_lease(None, ME, SESSION) is LeaseClaim.CREATE


def test_ours_on_this_session_is_confirmed() -> None:
    assert claim_lease(lease_key(ME, SESSION), ME, SESSION) is LeaseClaim.CONFIRM


def test_ours_on_a_session_we_gave_up_is_cleared_not_confirmed() -> None:
    """etcd extended the old lease across its restart: confirmed, the key would vanish with it."""
    assert claim_lease(lease_key(ME, OLD_SESSION), ME, SESSION) is LeaseClaim.CLEAR_STALE


@pytest.mark.parametrize("lease", [SESSION, OLD_SESSION])
def test_another_brokers_key_is_refused_whatever_its_lease(lease: int) -> None:
    assert claim_lease(lease_key(b"3", lease), ME, SESSION) is LeaseClaim.REFUSE
