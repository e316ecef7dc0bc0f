"""KafScaleUser on the real API server (1.20.2) with a real etcd, the operator as the chart's
ServiceAccount: its password Secret, its SCRAM credential and its ACLs, checked with the
broker's own stores (what a broker reads when a client logs in or asks for a topic)."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from harness.brokers import new_cluster
from harness.cluster_specs import external_etcd
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    USERS,
    InstalledChart,
    cluster_manifest,
    condition_of,
    operator_settings,
    settle,
)
from harness.kube_apiserver import ApiError, KubeCluster
from harness.ports import free_ports
from harness.s3 import S3Endpoint

from kafscale.broker.authz.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from kafscale.broker.authz.store import create_bindings, stored_bindings
from kafscale.broker.metadata import keys, topics
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.security.credentials import CredentialStore
from kafscale.broker.security.scram import ScramMechanism, check_password

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]

SHA512, SHA256 = ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256


def user_manifest(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafScaleUser",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def create_cluster(kube: KubeCluster, ns: str, etcd_server: EmbeddedEtcd) -> str:
    spec = external_etcd(etcd_server.client_url)
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    return f"{ns}.demo"  # the cluster's name in etcd


def secret_data(kube: KubeCluster, ns: str, name: str) -> dict[str, str] | None:
    secret = kube.get(f"/api/v1/namespaces/{ns}/secrets/{name}")
    if secret is None:
        return None
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def ready(kube: KubeCluster, path: str) -> tuple[str, str, str] | None:
    return condition_of(kube.get(path), "Ready")


async def acls_of(etcd: Etcd, cluster: str, principal: str) -> set[AclBinding]:
    return {b for b in (await stored_bindings(etcd, cluster)).values() if b.principal == principal}


def topic_acl(name: str, op: Operation, principal: str = "User:alice") -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC, name, PatternType.LITERAL, principal, "*", op, Permission.ALLOW
    )


async def test_user_secret_credential_acls_converge_and_go_with_the_resource(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    cluster = create_cluster(kube, ns, etcd_server)
    # Bindings that exist before: one of alice's own that the spec does not ask for (removed),
    # one of another principal (never touched).
    stale = topic_acl("legacy", Operation.WRITE)
    bobs = topic_acl("orders", Operation.READ, principal="User:bob")
    await create_bindings(etcd, cluster, [stale, bobs])

    spec = {
        "cluster": "demo",
        "authentication": {"type": "scram-sha-512"},
        "authorization": {
            "acls": [
                {"resource": {"type": "topic", "name": "orders"}, "operations": ["Read", "Write"]},
                {
                    "resource": {"type": "group", "name": "orders-", "patternType": "prefix"},
                    "operations": ["Read"],
                },
                {
                    "resource": {"type": "cluster"},
                    "operations": ["IdempotentWrite"],
                    "type": "deny",
                },
            ]
        },
    }
    path = f"{USERS.format(ns=ns)}/alice"
    uid = kube.create(USERS.format(ns=ns), user_manifest("alice", ns, spec))["metadata"]["uid"]

    found = await settle(
        lambda: (ready(kube, path) or ("",))[0] == "True" and ready(kube, path), what="Ready"
    )
    assert found[1] == "UserReady", found
    status = kube.get(path)["status"]
    assert (status["username"], status["secret"], status["phase"]) == ("alice", "alice", "Ready")
    assert status["acls"] == 4 and status["observedGeneration"] == 1

    # The Secret: Strimzi's keys, owned by the KafScaleUser.
    secret = kube.get(f"/api/v1/namespaces/{ns}/secrets/alice")
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("KafScaleUser", "alice", uid)
    data = secret_data(kube, ns, "alice")
    assert data is not None
    password = data["password"]
    assert len(password) >= 24
    assert f'username="alice" password="{password}"' in data["sasl.jaas.config"]

    # The credential in etcd verifies against the Secret's password (the broker's own check).
    store = CredentialStore(etcd, cluster)
    credential = await store.get("alice", SHA512)
    assert credential is not None and check_password(password.encode(), credential, SHA512)
    assert not check_password(b"not-the-password", credential, SHA512)
    assert await store.get("alice", SHA256) is None

    # The ACLs in etcd are exactly the spec's; bob's binding is untouched.
    assert await acls_of(etcd, cluster, "User:alice") == {
        topic_acl("orders", Operation.READ),
        topic_acl("orders", Operation.WRITE),
        AclBinding(
            ResourceType.GROUP,
            "orders-",
            PatternType.PREFIXED,
            "User:alice",
            "*",
            Operation.READ,
            Permission.ALLOW,
        ),
        AclBinding(
            ResourceType.CLUSTER,
            "kafka-cluster",
            PatternType.LITERAL,
            "User:alice",
            "*",
            Operation.IDEMPOTENT_WRITE,
            Permission.DENY,
        ),
    }
    assert await acls_of(etcd, cluster, "User:bob") == {bobs}

    # Editing the ACLs converges (Write dropped, a topic added); switching the mechanism keeps
    # the password and moves the credential.
    kube.merge_patch(
        path,
        {
            "spec": {
                "authentication": {"type": "scram-sha-256"},
                "authorization": {
                    "acls": [
                        {
                            "resource": {"type": "topic", "name": "orders"},
                            "operations": ["Read", "Describe"],
                        },
                        {"resource": {"type": "topic", "name": "audit"}, "operations": ["Read"]},
                    ]
                },
            }
        },
    )
    wanted = {
        topic_acl("orders", Operation.READ),
        topic_acl("orders", Operation.DESCRIBE),
        topic_acl("audit", Operation.READ),
    }

    async def converged() -> bool:
        return await acls_of(etcd, cluster, "User:alice") == wanted

    await settle(converged, what="the edited ACLs in etcd")
    await settle(lambda: kube.get(path)["status"].get("observedGeneration") == 2, what="gen 2")
    assert await store.get("alice", SHA512) is None
    sha256 = await store.get("alice", SHA256)
    assert sha256 is not None and check_password(password.encode(), sha256, SHA256)
    assert secret_data(kube, ns, "alice") == data  # the password is generated once
    assert kube.get(path)["status"]["acls"] == 3

    # Deleting the resource: the finalizer removes credential and ACLs, the GC the Secret.
    kube.delete(path)
    await settle(lambda: kube.get(path) is None, what="the KafScaleUser gone")

    async def credentials_gone() -> bool:
        return await store.list() == {}

    await settle(credentials_gone, what="no credentials left")
    assert await acls_of(etcd, cluster, "User:alice") == set()
    assert await acls_of(etcd, cluster, "User:bob") == {bobs}
    await settle(lambda: secret_data(kube, ns, "alice") is None, what="the Secret collected")


async def test_conflicts_bad_acls_and_a_missing_cluster_are_reported(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    users = USERS.format(ns=ns)

    # The server refuses what the schema can tell is wrong.
    bad = {"cluster": "demo", "authentication": {"type": "plain"}}
    with pytest.raises(ApiError) as refused:
        kube.create(users, user_manifest("x", ns, bad), dry_run=True)
    assert refused.value.status == 422

    # No cluster yet: not ready, and why; it becomes ready when the cluster appears.
    kube.create(users, user_manifest("carol", ns, {"cluster": "demo"}))
    waiting = await settle(lambda: ready(kube, f"{users}/carol"), what="carol's condition")
    assert waiting[:2] == ("False", "ClusterNotFound")
    cluster = create_cluster(kube, ns, etcd_server)
    await settle(lambda: (ready(kube, f"{users}/carol") or ("",))[0] == "True", what="carol ready")

    # A Secret of the user's name that someone else made is never taken over.
    kube.create(
        f"/api/v1/namespaces/{ns}/secrets",
        {"metadata": {"name": "dave"}, "data": {"password": base64.b64encode(b"mine").decode()}},
    )
    kube.create(users, user_manifest("dave", ns, {"cluster": "demo"}))
    conflict = await settle(lambda: ready(kube, f"{users}/dave"), what="dave's condition")
    assert conflict[:2] == ("False", "SecretConflict")
    assert secret_data(kube, ns, "dave") == {"password": "mine"}
    assert await CredentialStore(etcd, cluster).get("dave", SHA512) is None

    # An ACL Kafka would refuse (a prefixed '*') is reported, and nothing is written.
    prefixed_wildcard = {
        "cluster": "demo",
        "authorization": {
            "acls": [
                {
                    "resource": {"type": "topic", "name": "*", "patternType": "prefix"},
                    "operations": ["Read"],
                }
            ]
        },
    }
    kube.create(users, user_manifest("erin", ns, prefixed_wildcard))
    invalid = await settle(lambda: ready(kube, f"{users}/erin"), what="erin's condition")
    assert invalid[:2] == ("False", "InvalidAcl")
    assert await acls_of(etcd, cluster, "User:erin") == set()
    assert kube.get(f"/api/v1/namespaces/{ns}/secrets/erin") is None


# --- end to end: a broker on a SASL listener, clients with the Secret's password ------------------


def sasl_config(bootstrap: str, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "message.timeout.ms": 20_000,
    }


def produce_one(config: dict[str, Any], topic: str, value: bytes) -> KafkaError | None:
    outcome: list[KafkaError | None] = []
    producer = Producer(config)
    try:
        producer.produce(topic, value, on_delivery=lambda err, _msg: outcome.append(err))
    except KafkaException as exc:  # librdkafka refuses at once while its metadata says so
        return exc.args[0]  # type: ignore[no-any-return]
    producer.flush(30)
    assert outcome, "no delivery report"
    return outcome[0]


def consume_one(config: dict[str, Any], group: str, topic: str) -> bytes | None:
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            return message.value()  # type: ignore[no-any-return]
    finally:
        consumer.close()
    return None


def login_errors(config: dict[str, Any]) -> list[int]:
    """Error codes librdkafka reports while trying to log in with ``config``."""
    errors: list[int] = []
    producer = Producer({**config, "error_cb": lambda e: errors.append(e.code())})
    producer.produce("orders", value=b"x")
    deadline = time.monotonic() + 20
    while KafkaError._AUTHENTICATION not in errors and time.monotonic() < deadline:
        producer.poll(0.2)
    producer.purge()
    producer.flush(1)
    return errors


async def test_a_client_logs_in_with_the_secrets_password_and_gets_what_the_acls_allow(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
    s3_server: S3Endpoint,
    tmp_path: Path,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    users = USERS.format(ns=ns)
    cluster = create_cluster(kube, ns, etcd_server)
    brokers = new_cluster(
        etcd_server.client_url,
        s3_server,
        tmp_path,
        "users",
        name=cluster,
        extra_env={"KAFSCALE_AUTHORIZER__ENABLED": "true"},
    )
    internal, sasl = free_ports(2)
    try:
        await asyncio.to_thread(
            brokers.start,
            internal,
            KAFSCALE_LISTENERS=f"INTERNAL://127.0.0.1:{internal},SASL://127.0.0.1:{sasl}",
            KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="INTERNAL:PLAINTEXT,SASL:SASL_PLAINTEXT",
        )
        await topics.create_topic(etcd, cluster, "orders", 1, {})
        acls = [
            {
                "resource": {"type": "topic", "name": "orders"},
                "operations": ["Describe", "Read", "Write"],
            },
            {
                "resource": {"type": "group", "name": "orders-", "patternType": "prefix"},
                "operations": ["Read"],
            },
        ]
        spec = {"cluster": "demo", "authorization": {"acls": acls}}
        kube.create(users, user_manifest("alice", ns, spec))
        kube.create(users, user_manifest("bob", ns, {"cluster": "demo"}))
        for name in ("alice", "bob"):
            await settle(
                lambda name=name: (ready(kube, f"{users}/{name}") or ("",))[0] == "True",
                what=f"{name} ready",
            )
        alice = secret_data(kube, ns, "alice")
        bob = secret_data(kube, ns, "bob")
        assert alice is not None and bob is not None
        endpoint = f"127.0.0.1:{sasl}"
        alice_config = sasl_config(endpoint, "alice", alice["password"])

        # alice, with the Secret's password and her ACLs: produce and consume in her group.
        assert await asyncio.to_thread(produce_one, alice_config, "orders", b"hello") is None
        consumed = await asyncio.to_thread(consume_one, alice_config, "orders-app", "orders")
        assert consumed == b"hello"

        # bob logs in (his own Secret) but has no ACLs: Kafka's authorization error.
        bob_config = sasl_config(endpoint, "bob", bob["password"])
        refused = await asyncio.to_thread(produce_one, bob_config, "orders", b"no")
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

        # A wrong password is refused; so is alice once her KafScaleUser is deleted.
        wrong = sasl_config(endpoint, "alice", "not-" + alice["password"])
        assert KafkaError._AUTHENTICATION in await asyncio.to_thread(login_errors, wrong)
        kube.delete(f"{users}/alice")
        await settle(lambda: kube.get(f"{users}/alice") is None, what="alice deleted")
        assert KafkaError._AUTHENTICATION in await asyncio.to_thread(login_errors, alice_config)
    finally:
        await asyncio.to_thread(brokers.stop_all)


async def test_resync_puts_back_what_was_removed_behind_the_operators_back(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    """A binding or credential deleted with ``kafscale acls``/``users`` (or the admin API) comes
    back on the next resync; a deleted Secret means a new password (rotation)."""
    ns, kube = kube_namespace, kube_cluster
    users = USERS.format(ns=ns)
    cluster = create_cluster(kube, ns, etcd_server)
    store = CredentialStore(etcd, cluster)
    spec = {
        "cluster": "demo",
        "authorization": {
            "acls": [{"resource": {"type": "topic", "name": "orders"}, "operations": ["Read"]}]
        },
    }
    async with operator_thread(operator_settings(kafscale_chart, resync_interval_s=1.0)):
        kube.create(users, user_manifest("alice", ns, spec))
        await settle(lambda: (ready(kube, f"{users}/alice") or ("",))[0] == "True", what="ready")
        first = secret_data(kube, ns, "alice")
        assert first is not None

        wanted = {topic_acl("orders", Operation.READ)}
        await etcd.delete_prefix(keys.acls_prefix(cluster))
        await store.delete("alice", SHA512)

        async def restored() -> bool:
            credential = await store.get("alice", SHA512)
            return (
                credential is not None
                and check_password(first["password"].encode(), credential, SHA512)
                and await acls_of(etcd, cluster, "User:alice") == wanted
            )

        await settle(restored, what="credential and ACL restored")

        kube.delete(f"/api/v1/namespaces/{ns}/secrets/alice")

        async def rotated() -> bool:
            now = secret_data(kube, ns, "alice")
            if now is None or now["password"] == first["password"]:
                return False
            credential = await store.get("alice", SHA512)
            return credential is not None and check_password(
                now["password"].encode(), credential, SHA512
            )

        await settle(rotated, what="a new password in a new Secret and in etcd")


async def test_a_users_own_password_secret_changed_or_deleted_is_acted_on_at_once(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    """``valueFrom.secretKeyRef``: the user changes the password in their Secret. Before, the
    credential in etcd kept the old one until the next resync (5 min by default; the status
    and resync timers run hourly here), so clients with the new password were refused. Now
    the Secret watch runs the user's round at once: the new password verifies, the old one
    no longer. Deleted, the user turns ``Ready=False``/``PasswordSecretNotFound`` at once."""
    ns, kube = kube_namespace, kube_cluster
    cluster = create_cluster(kube, ns, etcd_server)
    store = CredentialStore(etcd, cluster)
    secrets = f"/api/v1/namespaces/{ns}/secrets"
    encoded = base64.b64encode(b"first password").decode()
    kube.create(secrets, {"metadata": {"name": "alice-login"}, "data": {"pw": encoded}})
    ref = {"secretKeyRef": {"name": "alice-login", "key": "pw"}}
    spec = {
        "cluster": "demo",
        "authentication": {"type": "scram-sha-512", "password": {"valueFrom": ref}},
    }
    path = f"{USERS.format(ns=ns)}/alice"
    slow = operator_settings(kafscale_chart, status_interval_s=3600.0, resync_interval_s=3600.0)
    async with operator_thread(slow):
        kube.create(USERS.format(ns=ns), user_manifest("alice", ns, spec))
        await settle(lambda: (ready(kube, path) or ("",))[0] == "True", what="Ready")

        encoded = base64.b64encode(b"second password").decode()
        kube.merge_patch(f"{secrets}/alice-login", {"data": {"pw": encoded}})

        async def follows() -> bool:
            credential = await store.get("alice", SHA512)
            return credential is not None and check_password(b"second password", credential, SHA512)

        await settle(follows, what="the credential of the new password", timeout_s=60.0)
        credential = await store.get("alice", SHA512)
        assert credential is not None
        assert not check_password(b"first password", credential, SHA512)

        kube.delete(f"{secrets}/alice-login")
        gone = await settle(
            lambda: (
                (ready(kube, path) or ("", ""))[1] == "PasswordSecretNotFound" and ready(kube, path)
            ),
            what="PasswordSecretNotFound",
            timeout_s=60.0,
        )
        assert gone[0] == "False" and "alice-login" in gone[2]
