"""Log core benchmark (issue 2): append throughput vs raw parquet, commit latency as a topic ages,
cold fetch from a table of many segments.

    python -m bench.log_bench            # full run (10,000 commits; a few minutes)
    python -m bench.log_bench --quick    # smaller, for a smoke run

Figures are printed as tables and written to bench/results/log_bench.json. Throughput is compared
with a raw `pyarrow.parquet.write_table` of the same records in the same run (ratios, since the
machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import Timer, median, percentile, print_table, write_results
from conf import ReaderSettings, load_settings
from delta_log import AppendRequest, Catalog, StorageRoot, TopicReader, TopicWriter, normalize_batch
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.maintenance.topic_maintenance import TopicMaintenance


def make_batch(n: int, value_size: int, partition: int = 0) -> pa.Table:
    value = b"x" * value_size
    return normalize_batch(
        pa.table(
            {
                "key": [b"key-%08d" % i for i in range(n)],
                "value": [value] * n,
                "partition": pa.array([partition] * n, pa.int32()),
            }
        ),
        partitions=partition + 1,
        topic="bench",
        max_message_bytes=10**7,
        now_us=int(time.time() * 1e6),
        log_append_time=False,
    )


def topic_table(batch: pa.Table) -> pa.Table:
    n = batch.num_rows
    return pa.table(
        {
            "key": batch.column("key"),
            "value": batch.column("value"),
            "topic": pa.array(["bench"] * n),
            "partition": batch.column("partition"),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": batch.column("timestamp"),
            "timestampType": batch.column("timestampType"),
            "headers": batch.column("headers"),
        },
        schema=TOPIC_SCHEMA,
    )


def bench_append(workdir: Path, quick: bool) -> list[dict]:
    rows = []
    settings = load_settings(root=str(workdir / "append"))
    storage = StorageRoot(settings.root)
    catalog = Catalog(storage, settings.writer)
    target_bytes = (40 if quick else 200) * 1024 * 1024
    for value_size in (100, 1024):
        for batch_size in (100, 10_000):
            for per_commit in (1, 8):
                batch = make_batch(batch_size, value_size)
                batch_bytes = batch_size * (value_size + 12)
                requests = max(8, min(2000 if not quick else 300, target_bytes // batch_bytes))
                requests -= requests % per_commit
                name = f"append-{value_size}-{batch_size}-{per_commit}"
                catalog.create_topic(name)
                roller = TopicMaintenance(storage, name, settings.maintenance, settings.writer)
                writer = TopicWriter(storage, name, settings.writer, on_commit=roller.notify_commit)
                group = [AppendRequest(batch=batch)] * per_commit
                with Timer() as t:
                    for _ in range(requests // per_commit):
                        writer.append_many(group)
                roller.close()
                raw_dir = workdir / f"raw-{name}"
                raw_dir.mkdir()
                table = topic_table(batch)
                with Timer() as raw:
                    for i in range(requests):
                        pq.write_table(
                            table,
                            raw_dir / f"{i}.parquet",
                            compression="snappy",
                            row_group_size=settings.writer.max_row_group_rows,
                        )
                records = requests * batch_size
                mb = records * (value_size + 12) / 1e6
                rows.append(
                    {
                        "value_bytes": value_size,
                        "batch": batch_size,
                        "requests_per_commit": per_commit,
                        "commits": requests // per_commit,
                        "records_per_s": records / t.seconds,
                        "MB_per_s": mb / t.seconds,
                        "raw_parquet_MB_per_s": mb / raw.seconds,
                        "ratio_vs_raw": raw.seconds / t.seconds,
                        "ms_per_commit": t.seconds / (requests // per_commit) * 1000,
                    }
                )
                shutil.rmtree(raw_dir)
    return rows


def bench_commit_latency(workdir: Path, quick: bool) -> list[dict]:
    settings = load_settings(root=str(workdir / "latency"))
    storage = StorageRoot(settings.root)
    Catalog(storage, settings.writer).create_topic("aging")
    # As the server runs a topic: the writer plus its TopicMaintenance (roll-ups, log cleanup).
    roller = TopicMaintenance(storage, "aging", settings.maintenance, settings.writer)
    writer = TopicWriter(storage, "aging", settings.writer, on_commit=roller.notify_commit)
    batch = make_batch(10, 100)
    marks = [100, 1000] if quick else [100, 1000, 10_000]
    window = 100
    lat: list[float] = []
    for _ in range(marks[-1] + window):
        t0 = time.perf_counter()
        writer.append(batch)
        lat.append((time.perf_counter() - t0) * 1000)
    roller.close()
    files = len(writer.table.file_uris())
    log_files = len(list((Path(storage.topic_uri("aging")) / "_delta_log").iterdir()))
    rows = []
    base = None
    for m in marks:
        w = lat[m - window // 2 : m + window // 2]
        med = median(w)
        base = base or med
        rows.append({"after_commits": m, "median_ms": med, "p99_ms": percentile(w, 99), "vs_100": med / base})
    rows[-1]["data_files_at_end"] = files
    rows[-1]["log_files_at_end"] = log_files
    return rows


def bench_cold_fetch(workdir: Path, quick: bool) -> list[dict]:
    settings = load_settings(root=str(workdir / "fetch"))
    storage = StorageRoot(settings.root)
    Catalog(storage, settings.writer).create_topic("segments")
    writer = TopicWriter(storage, "segments", settings.writer)
    segments = 200 if quick else 1000
    per_segment = 100
    for _ in range(segments):
        writer.append(make_batch(per_segment, 100))
    hw = segments * per_segment
    with Timer() as open_t:
        reader = TopicReader(storage, "segments", ReaderSettings(refresh_interval_s=3600))
    rng = random.Random(7)
    cold, warm = [], []
    for _ in range(50):
        reader._footers.clear()  # cold: no cached parquet footers, no tail cache
        off = rng.randrange(0, hw - 1000)
        with Timer() as t:
            res = reader.fetch(0, off, max_records=1000, max_bytes=10**8)
        assert res.records.num_rows == 1000
        cold.append(t.seconds * 1000)
        with Timer() as t2:
            reader.fetch(0, off, max_records=1000, max_bytes=10**8)
        warm.append(t2.seconds * 1000)
    return [
        {
            "segments": segments,
            "records": hw,
            "open_reader_ms": open_t.seconds * 1000,
            "cold_fetch_1000_median_ms": median(cold),
            "cold_p99_ms": percentile(cold, 99),
            "warm_fetch_1000_median_ms": median(warm),
        }
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["append", "latency", "fetch"])
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="topiclake-bench-"))
    rows: list[dict] = []
    try:
        if args.only in (None, "append"):
            print("## Append throughput vs a raw parquet write of the same records (random values)")
            append = bench_append(workdir, args.quick)
            print_table(
                append,
                [
                    "value_bytes",
                    "batch",
                    "requests_per_commit",
                    "commits",
                    "records_per_s",
                    "MB_per_s",
                    "raw_parquet_MB_per_s",
                    "ratio_vs_raw",
                    "ms_per_commit",
                ],
            )
            rows += append
        if args.only in (None, "latency"):
            print("\n## Commit latency as the topic ages (10-record commits, default settings, roll-up on)")
            latency = bench_commit_latency(workdir, args.quick)
            print_table(
                latency, ["after_commits", "median_ms", "p99_ms", "vs_100", "data_files_at_end", "log_files_at_end"]
            )
            rows += latency
        if args.only in (None, "fetch"):
            print("\n## Fetch 1,000 records by offset from a table of many segments")
            fetch = bench_cold_fetch(workdir, args.quick)
            print_table(fetch, list(fetch[0]))
            rows += fetch
        name = "log_bench" if args.only is None else f"log_bench_{args.only}"
        print(f"\nwritten: {write_results(name, rows, {'quick': args.quick, 'only': args.only})}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
