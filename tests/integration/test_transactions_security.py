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

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.ports import listener_ports
from harness.s3 import S3Endpoint
from harness.secured import (
    add_broker,
    create_user,
    kafscale_cli,
    make_topics,
    secured_cluster,
    tls_env,
)

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

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


@pytest.fixture(scope="module", params=["mtls", "sasl"])
def secured_pair(
    request: pytest.FixtureRequest,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SecuredPair]:
    workdir = tmp_path_factory.mktemp(f"txn-security-{request.param}")
    etcd_url = etcd_server.client_url
    cluster, pki = secured_cluster(etcd_url, s3_server, workdir, "tsec")
    name = cluster.cluster
    topic, txn_prefix, group = f"t-{uuid.uuid4().hex[:8]}", "app-", "readers-"
    make_topics(etcd_url, name, PARTITIONS, topic)
    for kind, resource in (
        ("--topic", topic),
        ("--group", group),
        ("--transactional-id", txn_prefix),
    ):
        kafscale_cli(
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
            **tls_env(pki),
            "KAFSCALE_AUTHORIZER__SUPER_USERS": f'["{BROKER_PRINCIPAL}"]',
        }
    else:  # SASL: the brokers log in to each other as their own SCRAM user
        create_user(etcd_url, name, BROKER_USER, BROKER_PW)
        security = {
            "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "INTERNAL:SASL_PLAINTEXT,CLIENTS:PLAINTEXT",
            "KAFSCALE_INTER_BROKER__SASL_USERNAME": BROKER_USER,
            "KAFSCALE_INTER_BROKER__SASL_PASSWORD": BROKER_PW,
            "KAFSCALE_AUTHORIZER__SUPER_USERS": f'["User:{BROKER_USER}"]',
        }
    try:
        for index in range(2):
            add_broker(
                cluster,
                listener_ports("INTERNAL", "CLIENTS"),
                "CLIENTS",
                f"broker-{index}.log",
                KAFSCALE_INTERNAL_LISTENER_NAME="INTERNAL",
                KAFSCALE_AUTHORIZER__ENABLED="true",
                KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS="200",
                **security,
            ).start()
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
