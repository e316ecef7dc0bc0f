"""pytest plugin: kafka-python's KafkaFixture spawns a secured `kafscale local` instead of Kafka.

Only the fixture's process management is replaced (open/start/stop/get_topic_names/dump_logs);
the tests and their assertions are untouched. Set-up from env:
  KAFSCALE=/path/to/kafscale   the CLI
  KS_MODE=broker|proxy         one broker with the listener, or 3 brokers behind a secured proxy
  KS_AUTHZ=1                   authorizer on with allow-everyone-if-no-acl-found
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from test.integration import fixtures as F

KAFSCALE = os.environ.get("KAFSCALE", "kafscale")
MODE = os.environ.get("KS_MODE", "broker")
LOGDIR = os.environ.get("KS_LOGDIR", "/tmp/kafscale-suite-logs")
os.makedirs(LOGDIR, exist_ok=True)


def _free_port():
    """A port with the next three free too (the proxy takes P, its brokers P+1..P+3)."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        try:
            for q in range(p, p + 4):
                t = socket.socket()
                t.bind(("127.0.0.1", q))
                t.close()
            return p
        except OSError:
            continue


def _make_pem_pki(ssl_dir):
    """ca-cert (the name their tests read) and a server certificate for localhost, in PEM."""
    os.makedirs(ssl_dir, exist_ok=True)
    run = lambda *a: subprocess.run(a, cwd=ssl_dir, check=True, capture_output=True)  # noqa: E731
    run("openssl", "genrsa", "-out", "ca-key", "2048")
    run("openssl", "req", "-new", "-x509", "-key", "ca-key", "-out", "ca-cert", "-days", "1",
        "-subj", "/C=US/ST=CA/O=MyOrg, Inc./CN=mydomain.com",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", "server.key", "-out", "server.csr")
    with open(os.path.join(ssl_dir, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca-cert", "-CAkey", "ca-key",
        "-CAcreateserial", "-days", "1", "-extfile", "san.ext", "-out", "server.crt")


def _die_with_parent():
    """SIGINT to the child when pytest dies (pytest-timeout's os._exit skips every cleanup)."""
    import ctypes
    ctypes.CDLL("libc.so.6").prctl(1, 2)  # PR_SET_PDEATHSIG, SIGINT


class _Child:
    def __init__(self, proc, log_path):
        self.proc, self.log_path = proc, log_path

    def dump_logs(self):
        pass

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _open(self):
    if self.running:
        return
    if self.tmp_dir is None:
        import py
        self.tmp_dir = py.path.local.mkdtemp()
    self.tmp_dir.ensure(dir=True)
    data_dir = self.tmp_dir.join("ks").strpath
    port = _free_port() if self.auto_port else self.port
    self.port = port
    forced = os.environ.get("KS_FORCE_TRANSPORT")  # e.g. SASL_SSL:SCRAM-SHA-512
    if forced and self.transport == "PLAINTEXT":
        self.transport, _, mech = forced.partition(":")
        self.sasl_mechanism = mech or None
    proto = self.transport
    args = [KAFSCALE, "local", "--data-dir", data_dir, "--port", str(port),
            "--topics-num-partitions", str(self.partitions),
            "--groups-min-session-timeout-ms", "1000", "--groups-initial-rebalance-delay-ms", "0"]
    if MODE == "proxy":
        args += ["--brokers", "3", "--proxy"]
    else:
        args += ["--brokers", "1"]
    if os.environ.get("KS_AUTHZ"):
        args += ["--authorizer-enabled", "true",
                 "--authorizer-allow-everyone-if-no-acl-found", "true"]
    if proto != "PLAINTEXT":
        args += ["--listeners", f"{proto}://localhost:{port}",
                 "--listener-security-protocol-map", f"{proto}:{proto}"]
    if self.sasl_enabled:
        args += ["--sasl-enabled-mechanisms", self.sasl_mechanism]
    if self.ssl_enabled:
        self.ssl_dir = os.path.join(self.tmp_dir.strpath, "ssl")
        _make_pem_pki(self.ssl_dir)
        args += ["--tls-cert-file", os.path.join(self.ssl_dir, "server.crt"),
                 "--tls-key-file", os.path.join(self.ssl_dir, "server.key")]
    log_path = os.path.join(LOGDIR, f"{MODE}-{proto}-{self.sasl_mechanism}-{port}.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    logf = open(log_path, "w")
    print("ARGS", " ".join(args), file=logf, flush=True)
    proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=_die_with_parent)
    self.child = _Child(proc, log_path)
    deadline = time.time() + 90
    etcd_url = None
    while time.time() < deadline:
        text = open(log_path).read()
        if "KafScale is running" in text:
            etcd_url = re.search(r"etcd\s+= (\S+)", text).group(1)
            break
        if proc.poll() is not None:
            raise RuntimeError("kafscale local exited:\n" + text)
        time.sleep(0.2)
    else:
        raise RuntimeError("kafscale local did not start:\n" + open(log_path).read())
    if self.sasl_enabled:
        # PLAIN checks against the SCRAM credentials: the user is made the same way for all three.
        subprocess.run([KAFSCALE, "users", "--etcd-endpoints", etcd_url, "create",
                        self.broker_user, "--password-stdin"],
                       input=self.broker_password.encode(), check=True, env=env,
                       capture_output=True)
    self.running = True


def _start(self):
    return True


def _stop(self):
    if self.external or self.child is None:
        return
    self.child.stop()
    self.running = False


def _get_topic_names(self):
    from kafka import KafkaAdminClient
    params = self._enrich_client_params({"client_id": "topic_lister"})
    with KafkaAdminClient(**params) as admin:
        return admin.list_topics()


F.KafkaFixture.open = _open
F.KafkaFixture.start = _start
F.KafkaFixture.stop = _stop
F.KafkaFixture.get_topic_names = _get_topic_names
F.KafkaFixture.dump_logs = lambda self: None
print("kafscale plugin: mode", MODE, file=sys.stderr)
