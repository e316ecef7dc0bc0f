"""What README.md and docs/*.md cite exists: repository files, tests, ``kafscale`` flags.

The pages name files (``broker/storage/reader.py``), tests that prove a claim
(``tests/integration/test_x.py::test_y``) and commands to paste (``kafscale local --proxy``).
A renamed module, a test folded into another or a flag renamed in the settings model must not
leave a reader at something that is not there: each is checked against the repository and
the CLI's own parser. (Links are ``test_doc_links``'s; the configuration reference and the API
tables have tests of their own.)
"""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

import pytest

from kafscale.broker.cli import _parser

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Not in the repository on purpose: a folder the harness makes at run time (its tool cache),
# a name standing for any test file.
NOT_FILES = {".ci/cache/", "tests/integration/test_x.py"}
# Pages about other projects' test suites, whose paths are those projects' own.
OTHER_PROJECTS = {"client-suites.md"}

TOP = r"(?:broker|operator|pipeline|tests|bench|charts|crds|deploy|docs|\.ci)"
# A file (a name with an extension) or a folder written with its trailing slash, optionally
# followed by ::test ids; not part of a longer path (``~/.cache/x/bench/...``, ``deploy/x`` in
# ``kubectl exec deploy/x``, which has neither an extension nor a slash).
PATH = re.compile(
    rf"(?<![\w./~-])({TOP}/(?:[\w.-]+/)*(?:[\w-]+\.[\w.]*\w|[\w.-]+/)?)((?:::[\w]+)*)(?![\w<*$])"
)
# A test module named without its folder (``test_x.py::test_y``), as most pages cite them.
TEST_ID = re.compile(r"(?<![\w/.-])(test_\w+\.py)((?:::\w+)+)")
COMMANDS = "broker|proxy|local|operator|drain|users|acls|status|config-reference"
# `kafscale <command> ...` up to the end of its shell line, a pipe, `;`, `&&` or a comment.
COMMAND = re.compile(rf"(?<![\w/.-])kafscale ({COMMANDS})(?=[\s`]|$)([^`\n|;&#]*)")


def cited_paths(text: str) -> list[tuple[str, str]]:
    """``(path, "::a::b")`` for every repository file or folder a page names; a test module
    named alone stands for the modules of that name in any test folder (``tests/*/test_x.py``)."""
    found = [(m.group(1), m.group(2)) for m in PATH.finditer(text)]
    found += [(f"tests/*/{m.group(1)}", m.group(2)) for m in TEST_ID.finditer(text)]
    return [(path, ids) for path, ids in found if path.endswith("/") or "." in path.rsplit("/")[-1]]


def commands(text: str) -> list[tuple[str, list[str]]]:
    """``(command, words)`` for every ``kafscale`` command line, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [(m.group(1), m.group(2).split()) for m in COMMAND.finditer(joined)]


@cache
def _definitions(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, kinds))


def missing_paths(page: Path) -> list[str]:
    missing = []
    for path, ids in cited_paths(page.read_text()):
        targets = sorted(REPO.glob(path)) if "*" in path else [REPO / path]
        if path in NOT_FILES or page.name in OTHER_PROJECTS:
            continue
        if not any(target.exists() for target in targets):
            missing.append(f"{path}: no such file")
            continue
        for name in ids.split("::")[1:]:
            if not any(name in _definitions(target) for target in targets):
                missing.append(f"{path}::{name}: no such test or function")
    return missing


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def unknown_flags(command: str, words: list[str]) -> list[str]:
    """The ``--flags`` of one command line that its parser does not have: before a nested
    command (``users create``), the command's own; after it, the nested command's."""
    parser = _subcommands(_parser(None))[command]
    nested = _subcommands(parser)
    at = next((i for i, word in enumerate(words) if word in nested), len(words))
    parts = [(parser, words[:at])]
    if at < len(words):
        parts.append((nested[words[at]], words[at + 1 :]))
    return [
        f"kafscale {command} {flag}"
        for part_parser, part in parts
        for flag in _flags(part)
        if flag not in _options(part_parser)
    ]


def _flags(words: list[str]) -> list[str]:
    return [word.split("=", 1)[0] for word in words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", word)]


def test_cited_paths_find_files_folders_and_test_ids() -> None:
    text = (
        "see `tests/unit/test_x.py::test_y`, [`broker/storage/reader.py`], `tests/harness/`; "
        "`kubectl exec deploy/demo-broker`, `~/.cache/kafscale-bench/runs`, `tests/harness`; "
        "[`test_doc_references.py::test_z`, `test_nowhere.py::test_w`]"
    )
    assert cited_paths(text) == [
        ("tests/unit/test_x.py", "::test_y"),
        ("broker/storage/reader.py", ""),
        ("tests/harness/", ""),
        ("tests/*/test_doc_references.py", "::test_z"),
        ("tests/*/test_nowhere.py", "::test_w"),
    ]


def test_commands_join_continuation_lines_and_stop_at_the_shell_line_end() -> None:
    text = "```sh\nkafscale local --brokers 3 \\\n  --proxy  # comment\nkafscale status: not\n```"
    assert commands(text) == [("local", ["--brokers", "3", "--proxy"])]


def test_unknown_flags_are_named_with_their_command() -> None:
    assert unknown_flags("local", ["--brokers", "3", "--proxy", "--listener-rack", "a"]) == []
    assert unknown_flags("acls", ["add", "--topic", "t", "--operation", "READ"]) == []
    assert (
        unknown_flags("users", ["--etcd-endpoints", "E", "create", "a", "--password-stdin"]) == []
    )
    assert unknown_flags("local", ["--broker", "3"]) == ["kafscale local --broker"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_file_and_test_exists(page: Path) -> None:
    assert missing_paths(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_kafscale_flag_shown_exists(page: Path) -> None:
    found = [
        flag for cmd, words in commands(page.read_text()) for flag in unknown_flags(cmd, words)
    ]
    assert found == []


def test_the_readmes_flags_of_kafscale_local_exist() -> None:
    """The README's table of `kafscale local` flags names them without the command."""
    text = (REPO / "README.md").read_text()
    section = text.split("### On one machine", 1)[1].split("\n#", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| `--")]
    words = [word for line in table for span in re.findall(r"`([^`]+)`", line.split("|")[1])
             for word in span.split()]  # fmt: skip
    assert table
    assert unknown_flags("local", words) == []


def test_the_charts_icon_is_a_file_of_the_repository() -> None:
    """``helm show chart`` and chart indexes show the icon from the repository's main branch."""
    chart = (REPO / "charts" / "kafscale" / "Chart.yaml").read_text()
    icon = re.search(
        r"^icon: https://raw\.githubusercontent\.com/[\w-]+/[\w-]+/main/(\S+)$", chart, re.M
    )
    assert icon is not None, "Chart.yaml's icon is not a file of this repository's main branch"
    assert (REPO / icon.group(1)).is_file(), icon.group(1)
