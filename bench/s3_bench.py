"""Object storage cost model (issue 13): the same work on local disk and on a real S3 server.

MinIO (tests/s3/minio.py, built with `python -m tests.s3.minio build`) on 127.0.0.1 against a local
root, in one run. Per root:

- commit p50/p99: one writer appending batches of 1,000 records of 1 KB (one Delta commit each);
- produce MB/s: the same writer appending 8 MB batches back to back;
- fetch MB/s (cold): a new reader reading the whole partition from offset 0 in 1 MiB fetches;
- S3 requests per commit, per roll-up pass and per fetch, by API (MinIO's own request counters).

    python -m bench.s3_bench [--commits 60] [--seconds 8]

A loopback MinIO has no network latency: commit latency on a real bucket adds tens of ms per
request round trip; the request counts are what the bill is made of (docs/OPERATIONS.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Callable

import pyarrow as pa

from bench.common import percentile, print_table, write_results
from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicReader, TopicWriter, normalize_batch
from delta_log.maintenance.topic_maintenance import TopicMaintenance
from tests.s3.minio import MinioServer, unavailable_reason


def batch(records: int, size: int) -> pa.Table:
    blob = os.urandom(records * size)
    return normalize_batch(
        pa.table(
            {
                "value": pa.array([blob[i * size : (i + 1) * size] for i in range(records)], pa.binary()),
                "partition": pa.array([0] * records, pa.int32()),
            }
        ),
        partitions=1,
        topic="t",
        max_message_bytes=10**7,
        now_us=int(time.time() * 1e6),
        log_append_time=False,
    )


def per_op(count: Callable[[], dict[str, float]] | None, before: dict[str, float], ops: int) -> dict[str, float]:
    if count is None:
        return {}
    after = count()
    return {api: (after.get(api, 0.0) - before.get(api, 0.0)) / ops for api in after if after[api] != before.get(api)}


def measure(
    root: str, options: dict[str, str], commits: int, seconds: float, count: Callable[[], dict[str, float]] | None
):
    settings = load_settings(root=root, storage_options=options)
    storage = StorageRoot(settings.root, settings.storage_options)
    Catalog(storage, settings.writer).create_topic("t")
    writer = TopicWriter(storage, "t", settings.writer)
    small = batch(1000, 1024)
    before = count() if count else {}
    latencies = []
    for _ in range(commits):
        t = time.perf_counter()
        writer.append(small)
        latencies.append((time.perf_counter() - t) * 1000)
    per_commit = per_op(count, before, commits)

    big = batch(8000, 1024)
    written, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        writer.append(big)
        written += big.nbytes
    produce_mb_s = written / (time.perf_counter() - t0) / 1e6

    roller = TopicMaintenance(storage, "t", settings.maintenance, settings.writer, background=False)
    before = count() if count else {}
    roller.run_task("rollup")
    per_rollup = per_op(count, before, 1)

    reader = TopicReader(storage, "t", settings.reader)
    end = reader.high_watermark(0)
    before = count() if count else {}
    offset, fetches, fetched, t0 = 0, 0, 0, time.perf_counter()
    while offset < end:
        result = reader.fetch(0, offset, max_records=1_000_000, max_bytes=1024 * 1024)
        offset = result.next_offset
        fetched += result.records.nbytes
        fetches += 1
    fetch_mb_s = fetched / (time.perf_counter() - t0) / 1e6
    per_fetch = per_op(count, before, fetches)
    return {
        "commit_p50_ms": percentile(latencies, 50),
        "commit_p99_ms": percentile(latencies, 99),
        "produce_mb_s": produce_mb_s,
        "fetch_cold_mb_s": fetch_mb_s,
        "requests_per_commit": per_commit,
        "requests_per_rollup": per_rollup,
        "requests_per_fetch": per_fetch,
    }


def _fmt(requests: dict[str, float]) -> str:
    return ", ".join(f"{api} {n:.1f}" for api, n in sorted(requests.items(), key=lambda kv: -kv[1])) or "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commits", type=int, default=60)
    p.add_argument("--seconds", type=float, default=8.0)
    args = p.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(reason)
    minio = MinioServer().start()
    try:
        local = measure(str(tempfile.mkdtemp(prefix="s3-bench-")) + "/data", {}, args.commits, args.seconds, None)
        s3 = measure(
            minio.root(f"bench-{uuid.uuid4().hex[:6]}"),
            minio.storage_options(),
            args.commits,
            args.seconds,
            minio.requests,
        )
    finally:
        minio.stop()
    rows = [
        {"figure": name, "local": local[key], "minio": s3[key], "minio_vs_local": s3[key] / local[key]}
        for name, key in [
            ("commit p50 (ms)", "commit_p50_ms"),
            ("commit p99 (ms)", "commit_p99_ms"),
            ("produce MB/s (8 MB commits)", "produce_mb_s"),
            ("fetch MB/s, cold (1 MiB fetches)", "fetch_cold_mb_s"),
        ]
    ]
    print_table(rows, ["figure", "local", "minio", "minio_vs_local"])
    requests = [
        {"operation": op, "S3 requests by API": _fmt(s3[key])}
        for op, key in [
            ("one commit (1,000 x 1 KB)", "requests_per_commit"),
            ("one roll-up pass", "requests_per_rollup"),
            ("one 1 MiB fetch, cold", "requests_per_fetch"),
        ]
    ]
    print_table(requests, ["operation", "S3 requests by API"])
    write_results("s3_bench", [*rows, *requests], vars(args))


if __name__ == "__main__":
    main()
