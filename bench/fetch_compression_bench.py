"""What Kafka's Fetch costs with compression, beside Apache Kafka in one run: bytes on the wire
per record, and the server's CPU per record, for a topic whose compression.type is none, lz4 or
zstd, and for one whose compression.type is `producer` (the default) written by an lz4 producer.

    python -m bench.fetch_compression_bench            # 50,000 records of 1 KB
    python -m bench.fetch_compression_bench --quick    # 10,000

Each topic gets the same JSON-like 1 KB values, produced uncompressed (lz4 for the `producer`
topic) through each system's Kafka listener; then one librdkafka consumer reads the topic from the start (in batches, as a tailing
application with a backlog does). Measured during the read only:
- wire bytes per record: librdkafka's own count of bytes received from the brokers;
- server CPU per record: the gateway's (or the Kafka broker's JVM) user + system CPU time from
  /proc, divided by the records read.
Kafka compresses once, when the records are produced (the topic's codec), and serves the stored
batches; topiclake keeps records uncompressed in the table (it compresses the parquet itself) and
compresses the batches each Fetch returns. Results: bench/results/fetch_compression_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.common import print_table, write_results
from bench.kafka_broker import KafkaBroker
from tests.e2e.server import ServerProcess

#: (the topic's compression.type, the producer's compression.type)
CASES = (("uncompressed", "none"), ("lz4", "none"), ("zstd", "none"), ("producer", "lz4"))


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def values(n: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "order_id": i,
                "customer": f"customer-{i % 977}",
                "status": ("new", "paid", "shipped", "delivered")[i % 4],
                "items": [
                    {"sku": f"SKU-{(i * 7 + k) % 5000:05d}", "qty": 1 + k % 3, "price": 9.99 + k} for k in range(8)
                ],
                "note": "lorem ipsum dolor sit amet " * 12,
            }
        ).encode()[:1024]
        for i in range(n)
    ]


def setup(bootstrap: str, topic: str, codec: str, payload: list[bytes], producer_codec: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": codec})])[topic].result(60)
    p = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20, "compression.type": producer_codec}
    )
    for v in payload:
        while True:
            try:
                p.produce(topic, value=v)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def read(bootstrap: str, topic: str, n: int, pid: int) -> dict[str, float]:
    stats: list[dict] = []
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "statistics.interval.ms": 100,
            "stats_cb": lambda s: stats.append(json.loads(s)),
        }
    )
    c.subscribe([topic])
    got = 0
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    while got < n:
        got += sum(1 for m in c.consume(1000, 1.0) if m.error() is None)
    cpu, elapsed = cpu_seconds(pid) - cpu0, time.monotonic() - t0
    c.poll(0.3)  # one more statistics report
    c.close()
    rx = max(sum(b.get("rxbytes", 0) for b in s["brokers"].values()) for s in stats)
    return {"bytes_per_record": rx / n, "cpu_us_per_record": cpu / n * 1e6, "seconds": elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 10_000 if args.quick else 50_000
    payload = values(n)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fetch-compression-bench-") as tmp:
        srv = ServerProcess(Path(tmp) / "data").start()
        try:
            with KafkaBroker(Path(tmp) / "kafka") as kafka:
                assert srv.proc is not None and kafka.proc is not None
                for codec, producer_codec in CASES:
                    setup(srv.kafka, f"t-{codec}", codec, payload, producer_codec)
                    setup(kafka.bootstrap, f"k-{codec}", codec, payload, producer_codec)
                    ours = read(srv.kafka, f"t-{codec}", n, srv.proc.pid)
                    theirs = read(kafka.bootstrap, f"k-{codec}", n, kafka.proc.pid)
                    rows.append(
                        {
                            "compression.type": codec if producer_codec == "none" else f"{codec} ({producer_codec})",
                            "topiclake_bytes_per_record": round(ours["bytes_per_record"], 1),
                            "kafka_bytes_per_record": round(theirs["bytes_per_record"], 1),
                            "bytes_ratio": round(ours["bytes_per_record"] / theirs["bytes_per_record"], 2),
                            "topiclake_cpu_us_per_record": round(ours["cpu_us_per_record"], 1),
                            "kafka_cpu_us_per_record": round(theirs["cpu_us_per_record"], 1),
                            "cpu_ratio": round(ours["cpu_us_per_record"] / max(theirs["cpu_us_per_record"], 1e-9), 2),
                        }
                    )
        finally:
            srv.stop()
    columns = list(rows[0])
    print_table(rows, columns)
    write_results("fetch_compression_bench", rows, {"records": n, "value_bytes": 1024})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
