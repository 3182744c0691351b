"""A chain of consumer groups under churn, driven by librdkafka (confluent-kafka): the workload that
showed members dropped mid-rebalance and partitions processed twice.

Three stages, each a consumer group of `workers` members reading topic i and producing every
record, key and value unchanged, into topic i+1 (idempotent, snappy). Each member lives a random
few seconds, then closes gracefully: its revoke callback flushes what it produced and commits
what it processed (synchronously), and it leaves; a new member takes its place at once. So
members join and leave all the time while records flow, as in rolling restarts and autoscaling.
What the last topic holds must then be every input record exactly once, each key's records in
their input order. A rebalance that hands a partition to a new owner while the old one still
processes it, or drops a member whose work is not committed, shows up as duplicates.
"""

from __future__ import annotations

import collections
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e import java_build

STAGES = 3


@dataclass
class ChurnResult:
    records: int
    out: int
    duplicates: int
    missing: int
    keys_out_of_order: int
    seconds: float
    members_started: int
    #: what the clients reported (error callbacks, failed commits, lost partitions), by kind
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    #: when records are missing, where, read once every member has stopped: per stage, records its
    #: group committed as processed that the next topic does not hold (lost), records its topic
    #: holds beyond its group's committed offsets (unprocessed), and input records the next topic
    #: does not hold (absent; those of the last stage that are not lost nor unprocessed arrived
    #: after the reader stopped)
    stages: list[dict[str, int]] = field(default_factory=list)


def close_consumer(c: Consumer, timeout_s: float = 10.0) -> None:
    """Leave the group, then close: unsubscribe (the revoke callback runs, committing, while the
    group still serves it), let the consumer give its partitions up, then close it. Closing with
    partitions still assigned runs the revoke callback during close, where librdkafka can wait
    forever for the rebalance protocol while the callback holds the GIL
    (confluentinc/librdkafka#4041): the whole process hangs. Records returned meanwhile are left
    unprocessed (their offsets are not committed: the next owner reads them)."""
    c.unsubscribe()
    deadline = time.monotonic() + timeout_s
    while c.assignment() and time.monotonic() < deadline:
        c.consume(100, timeout=0.1)
    c.close()


def _producer(bootstrap: str, errors: collections.Counter[str] | None = None) -> Producer:
    """An idempotent producer; a record it fails to deliver is counted in `errors` ("delivery CODE")."""

    def delivered(err, _msg) -> None:
        if err is not None and errors is not None:
            errors.update([f"delivery {err.name()}"])

    return Producer(
        {
            "on_delivery": delivered,
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "compression.type": "snappy",
            "partitioner": "murmur2_random",  # Java's: a key stays on its partition in every topic
            "linger.ms": 5,
            "log_level": 3,
        }
    )


