"""Jobs benchmark (issue 6): compaction of 10,000 small segments; retention and replication MB/s on 1 GB.

    python -m bench.jobs_bench                 # 10,000 segments, 1 GB
    python -m bench.jobs_bench --quick         # 2,000 segments, 128 MB

Each job runs in this process (what `--local` and the scheduler run; with Spark the same code runs
one task per topic). Peers in the same run, on copies of the same table:
- compaction vs delta-rs `optimize.compact()` (what a user would run on a Delta table by hand; it
  does not keep segments adjacent or sorted by offset, so it is a speed reference, not a substitute);
- replication vs a plain recursive copy of the table folder (the physical limit: it is not
  incremental and not consistent under writes);
- retention vs delta-rs `DeleteBuilder` (`dt.delete("timestamp < ...")`) of the same records.
Figures print as a table and go to bench/results/jobs_bench.json.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable

from bench.common import Timer, median, percentile, print_table, write_results
from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicReader
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.maintenance.compaction import compact_topic
from delta_log.maintenance.replication import replicate_topic
from delta_log.maintenance.retention import apply_retention
from delta_log.table.app_transactions import high_watermark_transactions
from delta_log.table.segment_files import ParquetOptions, write_segments


def records(partition: int, first: int, n: int, value_size: int, ts_us: int) -> pa.Table:
    blob = random.randbytes(value_size * n)  # incompressible, like most payloads that matter
    values = [blob[i * value_size : (i + 1) * value_size] for i in range(n)]
    return pa.table(
        {
            "key": [b"k%d" % (first + i) for i in range(n)],
            "value": values,
            "topic": pa.array(["bench"] * n),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(first, first + n), pa.int64()),
            "timestamp": pa.array([ts_us] * n, pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * n, pa.int8()),
            "headers": pa.array([None] * n, TOPIC_SCHEMA.field("headers").type),
        },
        schema=TOPIC_SCHEMA,
    )


def build_topic(
    storage: StorageRoot, name: str, *, partitions: int, segments: int, per_segment: int, value_size: int, ts_us: int
) -> int:
    """A topic of `segments` segments (as the gateway writes them), committed 100 segments at a time."""
    settings = load_settings(root=storage.root)
    Catalog(storage, settings.writer).create_topic(name, partitions=partitions, config={"retention.ms": 3_600_000})
    dt = DeltaTable(storage.topic_uri(name))
    uri, nbytes = storage.topic_uri(name), 0
    next_offset = dict.fromkeys(range(partitions), 0)
    per_commit = 100
    for start in range(0, segments, per_commit):
        adds = []
        for i in range(start, min(segments, start + per_commit)):
            p = i % partitions
            t = records(p, next_offset[p], per_segment, value_size, ts_us)
            next_offset[p] += per_segment
            for w in write_segments(storage, uri, t, ParquetOptions()):
                adds.append(w.action)
                nbytes += w.action.size
        txns = high_watermark_transactions(next_offset)
        dt.create_write_transaction(
            adds,
            "append",
            TOPIC_SCHEMA,
            partition_by=["partition"],
            commit_properties=CommitProperties(app_transactions=txns),
        )
        dt.update_incremental()
    return nbytes


def fetch_latency(storage: StorageRoot, name: str, partitions: int, fetches: int = 60) -> dict[str, float]:
    """Cold reader (as after a restart), 500 records from random offsets."""
    reader = TopicReader(storage, name)
    hws = {p: reader.high_watermark(p) for p in range(partitions)}
    times = []
    rng = random.Random(7)
    for _ in range(fetches):
        p = rng.randrange(partitions)
        off = rng.randrange(max(1, hws[p] - 500))
        with Timer() as t:
            reader.fetch(p, off, max_records=500, max_bytes=16 << 20)
        times.append(t.seconds * 1000)
    return {"p50_ms": median(times), "p99_ms": percentile(times, 99)}


def files_of(storage: StorageRoot, name: str) -> int:
    return len(DeltaTable(storage.topic_uri(name)).file_uris())


def dir_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*.parquet"))


def bench_compaction(work: Path, segments: int) -> list[dict]:
    storage = StorageRoot(str(work / "compact"))
    settings = load_settings(root=storage.root)
    build_topic(
        storage, "small", partitions=4, segments=segments, per_segment=20, value_size=100, ts_us=int(time.time() * 1e6)
    )
    peer_root = StorageRoot(str(work / "compact-peer"))
    shutil.copytree(storage.root, peer_root.root)
    before_files = files_of(storage, "small")
    before = fetch_latency(storage, "small", 4)
    with Timer() as t:
        report = compact_topic(storage, "small", settings.writer, target_bytes=settings.jobs.compaction_target_bytes)
    after = fetch_latency(storage, "small", 4)
    peer = DeltaTable(peer_root.topic_uri("small"))
    with Timer() as tp:
        peer.optimize.compact()
    return [
        {
            "job": "compaction (topiclake)",
            "seconds": t.seconds,
            "files_before": before_files,
            "files_after": files_of(storage, "small"),
            "fetch_p50_before_ms": before["p50_ms"],
            "fetch_p50_after_ms": after["p50_ms"],
            "fetch_p99_before_ms": before["p99_ms"],
            "fetch_p99_after_ms": after["p99_ms"],
            "ratio_vs_peer": tp.seconds / t.seconds,
            "committed": report.committed,
        },
        {
            "job": "optimize.compact (delta-rs peer)",
            "seconds": tp.seconds,
            "files_before": before_files,
            "files_after": len(DeltaTable(peer_root.topic_uri("small")).file_uris()),
        },
    ]


def bench_bulk(work: Path, gigabytes: float) -> list[dict]:
    source = StorageRoot(str(work / "bulk"))
    settings = load_settings(root=source.root)
    seg_records, value_size = 8192, 1024
    segments = max(4, int(gigabytes * (1 << 30) / (seg_records * value_size)))
    old = int((time.time() - 7200) * 1e6)  # two hours old: past retention.ms of one hour
    nbytes = build_topic(
        source, "bulk", partitions=4, segments=segments, per_segment=seg_records, value_size=value_size, ts_us=old
    )
    mb = nbytes / 1e6
    rows = []

    replica = StorageRoot(str(work / "bulk-replica"))
    with Timer() as t:
        rep = replicate_topic(source, replica, "bulk", settings.writer)
    assert rep.bytes_copied == nbytes, (rep.bytes_copied, nbytes)
    peer_dir = str(work / "bulk-copy")
    with Timer() as tp:
        shutil.copytree(source.topic_uri("bulk"), peer_dir)
    rows.append(
        {
            "job": "replication (topiclake)",
            "MB": mb,
            "seconds": t.seconds,
            "MB/s": mb / t.seconds,
            "ratio_vs_peer": tp.seconds / t.seconds,
        }
    )
    rows.append({"job": "recursive copy (peer)", "MB": mb, "seconds": tp.seconds, "MB/s": mb / tp.seconds})

    with Timer() as t:
        ret = apply_retention(source, "bulk", settings.writer)
    assert ret.bytes_removed > 0
    peer = DeltaTable(peer_dir)
    cutoff = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    with Timer() as tp:
        peer.delete(f"timestamp < '{cutoff}'")
        peer.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    removed_mb = ret.bytes_removed / 1e6
    rows.append(
        {
            "job": "retention (topiclake)",
            "MB": removed_mb,
            "seconds": t.seconds,
            "MB/s": removed_mb / t.seconds,
            "ratio_vs_peer": tp.seconds / t.seconds,
        }
    )
    rows.append({"job": "delete + vacuum (delta-rs peer)", "MB": mb, "seconds": tp.seconds, "MB/s": mb / tp.seconds})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.jobs_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--segments", type=int)
    ap.add_argument("--gb", type=float)
    args = ap.parse_args(argv)
    segments = args.segments or (2000 if args.quick else 10_000)
    gigabytes = args.gb or (0.125 if args.quick else 1.0)
    work = Path(tempfile.mkdtemp(prefix="topiclake-jobs-bench-", dir=os.environ.get("BENCH_TMP")))
    try:
        compaction = bench_compaction(work, segments)
        print(f"\nCompaction of {segments:,} small segments (4 partitions, 20 records of 100 B each)")
        print_table(
            compaction,
            [
                "job",
                "seconds",
                "files_before",
                "files_after",
                "fetch_p50_before_ms",
                "fetch_p50_after_ms",
                "fetch_p99_before_ms",
                "fetch_p99_after_ms",
                "ratio_vs_peer",
            ],
        )
        bulk = bench_bulk(work, gigabytes)
        print(f"\nReplication and retention of {gigabytes:g} GB (1 KB records, 8 MB segments, 4 partitions)")
        print_table(bulk, ["job", "MB", "seconds", "MB/s", "ratio_vs_peer"])
        path = write_results("jobs_bench", compaction + bulk, {"segments": segments, "gigabytes": gigabytes})
        print(f"\nresults: {path}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
