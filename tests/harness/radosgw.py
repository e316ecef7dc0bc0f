"""A throw-away single-node Ceph with radosgw: a real S3 implementation for storage tests.

One monitor, one memstore OSD (data in RAM) and radosgw, all on 127.0.0.1 with ``auth none``,
from the Debian packages in ``.ci/system-packages.txt`` (``make system-deps``). Every wait is
bounded; ``stop()`` kills whatever was started, also after a failed ``start()``.

Two things that are not obvious: with ``auth none`` the daemons only talk to each other when
all four ``ms_*_mode`` options are ``crc secure``; and radosgw creates about eight pools, so the
default 32 placement groups each would exceed the per-OSD limit on a single OSD.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from harness import children
from kafscale.broker.child_process import free_port_run

REQUIRED_BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
SYSTEM_DEPS_HINT = (
    "Ceph radosgw is not installed; run `make system-deps` (apt-get install -y "
    "--no-install-recommends ceph-mon ceph-osd radosgw ceph-common)"
)


def missing_binaries() -> list[str]:
    return [name for name in REQUIRED_BINARIES if shutil.which(name) is None]


class CephStartError(RuntimeError):
    """The cluster did not come up; the message carries the tail of the daemon logs."""


class RadosGW:
    """Start/stop a one-node Ceph cluster serving S3 at ``endpoint_url``."""

    def __init__(
        self,
        workdir: Path,
        *,
        access_key_id: str = "kafscale-test",
        secret_access_key: str = "kafscale-test-secret",
        start_timeout_s: float = 90.0,
    ) -> None:
        self.workdir = workdir
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.region = "us-east-1"
        self._start_timeout_s = start_timeout_s
        self._mon_port = free_port_run()
        self._rgw_port = free_port_run(avoid=[self._mon_port])
        self._conf = workdir / "ceph.conf"
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "CEPH_ARGS")
        }
        self.startup_s: float | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._rgw_port}"

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        missing = missing_binaries()
        if missing:
            raise CephStartError(f"{SYSTEM_DEPS_HINT}; missing: {', '.join(missing)}")
        began = time.monotonic()
        deadline = began + self._start_timeout_s
        try:
            self._write_config()
            self._start_monitor(deadline)
            self._start_osd(deadline)
            self._start_radosgw(deadline)
            self._create_user(deadline)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        """SIGTERM everything, SIGKILL what is left after a second: the data is in RAM anyway.

        (radosgw takes several seconds to exit on SIGTERM; nothing is gained by waiting.)
        """
        for proc in self._processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        until = time.monotonic() + 1.0
        for proc in self._processes.values():
            try:
                proc.wait(timeout=max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5.0)
        self._processes.clear()

    # --- steps --------------------------------------------------------------------------------

    def _write_config(self) -> None:
        """One monitor, one memstore OSD, radosgw, no auth. ``paxos propose interval``: the
        monitor batches map changes for 1 s by default, and radosgw's start (its pools, each
        a new OSD map) made ~14 of them in turn: 14 s to start; with 0.05 s, ~3 s. A lone
        monitor has no peers a shorter batch could flood."""
        d = self.workdir
        for sub in ("mon.a", "osd.0", "run", "log", "rgw"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "keyring").touch()
        self._fsid = str(uuid.uuid4())
        self._conf.write_text(
            f"""[global]
