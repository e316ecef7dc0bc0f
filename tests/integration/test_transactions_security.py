"""Transactions on a cluster whose internal listener needs mTLS or SASL, with the authorizer on.

Two broker processes, each with an ``INTERNAL`` SSL listener that requires a client certificate
(their registered main address, where coordinators send WriteTxnMarkers) and a ``CLIENTS``
PLAINTEXT listener for the client (``User:ANONYMOUS``, allowed its topic, group and
transactional id, nothing on the cluster). The brokers present their own certificate to each
other (``inter_broker.*`` unset: the internal listener's security, the ``tls.*`` files), whose
principal is a super user; or, the second time, an ``INTERNAL`` SASL_PLAINTEXT listener where
they log in as their own SCRAM user (``inter_broker.sasl_*``). A confluent-kafka
transactional producer commits and aborts; a read_committed consumer sees exactly the committed
records, so every marker reached its partition. Before the inter-broker client, markers went in
plain TCP and were refused: the commit never completed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import BrokerCluster, _create_bucket
from harness.s3 import S3Endpoint, unique_bucket
from harness.tls import make_pki
from integration.test_proxy_security import _cli

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import topics
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, free_port
from kafscale.broker.metadata.etcd import Etcd

pytestmark = pytest.mark.integration

BROKER_PRINCIPAL = "User:CN=localhost"  # the subject of the brokers' certificate
BROKER_USER, BROKER_PW = "kafscale-broker", "broker-secret"  # the brokers' SCRAM user (SASL)
PARTITIONS = 4


@dataclass
class SecuredPair:
    brokers: list[BrokerProcess]
    topic: str
    txn_prefix: str

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)


def _make_topic(etcd_url: str, cluster: str, name: str) -> None:
    async def run() -> None:
        etcd = await Etcd.connect([etcd_url], timeout_s=5)
        try:
            await topics.create_topic(etcd, cluster, name, PARTITIONS, {})
        finally:
            await etcd.close()

    asyncio.run(run())


@pytest.fixture(scope="module", params=["mtls", "sasl"])
def secured_pair(
    request: pytest.FixtureRequest,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SecuredPair]:
    workdir = tmp_path_factory.mktemp(f"txn-security-{request.param}")
    pki = make_pki(workdir / "pki")
    bucket = unique_bucket("tsec")
    _create_bucket(s3_server, bucket)
    name = f"tsec-{uuid.uuid4().hex[:8]}"
    etcd_url = etcd_server.client_url
    cluster = BrokerCluster(etcd_url, s3_server, bucket, name, workdir)
    topic, txn_prefix, group = f"t-{uuid.uuid4().hex[:8]}", "app-", "readers-"
    _make_topic(etcd_url, name, topic)
    for kind, resource in (
        ("--topic", topic),
        ("--group", group),
        ("--transactional-id", txn_prefix),
    ):
        _cli(
            etcd_url,
            name,
            "acls",
            "add",
            kind,
            resource,
            "--prefixed",
            "--principal",
            "User:ANONYMOUS",
            "--operation",
            "ALL",
        )
    security: dict[str, str]
    if request.param == "mtls":
        security = {
            "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "INTERNAL:SSL,CLIENTS:PLAINTEXT",
            "KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES": "INTERNAL:required",
            "KAFSCALE_TLS__CERT_FILE": str(pki.server.cert),
            "KAFSCALE_TLS__KEY_FILE": str(pki.server.key),
            "KAFSCALE_TLS__CA_FILE": str(pki.ca.cert_path),
            "KAFSCALE_AUTHORIZER__SUPER_USERS": f'["{BROKER_PRINCIPAL}"]',
        }
    else:  # SASL: the brokers log in to each other as their own SCRAM user
        _cli(etcd_url, name, "users", "create", BROKER_USER, "--password-stdin", stdin=BROKER_PW)
        security = {
            "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "INTERNAL:SASL_PLAINTEXT,CLIENTS:PLAINTEXT",
            "KAFSCALE_INTER_BROKER__SASL_USERNAME": BROKER_USER,
            "KAFSCALE_INTER_BROKER__SASL_PASSWORD": BROKER_PW,
            "KAFSCALE_AUTHORIZER__SUPER_USERS": f'["User:{BROKER_USER}"]',
        }
    try:
        for index in range(2):
            internal, clients, admin = free_port(), free_port(), free_port()
            broker = BrokerProcess(
                env=cluster.env(
                    clients,
                    admin,
                    KAFSCALE_LISTENERS=f"INTERNAL://127.0.0.1:{internal},"
                    f"CLIENTS://127.0.0.1:{clients}",
                    KAFSCALE_INTERNAL_LISTENER_NAME="INTERNAL",
                    KAFSCALE_AUTHORIZER__ENABLED="true",
                    KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS="200",
                    **security,
                ),
                log_path=workdir / f"broker-{index}.log",
                port=clients,
                admin_port=admin,
            )
            cluster.brokers.append(broker)
            broker.start()
        yield SecuredPair(cluster.brokers, topic, txn_prefix)
    finally:
        cluster.stop_all()


def _read_committed(bootstrap: str, topic: str, expect: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"readers-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: list[tuple[int, bytes]] = []
    deadline, quiet_until = time.monotonic() + 30, None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                if quiet_until is not None and time.monotonic() > quiet_until:
                    break
                continue
            if message.error() is None:
                seen.append((message.partition(), message.value()))
            if len(seen) >= expect and quiet_until is None:
                quiet_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return seen


def test_a_transaction_commits_over_an_mtls_internal_listener(secured_pair: SecuredPair) -> None:
    bootstrap = secured_pair.bootstrap
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{secured_pair.txn_prefix}{uuid.uuid4().hex[:6]}",
            "transaction.timeout.ms": 30_000,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(30)
    expected: list[tuple[int, bytes]] = []
    for round_ in range(4):
        producer.begin_transaction()
        values = [b"r%d-%d" % (round_, i) for i in range(12)]
        for i, value in enumerate(values):
            producer.produce(secured_pair.topic, value, partition=i % PARTITIONS)
        if round_ % 2 == 0:
            producer.commit_transaction(30)  # returns once every partition has its marker
            expected.extend((i % PARTITIONS, v) for i, v in enumerate(values))
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    seen = _read_committed(bootstrap, secured_pair.topic, len(expected))
    for partition in range(PARTITIONS):
        assert [v for p, v in seen if p == partition] == [v for p, v in expected if p == partition]
