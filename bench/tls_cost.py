"""What TLS and SASL cost: produce throughput and produce latency over SASL_SSL vs PLAINTEXT.

One broker (etcd, moto's S3 server) with two listeners, PLAINTEXT and SASL_SSL (SCRAM-SHA-512,
a certificate made at start with ``cryptography``), measured in the same run, alternating
between the two so that a noisy neighbour on the machine hits both alike:

a. produce throughput with confluent-kafka (1 KiB records, acks=all, linger.ms=5, 3 partitions)
   as fast as the client pushes, ``--records`` per round, ``--rounds`` rounds per listener after
   a warm-up round on each (not scored); the best round of each counts (least disturbed), the
   median is shown too, and the broker's CPU time per MiB produced (robust to a busy machine:
   what TLS costs the broker, whoever else runs);
b. produce latency (produce() to delivery callback) at a fixed 1000 records/s, p50 and p99.

Prints a table and the target of issue 25 (TLS costs at most 25 % of throughput) with
PASS/MISS. Run from the repository root::

    .venv/bin/python bench/tls_cost.py                  # ~1-2 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _cluster import Stack, cpu_seconds, create_topic, percentile, verdict
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kafscale.broker.child_process import KAFSCALE, BrokerProcess, child_env, free_port_run

USER, PASSWORD = "bench", "bench-password"
RECORD = b"x" * 1024
TARGET_COST = 0.25


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA cert, server cert, server key) for localhost, valid for a day."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def start_broker(stack: Stack) -> tuple[BrokerProcess, dict[str, Any], dict[str, Any]]:
    """The broker, and the client configs of its PLAINTEXT and SASL_SSL listeners."""
    ca, cert, key = make_certificates(stack.workdir)
    users = [KAFSCALE, "users", "--etcd-endpoints", stack.etcd_url, "--cluster", stack.cluster]
    created = subprocess.run(
        [*users, "create", USER, "--password-stdin", "--mechanism", "SCRAM-SHA-512"],
        input=PASSWORD + "\n",
        env=child_env(os.environ),  # without Hypothesis, as the brokers start
        capture_output=True,
        text=True,
        check=False,
    )
    if created.returncode != 0:
        raise RuntimeError(created.stderr)
    plain_port, secure_port, admin_port = free_port_run(), free_port_run(), free_port_run()
    env = stack.env(plain_port, admin_port)
    env.update(
        KAFSCALE_LISTENERS=f"INTERNAL://127.0.0.1:{plain_port},SECURE://127.0.0.1:{secure_port}",
        KAFSCALE_ADVERTISED_LISTENERS=f"SECURE://localhost:{secure_port}",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="INTERNAL:PLAINTEXT,SECURE:SASL_SSL",
        KAFSCALE_TLS__CERT_FILE=str(cert),
        KAFSCALE_TLS__KEY_FILE=str(key),
    )
    broker = BrokerProcess(
        env=env, log_path=stack.workdir / "broker.log", port=plain_port, admin_port=admin_port
    )
    stack.brokers.append(broker)
    broker.start()
    plain = {"bootstrap.servers": f"127.0.0.1:{plain_port}"}
    secure = {
        "bootstrap.servers": f"localhost:{secure_port}",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": USER,
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(ca),
    }
    return broker, plain, secure


def producer_config(base: dict[str, Any]) -> dict[str, Any]:
    return {
        **base,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1024 * 1024,
        "queue.buffering.max.kbytes": 64 * 1024,
        "enable.idempotence": False,
    }


def throughput(base: dict[str, Any], topic: str, records: int) -> float:
    """Records per second produced and acknowledged."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(base))
    failed = []
    producer.produce(topic, RECORD, on_delivery=lambda e, _m: e and failed.append(e))
    producer.flush(30)  # connected and authenticated before timing
    started = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, RECORD, on_delivery=lambda e, _m: e and failed.append(e))
                break
            except BufferError:
                producer.poll(0.005)
        producer.poll(0)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"{len(failed)} records failed: {failed[0]}")
    return records / elapsed