fsid = {self._fsid}
mon host = v2:127.0.0.1:{self._mon_port}
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
ms_mon_client_mode = crc secure
ms_client_mode = crc secure
ms_mon_service_mode = crc secure
ms_service_mode = crc secure
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
pid file = {d}/run/$name.pid
keyring = {d}/keyring
[mon]
mon data = {d}/mon.$id
paxos propose interval = 0.05
[osd]
osd objectstore = memstore
osd data = {d}/osd.$id
memstore device bytes = 1073741824
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{self._rgw_port}
rgw data = {d}/rgw
"""
        )

    def _start_monitor(self, deadline: float) -> None:
        monmap = self.workdir / "monmap"
        addr = f"[v2:127.0.0.1:{self._mon_port}]"
        self._run(
            [
                "monmaptool",
                "--create",
                "--addv",
                "a",
                addr,
                "--fsid",
                self._fsid,
                "--clobber",
                str(monmap),
            ],
            deadline,
        )
        self._run(
            ["ceph-mon", "-c", str(self._conf), "--mkfs", "-i", "a", "--monmap", str(monmap)],
            deadline,
        )
        self._spawn("mon", ["ceph-mon", "-f", "-c", str(self._conf), "-i", "a"])
        self._wait("monitor quorum", deadline, lambda: self._ceph_ok(["mon", "stat"]))

    def _start_osd(self, deadline: float) -> None:
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run(self._ceph_cmd(["osd", "new", osd_uuid]), deadline).strip()
        self._run(
            ["ceph-osd", "-c", str(self._conf), "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid],
            deadline,
        )
        self._spawn("osd", ["ceph-osd", "-f", "-c", str(self._conf), "-i", osd_id])
        self._wait("the OSD to be up", deadline, self._osd_up)

    def _start_radosgw(self, deadline: float) -> None:
        self._spawn("rgw", ["radosgw", "-f", "-c", str(self._conf), "-n", "client.rgw"])
        self._wait("radosgw to answer HTTP", deadline, self._http_ok)

    def _create_user(self, deadline: float) -> None:
        self._run(
            [
                "radosgw-admin",
                "-c",
                str(self._conf),
                "user",
                "create",
                "--uid",
                "kafscale",
                "--display-name",
                "kafscale tests",
                "--access-key",
                self.access_key_id,
                "--secret-key",
                self.secret_access_key,
            ],
            deadline,
        )
        self._wait("the S3 user to authenticate", deadline, self._signed_request_ok)

    # --- probes -------------------------------------------------------------------------------

    def _ceph_cmd(self, args: list[str]) -> list[str]:
        return ["ceph", "-c", str(self._conf), "--connect-timeout", "5", *args]

    def _ceph_ok(self, args: list[str]) -> bool:
        result = children.run(
            self._ceph_cmd(args), capture_output=True, timeout=15, env=self._env, check=False
        )
        return result.returncode == 0

    def _osd_up(self) -> bool:
        result = children.run(
            self._ceph_cmd(["osd", "stat", "-f", "json"]),
            capture_output=True,
            timeout=15,
            env=self._env,
            check=False,
        )
        return result.returncode == 0 and json.loads(result.stdout).get("num_up_osds") == 1

    def _http_ok(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint_url, timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def _signed_request_ok(self) -> bool:
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )
        try:
            client.list_buckets()
            return True
        except Exception:
            return False
        finally:
            client.close()

    # --- plumbing -----------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / "log" / f"{name}.out", "wb")  # noqa: SIM115 - lives with proc
        self._processes[name] = children.spawn(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=self._env,
            start_new_session=True,
        )
        log.close()  # the child holds its own descriptor

    def _run(self, argv: list[str], deadline: float) -> str:
        timeout = max(1.0, deadline - time.monotonic())
        result = children.run(
            argv,
            capture_output=True,
            timeout=timeout,
            cwd=self.workdir,
            env=self._env,
            check=False,
        )
        if result.returncode != 0:
            raise CephStartError(
                f"{' '.join(argv[:3])} failed ({result.returncode}): "
                f"{result.stderr.decode(errors='replace')[-2000:]}\n{self._log_tails()}"
            )
        return result.stdout.decode()

    def _wait(self, what: str, deadline: float, probe: Callable[[], bool]) -> None:
        while time.monotonic() < deadline:
            for name, proc in self._processes.items():
                if proc.poll() is not None:
                    raise CephStartError(
                        f"{name} exited ({proc.returncode}) while waiting for {what}\n"
                        f"{self._log_tails()}"
                    )
            if probe():
                return
            time.sleep(0.25)
        raise CephStartError(f"timed out waiting for {what}\n{self._log_tails()}")

    def _log_tails(self, lines: int = 15) -> str:
        parts = []
        for path in sorted((self.workdir / "log").glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)
