"""What other clients' own suites found against a secured KafScale (SASL and TLS listeners; the
suites and how they were pointed at ``kafscale local`` are in docs/client-suites.md), each as a
check of our own with a real client against a real ``kafscale local``.

* ``kafscale local`` with one broker whose listener is SASL_SSL (the set-up docs/security.md
  shows): transactions never completed. The coordinator sent the markers for its own
  partitions over the network, to its own SASL listener, with no inter-broker login to give,
  and they were refused: a read_committed consumer never saw the committed records (its last
  stable offset stayed put) and kafka-python's suite, run over SASL_SSL, hung in its
  transactional test. A broker now writes the markers of the partitions it owns in place.
* ``kafscale local --brokers 3 --proxy`` with the authorizer on: a user allowed everything on
  their transactional id got TRANSACTIONAL_ID_AUTHORIZATION_FAILED producing in a transaction
  as soon as any ACL named that id (aiokafka's ``test_sasl_deny_txnid_during_transaction``).
  A partition owner checks the transaction with its coordinator as itself (the local brokers'
  certificate), which was no super user; nor could its markers reach the other brokers.
* Through that proxy, a transactional id the user may not DESCRIBE was not refused
  (FindCoordinator answered by the proxy checked groups only; aiokafka's
  ``test_sasl_deny_txnid_describe``), and a topic the user may not create came back
  UNKNOWN_TOPIC_OR_PARTITION, not TOPIC_AUTHORIZATION_FAILED (the broker's refusal was dropped;
  aiokafka's ``test_sasl_deny_autocreate_cluster``): the client waited out its timeout instead
  of failing at once with the reason.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from harness import children
from harness.children import settings_free_env
from harness.local_mode import launch_local, stop_with_ctrl_c, wait_running
from harness.ports import free_port_run
from harness.tls import TestPki, make_pki

pytestmark = pytest.mark.integration

PARTITIONS = 3
TXN_TIMEOUT_S = 30.0


def _cli(banner: str, *args: str, stdin: str | None = None) -> None:
    """The ``kafscale`` CLI against the etcd the banner names, as an operator runs it."""
    etcd_url = re.search(r"etcd\s+= (\S+)", banner)
    assert etcd_url is not None, banner
    env = settings_free_env()
    env["KAFSCALE_ETCD__ENDPOINTS"] = json.dumps([etcd_url[1]])
    children.run(
        [sys.executable, "-m", "kafscale.broker.cli", *args],
        input=stdin,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )


def _create_user(banner: str, name: str, password: str) -> None:
    """A SCRAM user, made as an operator makes one (``kafscale users``, straight to etcd)."""
    _cli(banner, "users", "create", name, "--password-stdin", stdin=password)


def _read_committed(config: dict[str, str], topic: str, expect: int) -> list[bytes]:
    """Values a read_committed consumer sees from offset 0 of every partition (it stops once
    it has ``expect`` and every partition is at its end)."""
    consumer = Consumer(
        {
            **config,
            "group.id": f"readers-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: list[bytes] = []
    at_end: set[int] = set()
    try:
        for _ in range(300):
            message = consumer.poll(0.1)
            if message is None:
                continue
            if message.error() is not None:
                at_end.add(message.partition())
            else:
                values.append(message.value())
            if len(values) >= expect and len(at_end) == PARTITIONS:
                break
    finally:
        consumer.close()
    return values


def _config(port: int, pki_ca: Path) -> dict[str, str]:
    return {
        "bootstrap.servers": f"localhost:{port}",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
        "ssl.ca.location": str(pki_ca),
    }


def _commit_one_abort_one(config: dict[str, str], topic: str, txn_id: str) -> list[bytes]:
    """Nine records committed, six aborted, then what read_committed sees."""
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer({**config, "transactional.id": txn_id})
    producer.init_transactions(TXN_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(9):
        producer.produce(topic, value=f"committed-{i}".encode(), partition=i % PARTITIONS)
    producer.commit_transaction(TXN_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, value=f"aborted-{i}".encode(), partition=i % PARTITIONS)
    producer.abort_transaction(TXN_TIMEOUT_S)
    return _read_committed(config, topic, 9)


def test_one_sasl_ssl_broker_completes_transactions(tmp_path: Path) -> None:
    """One broker, one SASL_SSL listener, no inter-broker credentials: a transaction commits
    and another aborts within their timeouts; read_committed sees exactly the committed
    records (every marker was written), and the broker does not warn about the missing login."""
    port = free_port_run(1)
    pki = make_pki(tmp_path / "pki")
    log = tmp_path / "local.log"
    process = launch_local(
        [
            *("--brokers", "1", "--port", str(port), "--data-dir", str(tmp_path / "data")),
            *("--log-flush-interval-ms", "50"),
            *("--listeners", f"SASL_SSL://127.0.0.1:{port}"),
            *("--advertised-listeners", f"SASL_SSL://localhost:{port}"),
            *("--listener-security-protocol-map", "SASL_SSL:SASL_SSL"),
            *("--tls-cert-file", str(pki.server.cert), "--tls-key-file", str(pki.server.key)),
        ],
        log,
    )
    try:
        banner = wait_running(process, log)
        _create_user(banner, "alice", "alice-secret")
        config = _config(port, pki.ca.cert_path)
        topic = f"txn-{uuid.uuid4().hex[:8]}"
        values = _commit_one_abort_one(config, topic, f"app-{uuid.uuid4().hex[:6]}")
        assert sorted(values) == sorted(f"committed-{i}".encode() for i in range(9))
        output = log.read_text(errors="replace")
        assert "cannot write txn markers" not in output
        # no start-up warning about other brokers' markers: there are none (a cluster of one)
        assert "needs inter_broker.sasl_username" not in output
    finally:
        if process.poll() is None:
            assert stop_with_ctrl_c(process) == 0, log.read_text(errors="replace")


def _start_secured_proxy(tmp_path: Path, port: int, pki: TestPki) -> subprocess.Popen[bytes]:
    """Three brokers behind a SASL_SSL proxy on ``port``, the authorizer on (nothing allowed
    without an ACL)."""
    return launch_local(
        [
            *("--brokers", "3", "--proxy", "--port", str(port)),
            *("--data-dir", str(tmp_path / "data"), "--log-flush-interval-ms", "50"),
            *("--listeners", f"EXTERNAL://127.0.0.1:{port}"),
            *("--advertised-listeners", f"EXTERNAL://localhost:{port}"),
            *("--listener-security-protocol-map", "EXTERNAL:SASL_SSL"),
            *("--tls-cert-file", str(pki.server.cert), "--tls-key-file", str(pki.server.key)),
            *("--authorizer-enabled", "true"),
        ],
        tmp_path / "local.log",
    )


def test_the_proxy_refuses_what_the_user_may_not_describe_or_create(tmp_path: Path) -> None:
    """A transactional id alice may not DESCRIBE fails init_transactions with
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED; a topic she may write but not create fails her
    produce with TOPIC_AUTHORIZATION_FAILED, both well before the client's timeouts."""
    port = free_port_run(4)
    pki = make_pki(tmp_path / "pki")
    log = tmp_path / "local.log"
    process = _start_secured_proxy(tmp_path, port, pki)
    try:
        banner = wait_running(process, log)
        _create_user(banner, "alice", "alice-secret")
        txn_id, topic = f"app-{uuid.uuid4().hex[:6]}", f"new-{uuid.uuid4().hex[:8]}"
        grant = ("--principal", "User:alice", "--operation")
        _cli(banner, "acls", "add", "--transactional-id", txn_id, *grant, "ALL")
        _cli(banner, "acls", "add", "--transactional-id", txn_id, *grant, "DESCRIBE", "--deny")
        for operation in ("DESCRIBE", "WRITE"):
            _cli(banner, "acls", "add", "--topic", topic, *grant, operation)
        config = _config(port, pki.ca.cert_path)
        producer = Producer({**config, "transactional.id": txn_id})
        with pytest.raises(KafkaException) as refused:
            producer.init_transactions(TXN_TIMEOUT_S)
        assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        outcomes: list[KafkaError | None] = []
        plain = Producer({**config, "message.timeout.ms": 20_000})
        plain.produce(topic, value=b"v", on_delivery=lambda e, _m: outcomes.append(e))
        plain.flush(30)
        (error,) = outcomes
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        if process.poll() is None:
            assert stop_with_ctrl_c(process) == 0, log.read_text(errors="replace")