def run_chain(
    bootstrap: str,
    *,
    strategy: str,
    static: bool = False,
    protocol: str = "classic",
    records: int = 30_000,
    partitions: int = 6,
    workers: int = 3,
    lifetime_s: tuple[float, float] = (1.0, 3.0),
    timeout_s: float = 120.0,
    client: str = "librdkafka",
    midway: Callable[[], None] | None = None,
) -> ChurnResult:
    """Run the chained workload to completion (or `timeout_s`); what the last topic holds.
    `protocol` "consumer": Kafka 4's consumer protocol (KIP-848; `strategy` names the server's
    assignor, `group.remote.assignor`). `client` "java": the members are Kafka's Java client
    (java_churn/Churn.java, one JVM); "go": franz-go's (go_clients' `franzchurn`, one process);
    the topics, the input and the check are the same. `midway`: called once when half the records
    have reached the last topic (to kill a gateway under load)."""
    tag = uuid.uuid4().hex[:8]
    topics = [f"churn-{tag}-{i}" for i in range(STAGES + 1)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        f.result(60)
    p = _producer(bootstrap)
    for i in range(records):
        key = f"k{i % 500}"
        p.produce(topics[0], key=key.encode(), value=f"{key}:{i}".encode())
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    errors: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    started = [0]

    def member(stage: int, slot: int) -> None:
        src, dst = topics[stage], topics[stage + 1]
        conf = {
            "bootstrap.servers": bootstrap,
            "group.id": f"churn-{tag}-{stage}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
            "error_cb": lambda e: errors.update([f"error {e.name()}"]),
        }
        if protocol == "consumer":  # the session and heartbeats are the server's
            conf |= {"group.protocol": "consumer", "group.remote.assignor": strategy}
        else:
            conf |= {
                "partition.assignment.strategy": strategy,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        if static:
            conf["group.instance.id"] = f"{tag}-{stage}-{slot}"
        out = _producer(bootstrap, errors)
        processed: dict[int, int] = {}  # partition -> next offset to commit
        c = Consumer(conf)
        started[0] += 1

        def commit(parts: list[TopicPartition], drop: bool) -> None:
            out.flush(30)  # what was produced is acked before its input is committed
            offsets = [
                TopicPartition(src, tp.partition, processed[tp.partition]) for tp in parts if tp.partition in processed
            ]
            if offsets:
                try:
                    c.commit(offsets=offsets, asynchronous=False)
                except KafkaException as exc:
                    errors.update([f"commit {exc.args[0].name()}"])
            if drop:
                for tp in parts:
                    processed.pop(tp.partition, None)

        def revoked(_: Consumer, parts: list[TopicPartition]) -> None:
            commit(parts, True)

        def lost(_: Consumer, parts: list[TopicPartition]) -> None:
            errors.update(["partitions lost"])
            for tp in parts:
                processed.pop(tp.partition, None)

        c.subscribe([src], on_revoke=revoked, on_lost=lost)
        until = time.monotonic() + random.uniform(*lifetime_s)
        last_commit = time.monotonic()
        while time.monotonic() < until and not stop.is_set():
            for m in c.consume(200, timeout=0.1):
                if m.error() is not None:
                    errors.update([f"message {m.error().name()}"])
                    continue
                out.produce(dst, key=m.key(), value=m.value())
                processed[m.partition()] = m.offset() + 1
            out.poll(0)
            if time.monotonic() - last_commit > 1.0:
                commit(c.assignment(), False)
                last_commit = time.monotonic()
        commit(c.assignment(), False)
        close_consumer(c)  # revokes (committing) and leaves the group
        out.flush(30)

    def slot(stage: int, n: int) -> None:
        while not stop.is_set():
            member(stage, n)

    threads = [threading.Thread(target=slot, args=(s, n), daemon=True) for s in range(STAGES) for n in range(workers)]
    t0 = time.monotonic()
    process = None
    if client in ("java", "go"):
        process = _member_process(client, bootstrap, tag, workers, protocol=protocol, strategy=strategy, static=static)
    else:
        for t in threads:
            t.start()
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{tag}", "log_level": 0})
    reader.assign([TopicPartition(topics[-1], q, 0) for q in range(partitions)])
    got: list[tuple[int, int, bytes]] = []
    distinct: set[bytes] = set()  # duplicates do not count towards the end: every record must arrive

    def read(seconds: float) -> None:
        for m in reader.consume(1000, timeout=seconds):
            if m.error() is None:
                got.append((m.partition(), m.offset(), m.value()))
                distinct.add(m.value())

    deadline = t0 + timeout_s
    while len(distinct) < records and time.monotonic() < deadline:
        read(0.5)
        if midway is not None and len(distinct) >= records // 2:
            midway()
            midway = None
    settle = time.monotonic() + 3  # duplicates arrive after the last new record
    while time.monotonic() < settle:
        read(0.5)
    seconds = time.monotonic() - t0
    stop.set()
    if process is not None:
        started[0] = _stopped(process, errors)
    for t in threads:
        if t.is_alive():
            t.join(60)
    reader.close()
    counts = collections.Counter(v for _, _, v in got)
    stages = _stages(bootstrap, topics, partitions) if len(counts) < records else []
    by_key: dict[bytes, list[int]] = collections.defaultdict(list)
    for _, _, v in sorted(got):  # offset order within each partition (a key stays on one)
        key, _, n = v.partition(b":")
        by_key[key].append(int(n))
    return ChurnResult(
        records=records,
        out=len(got),
        duplicates=sum(n - 1 for n in counts.values()),
        missing=records - len(counts),
        keys_out_of_order=sum(1 for ns in by_key.values() if ns != sorted(ns)),
        seconds=seconds,
        members_started=started[0],
        errors=errors,
        stages=stages,
    )


def _stages(bootstrap: str, topics: list[str], partitions: int) -> list[dict[str, int]]:
    """Where the records missing from the last topic are (ChurnResult.stages)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}", "log_level": 0})
    try:
        contents = []  # per topic: (partition, offset, value) of every record
        for topic in topics:
            ends = {q: reader.get_watermark_offsets(TopicPartition(topic, q), timeout=30)[1] for q in range(partitions)}
            reader.assign([TopicPartition(topic, q, 0) for q in range(partitions) if ends[q] > 0])
            rows: list[tuple[int, int, bytes]] = []
            while len(rows) < sum(ends.values()):
                batch = reader.consume(1000, timeout=2)
                if not batch:
                    break
                rows += [(m.partition(), m.offset(), m.value()) for m in batch if m.error() is None]
            contents.append(rows)
        out = []
        for stage in range(len(topics) - 1):
            group = Consumer({"bootstrap.servers": bootstrap, "group.id": topics[stage], "log_level": 0})
            committed = {
                tp.partition: tp.offset
                for tp in group.committed([TopicPartition(topics[stage], q) for q in range(partitions)], timeout=30)
            }
            group.close()
            forwarded = {v for _, _, v in contents[stage + 1]}
            inputs = {v for _, _, v in contents[0]}
            done = [v for q, o, v in contents[stage] if o < committed.get(q, -1)]
            out.append(
                {
                    "lost": sum(1 for v in set(done) if v not in forwarded),
                    "unprocessed": sum(1 for q, o, _ in contents[stage] if o >= max(committed.get(q, -1), 0)),
                    "absent": len(inputs - forwarded),
                }
            )
        return out
    finally:
        reader.close()


JAVA_SOURCE = Path(__file__).with_name("java_churn") / "Churn.java"


def _member_process(
    client: str, bootstrap: str, tag: str, workers: int, *, protocol: str, strategy: str, static: bool
) -> subprocess.Popen[str]:
    """The members of every stage in one process of `client` (java, go), until its stdin closes."""
    args = [bootstrap, tag, str(STAGES), str(workers), protocol, strategy, str(static).lower()]
    if client == "java":
        cmd = java_build.command(JAVA_SOURCE, *args)
    else:
        from tests.e2e import go_kafka_clients

        cmd = [str(go_kafka_clients.build()), bootstrap, "franzchurn", *args[1:]]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _stopped(proc: subprocess.Popen[str], errors: collections.Counter[str]) -> int:
    """Close the members' stdin (they stop and leave), read their summary; the members started."""
    out, _ = proc.communicate(input="", timeout=120)
    fields = dict(item.split("=", 1) for item in out.split())
    for kind, n in fields.items():
        if kind != "started":
            errors[kind.replace("_", " ")] += int(n)
    return int(fields.get("started", 0))
