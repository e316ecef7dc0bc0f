"""pytest plugin: Quix Streams' Kafka "container" is a `kafscale local` started on free ports.

Only the Docker parts of its tests/conftest.py are replaced: testcontainers' Network (a no-op)
and ContainerHelper.create_kafka_container (a `kafscale local` process in place of a
cp-kafka container). The tests and their assertions are untouched. Set-up from env:
  KAFSCALE=/path/to/kafscale   the CLI (default: `kafscale` on PATH)
  KS_MODE=b3|proxy|s3          3 brokers / 3 brokers behind the proxy / 1 broker on moto's S3
  MOTO_SERVER=/path/to/moto_server   for KS_MODE=s3
  KS_LOGDIR=/tmp/...           where the broker logs go
"""

import os
import re
import socket
import subprocess
import tempfile
import time

import testcontainers.core.network as tc_network

KAFSCALE = os.environ.get("KAFSCALE", "kafscale")
MODE = os.environ.get("KS_MODE", "b3")
LOGDIR = os.environ.get("KS_LOGDIR", "/tmp/kafscale-quix-logs")


def _free_port(span=4):
    """A loopback port with the next span-1 free too (the proxy takes P, its brokers P+1..)."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        try:
            for q in range(p, p + span):
                t = socket.socket()
                t.bind(("127.0.0.1", q))
                t.close()
            return p
        except OSError:
            continue


def _die_with_parent():
    """SIGINT to the child when pytest dies (pytest-timeout's os._exit skips every cleanup)."""
    import ctypes

    ctypes.CDLL("libc.so.6").prctl(1, 2)  # PR_SET_PDEATHSIG, SIGINT


class _NoNetwork:
    """testcontainers' Network without Docker: nothing to create."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class KafScaleLocal:
    """Quacks like the DockerContainer the conftest starts, stops and reads logs of."""

    def __init__(self, port):
        self.port = port
        self.procs = []
        self.log_path = os.path.join(LOGDIR, f"{MODE}-{port}.log")

    def start(self):
        os.makedirs(LOGDIR, exist_ok=True)
        data_dir = tempfile.mkdtemp(prefix="ks-quix-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
        args = [KAFSCALE, "local", "--data-dir", data_dir, "--port", str(self.port),
                "--topics-num-partitions", "1",
                "--groups-min-session-timeout-ms", "1000",
                "--groups-initial-rebalance-delay-ms", "10"]
        if MODE == "proxy":
            args += ["--brokers", "3", "--proxy"]
        elif MODE == "s3":
            s3_port = _free_port(1)
            moto = subprocess.Popen(
                [os.environ.get("MOTO_SERVER", "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            self.procs.append(moto)
            time.sleep(1.5)
            env.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
            args += ["--brokers", "1", "--s3-endpoint", f"http://127.0.0.1:{s3_port}",
                     "--bucket", "quix"]
        else:
            args += ["--brokers", "3"]
        logf = open(self.log_path, "w")
        print("ARGS", " ".join(args), file=logf, flush=True)
        proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent)
        self.procs.insert(0, proc)
        deadline = time.time() + 90
        while time.time() < deadline:
            if "KafScale is running" in open(self.log_path).read():
                return self
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("kafscale local did not start:\n" + open(self.log_path).read())

    def get_logs(self):
        return [b"Kafka Server started"], []

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(2)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _create_kafka_container(network):
    port = _free_port()
    address = f"127.0.0.1:{port}"
    return KafScaleLocal(port), address, address


def pytest_configure(config):
    tc_network.Network = _NoNetwork
    from tests import conftest, containerhelper

    conftest.Network = _NoNetwork
    containerhelper.ContainerHelper.create_kafka_container = staticmethod(_create_kafka_container)
    containerhelper.wait_for_container_readiness = lambda container, text: None