def test_transactions_through_the_local_proxy_with_acls_on_the_transactional_id(
    tmp_path: Path,
) -> None:
    """Three brokers behind a SASL_SSL proxy, the authorizer on (nothing allowed without an
    ACL): alice, allowed everything on her topic, group and transactional id, commits and
    aborts; read_committed sees exactly the committed records."""
    port = free_port_run(4)
    pki = make_pki(tmp_path / "pki")
    log = tmp_path / "local.log"
    process = _start_secured_proxy(tmp_path, port, pki)
    try:
        banner = wait_running(process, log)
        _create_user(banner, "alice", "alice-secret")
        topic, txn_id = f"txn-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:6]}"
        for kind, name in (
            ("--topic", topic),
            ("--group", "readers-"),
            ("--transactional-id", txn_id),
        ):
            _cli(
                banner,
                "acls",
                "add",
                kind,
                name,
                "--prefixed",
                "--principal",
                "User:alice",
                "--operation",
                "ALL",
            )
        values = _commit_one_abort_one(_config(port, pki.ca.cert_path), topic, txn_id)
        assert sorted(values) == sorted(f"committed-{i}".encode() for i in range(9))
    finally:
        if process.poll() is None:
            assert stop_with_ctrl_c(process) == 0, log.read_text(errors="replace")
