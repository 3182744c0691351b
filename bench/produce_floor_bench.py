"""The produce path's floor: what writing 1 KB records costs in CPU before any protocol, in one
process, with the gateway's own code (issue 26's 1 KB ProducerPerformance target).

    python -m bench.produce_floor_bench            # 512 MiB of records a measure
    python -m bench.produce_floor_bench --quick    # 128 MiB

It prints CPU milliseconds per MB (the calling thread's; the kernel's copy into the page cache is
the caller's) for:

- a file of new pages, written in 1 MiB pieces; the same file written over in place; a new file
  after the first was deleted (the kernel reuses its pages). On a VM that hands free memory back
  to its host, a page new to the guest costs far more than a reused one, and Kafka's broker
  pays that once a byte: its whole CPU a 1 KB record, warm, is about this figure;
- the table path's own writes: a group commit's flush as `write_segments` writes it (one parquet
  file per partition, 4 partitions, ~1 MiB each: what a Java producer's 5 requests of 1 MB in
  flight bring to one commit), then the roll-up's copy of 8 such files into one
  (`merge_segments`), which every byte of a `table` topic passes through once, because an
  acks=all producer never has enough in flight for a commit to write files past the roll-up's
  4 MiB base.

The floor of a `table` topic is the flush plus the roll-up: compare it with the broker's CPU a
record in `bench.kafka_bench` (the `server us/record` column of ProducerPerformance). Results go
to bench/results/produce_floor_bench.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.common import print_table, write_results
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.table.segment_files import ParquetOptions, merge_segments, write_segments
from delta_log.table.storage import StorageRoot

MIB = 1 << 20
PARTITIONS = 4
RECORD = 1024
FANOUT = 8  # the roll-up's default `rollup_fanout`


def letters(n: int, size: int, seed: int) -> pa.BinaryArray:
    """`n` values of `size` random capital letters (what Kafka's ProducerPerformance sends)."""
    data = np.random.default_rng(seed).integers(65, 91, size=n * size, dtype=np.uint8)
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def flush_records(per_partition: int, base: int, values: pa.BinaryArray) -> pa.Table:
    """One flush's records in TOPIC_SCHEMA, sorted by partition then offset."""
    n = per_partition * PARTITIONS
    parts = np.repeat(np.arange(PARTITIONS, dtype=np.int32), per_partition)
    offsets = np.tile(np.arange(base, base + per_partition, dtype=np.int64), PARTITIONS)
    return pa.table(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": values,
            "topic": pa.array(["floor"] * n, pa.string()),
            "partition": pa.array(parts),
            "offset": pa.array(offsets),
            "timestamp": pa.array(np.full(n, time.time_ns() // 1000), TOPIC_SCHEMA.field("timestamp").type),
            "timestampType": pa.array(np.zeros(n, np.int32)),
            "headers": pa.nulls(n, TOPIC_SCHEMA.field("headers").type),
        },
        schema=TOPIC_SCHEMA,
    )


def page_costs(work: Path, mib: int) -> dict[str, float]:
    """CPU ms per MB writing new pages, the same pages again, and pages freed by a delete."""
    piece = os.urandom(MIB)

    def write(path: Path, mode: str) -> float:
        c0 = time.thread_time()
        with open(path, mode) as f:
            for _ in range(mib):
                f.write(piece)
        return (time.thread_time() - c0) * 1e3 / (mib * MIB / 1e6)

    first, second = work / "pages-1", work / "pages-2"
    new = write(first, "wb")
    again = write(first, "r+b")
    first.unlink()
    reused = write(second, "wb")
    second.unlink()
    return {"new pages": new, "the same pages written over": again, "pages of a deleted file": reused}


def table_path(work: Path, mib: int) -> dict[str, float]:
    """CPU ms per MB of the flushes' parquet files, and of the roll-up's copy of them."""
    storage = StorageRoot(str(work / "root"))
    uri = storage.topic_uri("floor")
    options = ParquetOptions()
    per_partition = MIB // RECORD  # ~1 MiB a partition a flush
    flushes = max(FANOUT, mib // PARTITIONS // FANOUT * FANOUT)  # a flush: PARTITIONS MiB
    values = [letters(per_partition * PARTITIONS, RECORD, seed) for seed in range(FANOUT)]
    batches = [flush_records(per_partition, i * per_partition, values[i % FANOUT]) for i in range(flushes)]
    written: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    c0 = time.thread_time()
    for records in batches:
        for seg in write_segments(storage, uri, records, options):
            written[seg.partition].append(seg.relative_path)
    flush_s = time.thread_time() - c0
    mb = flushes * PARTITIONS * per_partition * RECORD / 1e6
    c0 = time.thread_time()
    for partition, paths in written.items():
        for i in range(0, len(paths) - FANOUT + 1, FANOUT):
            if merge_segments(storage, uri, partition, paths[i : i + FANOUT], options) is None:
                raise SystemExit("the parquet merge extension is missing: run make setup")
    merge_s = time.thread_time() - c0
    return {
        "flush (write_segments, 4 files of ~1 MiB)": flush_s * 1e3 / mb,
        "roll-up (merge_segments, 8 into 1)": merge_s * 1e3 / mb,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.produce_floor_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    mib = 128 if args.quick else 512
    work = Path(tempfile.mkdtemp(prefix="topiclake-floor-bench-", dir=os.environ.get("BENCH_TMP")))
    try:
        rows = [{"measure": f"file writes: {k}", "cpu_ms_per_MB": v} for k, v in page_costs(work, mib).items()]
        table = table_path(work, mib)
        rows += [{"measure": f"table path: {k}", "cpu_ms_per_MB": v} for k, v in table.items()]
        rows.append({"measure": "table path: floor (flush + roll-up)", "cpu_ms_per_MB": sum(table.values())})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, ["measure", "cpu_ms_per_MB"])
    print("At 1 KB a record, ms per MB is about us per record: compare with the broker's and the gateway's")
    print("CPU per record under ProducerPerformance in bench.kafka_bench.")
    write_results("produce_floor_bench", rows, {"mib": mib})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
