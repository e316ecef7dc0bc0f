# --- KafScale: an external secured `kafscale local` (EXTERNAL_KAFKA=host:P, listeners on
# P (PLAINTEXT), P+1 (SSL, client certificate required), P+2 (SASL_PLAINTEXT), P+3 (SASL_SSL);
# KAFSCALE_ETCD=<etcd url> for ACLs and SCRAM users, made with the kafscale CLI).
import subprocess as _sp

_EXT = os.environ.get("EXTERNAL_KAFKA")
_KS = os.environ.get("KAFSCALE_BIN", "kafscale")
_KS_ETCD = os.environ.get("KAFSCALE_ETCD")


def _ks(*args, stdin=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    env["KAFSCALE_ETCD__ENDPOINTS"] = f'["{_KS_ETCD}"]'
    out = _sp.run([_KS, *args], input=stdin, env=env,
                  capture_output=True)
    if out.returncode != 0:
        raise RuntimeError(f"kafscale {args}: {out.stdout!r} {out.stderr!r}")
    return out.stdout


class _KafScaleACLManager:
    """kafka-acls.sh's options, through `kafscale acls` (one binding per call)."""

    def __init__(self):
        self._active_acls = []

    def _bindings(self, cluster=None, topic=None, group=None, transactional_id=None,
                  allow_principal=None, deny_principal=None, allow_host=None,
                  deny_host=None, operation=None, producer=None, consumer=None):
        principal, deny = (f"User:{deny_principal}", True) if deny_principal else (
            f"User:{allow_principal}", False)
        host = deny_host or allow_host or "*"
        ops = []  # (resource args, operation)
        if producer:
            ops += [(["--topic", topic], op) for op in ("WRITE", "DESCRIBE", "CREATE")]
        if consumer:
            ops += [(["--topic", topic], op) for op in ("READ", "DESCRIBE")]
            ops += [(["--group", group], "READ")]
        if operation:
            if cluster:
                ops.append((["--cluster-resource"], operation))
            if topic is not None:
                ops.append((["--topic", topic], operation))
            if group is not None:
                ops.append((["--group", group], operation))
            if transactional_id is not None:
                ops.append((["--transactional-id", transactional_id], operation))
        for resource, op in ops:
            yield [*resource, "--principal", principal, "--host", host,
                   "--operation", op.upper(), *(["--deny"] if deny else [])]

    def add_acl(self, **acl_params):
        for args in self._bindings(**acl_params):
            _ks("acls", "add", *args)
        self._active_acls.append(acl_params)

    def remove_acl(self, **acl_params):
        for args in self._bindings(**acl_params):
            _ks("acls", "remove", *args)
        self._active_acls.remove(acl_params)

    def list_acl(self, principal=None):
        return _ks("acls", "list", *(["--principal", f"User:{principal}"] if principal else []))

    def cleanup(self):
        for acl_params in self._active_acls[:]:
            self.remove_acl(**acl_params)


class _KafScaleConfig:
    def add_scram_user(self, username, password):
        _ks("users", "create", username, "--password-stdin", stdin=password.encode())


if _EXT:
    @pytest.fixture(scope="session")
    def docker(request):
        yield None

    @pytest.fixture(scope="session")
    def kafka_image(request, docker):
        return request.config.getoption("--docker-image")

    @pytest.fixture(scope="session")
    def ssl_folder(docker, kafka_image):
        ssl_dir = pathlib.Path(os.environ.get("AIO_SSL_DIR", "tests/ssl_cert"))
        assert (ssl_dir / "ca.crt").is_file(), "run gen-ssl-certs.sh in it first"
        return ssl_dir

    @pytest.fixture(scope="session")
    def kafka_server(kafka_image, docker, docker_ip_address, unused_port, session_id, ssl_folder):
        host, port = _EXT.rsplit(":", 1)
        p = int(port)
        yield KafkaServer(host, p, p + 1, p + 2, p + 3, None)

    @pytest.fixture(scope="class")
    def acl_manager(kafka_server, request):
        return _KafScaleACLManager()

    @pytest.fixture(scope="class")
    def kafka_config(kafka_server, request):
        return _KafScaleConfig()

    @pytest.fixture(scope="class")
    def kerberos_utils(kafka_server):
        return None