def latency(base: dict[str, Any], topic: str, rate: int, seconds: float) -> list[float]:
    """Produce-to-delivery latencies (ms) at ``rate`` records/s."""
    from confluent_kafka import Producer

    producer = Producer({**producer_config(base), "linger.ms": 0})
    producer.produce(topic, RECORD)
    producer.flush(30)
    samples: list[float] = []
    lock = threading.Lock()

    def delivered(sent: float) -> Any:
        def callback(error: Any, _message: Any) -> None:
            if error is None:
                with lock:
                    samples.append((time.perf_counter() - sent) * 1000)

        return callback

    interval = 1 / rate
    next_at = time.perf_counter()
    end = next_at + seconds
    while next_at < end:
        now = time.perf_counter()
        if now < next_at:
            producer.poll(min(next_at - now, 0.001))
            continue
        producer.produce(topic, RECORD, on_delivery=delivered(time.perf_counter()))
        next_at += interval
    producer.flush(60)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=30_000, help="records per round")
    parser.add_argument("--rounds", type=int, default=3, help="scored rounds per listener")
    parser.add_argument("--latency-s", type=float, default=8.0, help="seconds per latency run")
    args = parser.parse_args()
    with Stack() as stack:
        broker, plain, secure = start_broker(stack)
        topic = f"tls-{uuid.uuid4().hex[:8]}"
        create_topic(plain["bootstrap.servers"], topic, 3)
        listeners = {"PLAINTEXT": plain, "SASL_SSL": secure}
        for base in listeners.values():  # warm-up, not scored
            throughput(base, topic, args.records // 3)
        rates: dict[str, list[float]] = {name: [] for name in listeners}
        cpu_per_mib: dict[str, list[float]] = {name: [] for name in listeners}
        mib = args.records * len(RECORD) / 2**20
        for _ in range(args.rounds):
            for name, base in listeners.items():
                cpu_before = cpu_seconds(broker.pid)
                rates[name].append(throughput(base, topic, args.records))
                cpu_per_mib[name].append((cpu_seconds(broker.pid) - cpu_before) * 1000 / mib)
        latencies = {
            name: latency(base, topic, 1000, args.latency_s) for name, base in listeners.items()
        }
    best = {name: max(values) for name, values in rates.items()}
    median = {name: statistics.median(values) for name, values in rates.items()}
    cpu = {name: statistics.median(values) for name, values in cpu_per_mib.items()}
    print(
        f"{'listener':<10} {'best rec/s':>11} {'MiB/s':>6} {'median rec/s':>13} "
        f"{'broker CPU ms/MiB':>18} {'p50 ms':>7} {'p99 ms':>7}  rounds (rec/s)"
    )
    for name in listeners:
        rounds = ", ".join(f"{r:,.0f}" for r in rates[name])
        print(
            f"{name:<10} {best[name]:>11,.0f} {best[name] * len(RECORD) / 2**20:>6.1f} "
            f"{median[name]:>13,.0f} {cpu[name]:>18.1f} {percentile(latencies[name], 50):>7.1f} "
            f"{percentile(latencies[name], 99):>7.1f}  {rounds}"
        )
    cost = 1 - best["SASL_SSL"] / best["PLAINTEXT"]
    median_cost = 1 - median["SASL_SSL"] / median["PLAINTEXT"]
    cpu_cost = cpu["SASL_SSL"] / cpu["PLAINTEXT"] - 1
    print(
        f"\nTLS+SCRAM throughput cost (best rounds): {cost:.1%} (target <= {TARGET_COST:.0%}): "
        f"{verdict(cost <= TARGET_COST)}\n"
        f"  median rounds: {median_cost:.1%}; broker CPU per MiB: {cpu_cost:+.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
