"""Every process the tests start goes through ``harness.children`` (``spawn``, ``run``), so it
dies with the pytest process that started it.

A run that is SIGKILLed (a CI timeout, ``pkill -9 pytest``, the OOM killer) runs no teardown; a
child started with ``subprocess`` directly is re-parented to init and runs on: a ``kafscale``
command, kcat, helm, kubectl or a JVM waiting out its own timeout. This test reads every module
under ``tests/`` (its syntax tree, so code quoted in strings for a child to run is not counted,
nor ``subprocess.Popen`` written as a type) and names each direct start: file and line.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import children

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]

STARTERS = {
    "subprocess": {
        "run",
        "Popen",
        "call",
        "check_call",
        "check_output",
        "getoutput",
        "getstatusoutput",
    },
    "os": {
        "system",
        "popen",
        "spawnl",
        "spawnle",
        "spawnlp",
        "spawnlpe",
        "spawnv",
        "spawnve",
        "spawnvp",
        "spawnvpe",
        "posix_spawn",
        "posix_spawnp",
    },
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
}
"""Module -> the functions of it that start a child process."""

ALLOWED: dict[str, str] = {
    "harness/children.py": "the one place that starts children (through parent_death.start_bound)",
}
"""Files (relative to ``tests/``) that may start children directly, and why."""


@dataclass(frozen=True)
class DirectStart:
    line: int
    call: str


def _annotations(tree: ast.AST) -> set[int]:
    """The ids of every node inside a type annotation (``subprocess.Popen[bytes]`` there starts
    nothing)."""
    roots: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            roots.append(node.returns)
    return {id(inner) for root in roots for inner in ast.walk(root)}


def direct_starts(source: str) -> list[DirectStart]:
    """Where ``source`` names a process-starting function of ``subprocess``, ``os`` or
    ``asyncio`` (called or passed on, e.g. to ``asyncio.to_thread``), or imports one by name."""
    tree = ast.parse(source)
    in_annotation = _annotations(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr in STARTERS.get(node.value.id, ())
            and id(node) not in in_annotation
        ):
            found.append(DirectStart(node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module in STARTERS:
            for alias in node.names:
                if alias.name in STARTERS[node.module]:
                    found.append(
                        DirectStart(node.lineno, f"from {node.module} import {alias.name}")
                    )
    return sorted(found, key=lambda start: start.line)


def test_the_tests_start_children_only_through_the_harness() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(TESTS).as_posix()
        if relative in ALLOWED:
            continue
        for start in direct_starts(path.read_text()):
            offenders.append(f"tests/{relative}:{start.line}: {start.call}")
    assert not offenders, (
        "start children with harness.children.run / spawn (they die with the test run), "
        "not directly:\n" + "\n".join(offenders)
    )


def test_the_allowed_files_exist() -> None:
    """An allowance outlives no file: a renamed module must be named again, with its reason."""
    assert all((TESTS / relative).is_file() for relative in ALLOWED)


SAMPLE = """
import asyncio, os, subprocess
from subprocess import Popen, PIPE, run as plain_run

def annotated(process: subprocess.Popen[bytes]) -> subprocess.CompletedProcess[str]:
    held: subprocess.Popen[str] | None = None
    subprocess.run(["kcat", "-L"], check=True)
    return subprocess.check_output(["helm", "version"])

async def later() -> None:
    await asyncio.to_thread(subprocess.run, ["true"])
    await asyncio.create_subprocess_exec("java")
    os.system("kubectl get pods")
    QUOTED = "subprocess.run(['in', 'a', 'string'])"
    subprocess.TimeoutExpired, subprocess.PIPE, os.environ
"""


def test_the_check_finds_direct_starts_and_nothing_else() -> None:
    assert direct_starts(SAMPLE) == [
        DirectStart(3, "from subprocess import Popen"),
        DirectStart(3, "from subprocess import run"),
        DirectStart(7, "subprocess.run"),
        DirectStart(8, "subprocess.check_output"),
        DirectStart(11, "subprocess.run"),
        DirectStart(12, "asyncio.create_subprocess_exec"),
        DirectStart(13, "os.system"),
    ]


# --- harness.children.run is subprocess.run, with the child bound to this process -----------

PDEATHSIG = """
import ctypes, sys
signal = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(signal), 0, 0, 0)  # PR_GET_PDEATHSIG
print(signal.value, sys.stdin.read(), end="")
"""


def test_run_gives_what_subprocess_run_gives_and_binds_the_child() -> None:
    done = children.run(
        [sys.executable, "-c", PDEATHSIG], input="in", capture_output=True, text=True, check=True
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "9 in", "")  # 9: SIGKILL
    assert done.args == [sys.executable, "-c", PDEATHSIG]  # not setpriv's command line
    with pytest.raises(subprocess.CalledProcessError) as failed:
        children.run([sys.executable, "-c", "raise SystemExit(3)"], check=True)
    assert failed.value.returncode == 3
    assert failed.value.cmd == [sys.executable, "-c", "raise SystemExit(3)"]
    with pytest.raises(subprocess.TimeoutExpired):
        children.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)


def test_a_missing_program_raises_as_subprocess_run_does() -> None:
    """Not ``setpriv``'s exit 127: callers catch ``FileNotFoundError`` (``OSError``)."""
    with pytest.raises(FileNotFoundError):
        children.run(["kafscale-no-such-program"])
    with pytest.raises(FileNotFoundError):
        children.run(["./no-such-program"], cwd="/")


def test_a_shell_command_line_runs_as_with_subprocess() -> None:
    done = children.run("echo bound", shell=True, capture_output=True, text=True)
    assert done.stdout == "bound\n"
