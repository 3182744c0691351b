"""Upsert tables: the upsert job's MERGE against the naive "overwrite the latest table each batch".

    python -m bench.upsert_bench            # 1,000 and 100,000 keys, 400,000 records each
    python -m bench.upsert_bench --quick    # 100,000 records each

For each key count, a fresh root and a 4-partition topic in upsert mode:
- throughput: catching up on a backlog of N records (100 B values, random keys, 5% tombstones) merged by
  `upsert_topic` in MERGEs of 100,000 records: records merged per second;
- staleness: a producer appends 1,000 records every 100 ms (10,000 records/s) for 10 s while a loop
  merges as fast as it can; for each append, the time from its ack to the MERGE commit that holds it
  (when it is visible in `<topic>_latest`): p50 / p99, and how long a round takes (p50) once the
  topic holds the backlog;
- the naive way, side by side on the same records: each round reads the whole topic, keeps the last
  record per key (pyarrow) and overwrites the latest table (delta-rs): the same two figures.
Every run's final table is checked against a model of the log (latest value per key).
Results: bench/results/upsert_bench.json.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from bench.common import percentile, print_table, write_results
from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicReader, TopicWriter, normalize_batch
from delta_log.core.partitioner import partition_for_key
from delta_log.maintenance.upsert import latest_per_key, upsert_topic

PARTITIONS = 4
MERGE_RECORDS = 100_000


def records(rng: random.Random, n: int, keys: int, topic: str) -> pa.Table:
    ks = [b"key-%d" % rng.randrange(keys) for _ in range(n)]
    vals = [None if rng.random() < 0.05 else os.urandom(50).hex().encode() for _ in range(n)]
    return normalize_batch(
        pa.table(
            {
                "key": pa.array(ks, pa.binary()),
                "value": pa.array(vals, pa.binary()),
                "partition": pa.array([partition_for_key(k, PARTITIONS) for k in ks], pa.int32()),
            }
        ),
        partitions=PARTITIONS,
        topic=topic,
        max_message_bytes=10**6,
        now_us=int(time.time() * 1e6),
        log_append_time=False,
    )


def naive_round(storage: StorageRoot, topic: str, uri: str) -> int:
    """Read the whole topic, keep each key's last record, overwrite the table. Returns the next
    offsets it covered (the sum of high watermarks)."""
    reader = TopicReader(storage, topic)
    parts, covered = [], 0
    for p in reader.partition_offsets():
        offset = p.log_start_offset
        while offset < p.high_watermark:
            got = reader.fetch(p.partition, offset, max_records=1_000_000, max_bytes=1 << 30)
            parts.append(got.records.select(["key", "value", "partition", "offset", "timestamp"]))
            offset = got.next_offset
        covered += p.high_watermark
    rows = latest_per_key(pa.concat_tables(parts))
    rows = rows.filter(pc.is_valid(rows["value"]))
    write_deltalake(uri, rows, mode="overwrite", schema_mode="overwrite")
    return covered


def check(table: pa.Table, log: pa.Table) -> None:
    last: dict[bytes, Any] = {}
    for k, v in zip(log["key"].to_pylist(), log["value"].to_pylist(), strict=True):
        last[k] = v
    expected = {k: v for k, v in last.items() if v is not None}
    got = dict(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True))
    assert got == expected, f"{len(got)} rows, {len(expected)} expected"


def staleness(
    storage: StorageRoot, topic: str, writer: TopicWriter, keys: int, merge: Callable[[], int], seconds: float
) -> dict[str, float]:
    """Append 1,000 records every 100 ms while `merge` runs in a loop (it returns the number of
    records the table covers now); for each append, ack -> covered."""
    rng = random.Random(5)
    acked: list[tuple[int, float]] = []  # (records covered once this append is in, ack time)
    done = threading.Event()
    total = [sum(p.high_watermark for p in TopicReader(storage, topic).partition_offsets())]

    def produce() -> None:
        next_at = time.monotonic()
        end = next_at + seconds
        while next_at < end:
            batch = records(rng, 1000, keys, topic)
            writer.append(batch)
            total[0] += batch.num_rows
            acked.append((total[0], time.monotonic()))
            next_at += 0.1
            time.sleep(max(0.0, next_at - time.monotonic()))
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    seen: list[float] = []
    rounds: list[float] = []
    waiting = 0
    while not done.is_set() or waiting < len(acked):
        t0 = time.monotonic()
        covered = merge()
        now = time.monotonic()
        rounds.append((now - t0) * 1000)
        while waiting < len(acked) and acked[waiting][0] <= covered:
            seen.append((now - acked[waiting][1]) * 1000)
            waiting += 1
    producer.join()
    return {
        "staleness_p50_ms": percentile(seen, 50),
        "staleness_p99_ms": percentile(seen, 99),
        "round_p50_ms": percentile(rounds, 50),
    }


def one(work: Path, keys: int, n: int, way: str) -> dict[str, Any]:
    root = work / f"{way}-{keys}"
    settings = load_settings(root=str(root))
    storage = StorageRoot(settings.root)
    topic = "profiles"
    Catalog(storage, settings.writer).create_topic(
        topic, partitions=PARTITIONS, config={"topiclake.table.mode": "upsert"}
    )
    writer = TopicWriter(storage, topic, settings.writer)
    rng = random.Random(keys)
    for _ in range(n // 50_000):
        writer.append(records(rng, 50_000, keys, topic))
    naive_uri = f"{root}/naive-latest"

    def merge_upsert() -> int:
        upsert_topic(storage, topic, max_records=MERGE_RECORDS)
        dt = DeltaTable(storage.latest_uri(topic))
        return sum(int(dt.transaction_version(f"upsert-{p}") or 0) for p in range(PARTITIONS))

    def merge_naive() -> int:
        return naive_round(storage, topic, naive_uri)

    merge = merge_upsert if way == "upsert MERGE" else merge_naive
    started = time.perf_counter()
    while merge() < n:
        pass
    seconds = time.perf_counter() - started
    row: dict[str, Any] = {"way": way, "keys": keys, "backlog": n, "records_per_s": n / seconds}
    row |= staleness(storage, topic, writer, keys, merge, 10.0)
    reader = TopicReader(storage, topic)
    log = pa.concat_tables(
        reader.fetch(p.partition, 0, max_records=1_000_000, max_bytes=1 << 30).records
        for p in reader.partition_offsets()
    )
    log = log.sort_by([("partition", "ascending"), ("offset", "ascending")])
    final = DeltaTable(storage.latest_uri(topic) if way == "upsert MERGE" else naive_uri).to_pyarrow_table(
        columns=["key", "value"]
    )
    check(final, log)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.upsert_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    n = 100_000 if args.quick else 400_000
    work = Path(tempfile.mkdtemp(prefix="topiclake-upsert-bench-", dir=os.environ.get("BENCH_TMP")))
    rows = []
    try:
        for keys in (1_000, 100_000):
            for way in ("upsert MERGE", "naive overwrite"):
                rows.append(one(work, keys, n, way))
                print(rows[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(
        rows, ["way", "keys", "backlog", "records_per_s", "staleness_p50_ms", "staleness_p99_ms", "round_p50_ms"]
    )
    write_results("upsert_bench", rows, {"partitions": PARTITIONS, "merge_records": MERGE_RECORDS})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
