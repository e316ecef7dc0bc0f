"""Which scratch directories a starting run may remove (``harness.scratch``): only ours, and only
those whose owner is no longer running in our pid namespace."""

from __future__ import annotations

import pytest
from harness.scratch import Owner, Running, is_abandoned, owned_prefix, owner_of

pytestmark = pytest.mark.unit

PREFIX = "kafscale-etcd-"
OWNER = Owner(pid_namespace=4026531836, pid=4242, start_ticks=123456)


def test_the_name_records_its_owner() -> None:
    name = owned_prefix(PREFIX, OWNER) + "k3j_9x2a"
    assert name == "kafscale-etcd-of-4026531836-4242-123456-k3j_9x2a"
    assert owner_of(name, PREFIX) == OWNER


@pytest.mark.parametrize(
    "name",
    [
        "kafscale-etcd-k3j_9x2a",  # an older harness's: its owner is unknown
        "kafscale-etcd-of-4026531836-4242-k3j_9x2a",  # no start time
        "kafscale-etcd-of-x-4242-123456-k3j_9x2a",
        "kafscale-etcd-of-4026531836-4242-123456-",  # no random part: not mkdtemp's
        "kafscale-kube-of-4026531836-4242-123456-k3j_9x2a",  # another prefix
        "other-kafscale-etcd-of-4026531836-4242-123456-k3j_9x2a",
    ],
)
def test_names_not_made_by_the_harness_have_no_owner(name: str) -> None:
    assert owner_of(name, PREFIX) is None


NS = OWNER.pid_namespace


@pytest.mark.parametrize(
    ("now", "abandoned"),
    [
        (None, True),  # no such process
        (Running("Z", OWNER.start_ticks), True),  # killed, not yet reaped: runs nothing
        (Running("X", OWNER.start_ticks), True),
        (Running("S", OWNER.start_ticks + 1), True),  # the pid now names another process
        (Running("S", OWNER.start_ticks), False),  # the owner, asleep
        (Running("R", OWNER.start_ticks), False),
        (Running("D", OWNER.start_ticks), False),
    ],
)
def test_a_directory_is_abandoned_only_when_its_owner_no_longer_runs(
    now: Running | None, abandoned: bool
) -> None:
    assert is_abandoned(OWNER, NS, now) is abandoned


def test_an_owner_of_another_pid_namespace_is_never_taken_for_gone() -> None:
    """/dev/shm shared with a container: its pids name processes this one cannot see."""
    assert not is_abandoned(OWNER, NS + 1, None)
