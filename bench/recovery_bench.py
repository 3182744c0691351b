"""Recovery after kill -9, beside Apache Kafka in one run: how long a restarted gateway takes
until a client sees every acked record, against what was acked but not yet in the tables.

    python -m bench.recovery_bench            # 1, 10, 100 MB unflushed; 10 and 1,000 log topics
    python -m bench.recovery_bench --quick    # 1 and 10 MB; 10 and 100 log topics

For each case, on a fresh root (and a fresh Kafka broker beside it):
- records are produced with confluent-kafka (acks=all, 1 KB values) through the gateway's Kafka
  listener into `log` topics whose table flush is held back (lag and leases of an hour), so all of
  it is acked from the write-ahead log alone, and into Kafka;
- the gateway (and the broker) is killed with kill -9 and started again on the same root;
- "ready" is when a Kafka client's ListOffsets returns the acked end of every partition (the
  gateway's readiness, its write-ahead replay included; Kafka's log recovery);
- the restart is timed again with nothing unflushed (the restart alone), and the gateway's own
  figure for its replay (/readyz `recovery`) is reported beside it.
The topic-count cases acknowledge 10 records in each topic (all topics unflushed), and, for the
largest count, in only ten of them: recovery grows with what is unflushed, not with the topics.
Results: bench/results/recovery_bench.json, printed as markdown tables with ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.common import print_table, write_results
from bench.kafka_broker import KafkaBroker
from tests.e2e.server import ServerProcess

PARTITIONS = 4
VALUE = 1024
#: nothing reaches the table until the kill: the flush waits for half the lag, or for its leases
HELD_BACK = {
    "TOPICLAKE_WRITER__WAL_LEASE_MS": "7200000",
    "TOPICLAKE_WRITER__WAL_FLUSH_BYTES": str(2 << 30),
    "TOPICLAKE_WRITER__MAX_QUEUE_BYTES": str(4 << 30),
}
LOG_CONFIG = {"topiclake.ack.mode": "log", "topiclake.table.max.lag.ms": "3600000"}


def produce(bootstrap: str, topics: list[str], records_per_topic: int) -> dict[tuple[str, int], int]:
    """`records_per_topic` 1 KB records into each topic, acks=all; the acked end of every partition."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20})
    value = os.urandom(VALUE // 2).hex().encode()
    ends: dict[tuple[str, int], int] = {}

    def acked(err: Any, msg: Any) -> None:
        assert err is None, err
        key = (msg.topic(), msg.partition())
        ends[key] = max(ends.get(key, 0), msg.offset() + 1)

    for t in topics:
        for i in range(records_per_topic):
            while True:
                try:
                    p.produce(t, value=value, key=str(i).encode(), on_delivery=acked)
                    break
                except BufferError:
                    p.poll(0.05)
        p.poll(0)
    assert p.flush(600) == 0
    return ends


def wait_ready(bootstrap: str, ends: dict[tuple[str, int], int], timeout: float = 900) -> None:
    """Until ListOffsets answers the acked end of every partition in `ends`."""
    deadline = time.monotonic() + timeout
    c: Consumer | None = None
    pending = dict(ends)
    while pending and time.monotonic() < deadline:
        try:
            c = c or Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "log_level": 0})
            for (t, p), end in list(pending.items()):
                _, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=1)
                if high >= end:
                    del pending[(t, p)]
        except Exception:
            time.sleep(0.02)
    if c is not None:
        c.close()
    if pending:
        raise RuntimeError(f"not ready after {timeout} s: {len(pending)} partitions short")


def create_topics(srv: ServerProcess, kafka: KafkaBroker, names: list[str]) -> None:
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for name in names:
            c.post("/topics", json={"name": name, "partitions": PARTITIONS, "config": LOG_CONFIG}).raise_for_status()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for f in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names]).values():
        f.result(120)


def timed_restart_topiclake(srv: ServerProcess, ends: dict[tuple[str, int], int]) -> float:
    srv.kill9()
    t0 = time.monotonic()
    srv.start(timeout=900)
    wait_ready(srv.kafka, ends)
    return time.monotonic() - t0


def timed_restart_kafka(kafka: KafkaBroker, ends: dict[tuple[str, int], int]) -> float:
    kafka.kill9()
    t0 = time.monotonic()
    kafka.launch(wait=False)
    wait_ready(kafka.bootstrap, ends)
    return time.monotonic() - t0


def one_case(work: Path, label: str, topics: int, unflushed_topics: int, records: int) -> dict[str, Any]:
    """One root and one broker: create `topics`, ack `records` into each of the first
    `unflushed_topics`, kill -9 both and time their restarts; then again with nothing unflushed."""
    case = work / label.replace(" ", "-").replace(",", "")
    names = [f"t{i:04d}" for i in range(topics)]
    srv = ServerProcess(case / "data", env=HELD_BACK).start()  # (its Kafka port stays across restarts)
    kafka = KafkaBroker(case / "kafka").start()
    try:
        create_topics(srv, kafka, names)
        t0 = time.monotonic()
        ends = produce(srv.kafka, names[:unflushed_topics], records)
        produce_s = time.monotonic() - t0
        kafka_ends = produce(kafka.bootstrap, names[:unflushed_topics], records)
        topiclake_s = timed_restart_topiclake(srv, ends)
        recovery = httpx.get(srv.url + "/readyz", timeout=30).json()["recovery"]
        kafka_s = timed_restart_kafka(kafka, kafka_ends)
        # again, with the tables holding everything (the replay wrote it): the restart alone
        empty_s = timed_restart_topiclake(srv, ends)
        kafka_empty_s = timed_restart_kafka(kafka, kafka_ends)
    finally:
        srv.stop()
        kafka.stop()
    shutil.rmtree(case, ignore_errors=True)
    row = {
        "case": label,
        "topics": topics,
        "unflushed_topics": unflushed_topics,
        "records": records * unflushed_topics,
        "acked_mb": records * unflushed_topics * VALUE / 1e6,
        "produce_s": produce_s,
        "topiclake_ready_s": topiclake_s,
        "topiclake_restart_alone_s": empty_s,
        "replayed_records": recovery["records"],
        "replay_s": recovery["seconds"],
        "kafka_ready_s": kafka_s,
        "kafka_restart_alone_s": kafka_empty_s,
        "ratio": topiclake_s / kafka_s,
    }
    print(
        f"{label}: topiclake ready in {topiclake_s:.2f} s (restart alone {empty_s:.2f} s), "
        f"Kafka {kafka_s:.2f} s (alone {kafka_empty_s:.2f} s)",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.recovery_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    sizes_mb = (1, 10) if args.quick else (1, 10, 100)
    counts = (10, 100) if args.quick else (10, 1000)
    work = Path(tempfile.mkdtemp(prefix="topiclake-recovery-bench-", dir=os.environ.get("BENCH_TMP")))
    rows = []
    try:
        for mb in sizes_mb:
            rows.append(one_case(work, f"{mb} MB unflushed, 1 topic", 1, 1, mb * 1000))
        for n in counts:
            rows.append(one_case(work, f"{n} log topics, all unflushed", n, n, 10))
        rows.append(one_case(work, f"{counts[-1]} log topics, 10 unflushed", counts[-1], 10, 10))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n## Ready after kill -9 (seconds; ratio: topiclake / Kafka)\n")
    print_table(
        rows,
        [
            "case",
            "acked_mb",
            "topiclake_ready_s",
            "topiclake_restart_alone_s",
            "replay_s",
            "kafka_ready_s",
            "kafka_restart_alone_s",
            "ratio",
        ],
    )
    write_results("recovery_bench", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
