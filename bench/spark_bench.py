"""Spark benchmark (issue 5): availableNow read of a topic through format("topiclake") vs
format("delta") on the same table, in the same run, alternating, medians over repeats.

    python -m bench.spark_bench [--records 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bench.common import median, print_table, write_results
from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicWriter, normalize_batch


def fill(root: str, topic: str, records: int, partitions: int = 4) -> None:
    settings = load_settings(root=root)
    storage = StorageRoot(root)
    Catalog(storage, settings.writer).create_topic(topic, partitions=partitions)
    w = TopicWriter(storage, topic, settings.writer)
    per = 100_000
    blob = os.urandom(per * 100)
    values = [blob[i * 100 : (i + 1) * 100] for i in range(per)]
    for start in range(0, records, per):
        n = min(per, records - start)
        t = pa.table({"value": values[:n], "partition": pa.array([i % partitions for i in range(n)], pa.int32())})
        w.append(
            normalize_batch(
                t,
                partitions=partitions,
                topic=topic,
                max_message_bytes=10**6,
                now_us=int(time.time() * 1e6),
                log_append_time=False,
            )
        )


def run_once(spark, fmt: str, root: str, topic: str, work: Path, i: int) -> tuple[float, int]:
    if fmt == "topiclake":
        df = (
            spark.readStream.format("topiclake")
            .option("root", root)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
        )
    else:
        df = spark.readStream.format("delta").load(StorageRoot(root).topic_uri(topic))
    start = time.perf_counter()
    q = (
        df.selectExpr("partition", "offset", "length(value) AS n")
        .writeStream.format("noop")
        .option("checkpointLocation", str(work / f"ckpt-{fmt}-{i}"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    return time.perf_counter() - start, rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from delta_log.spark import get_spark

    work = Path(tempfile.mkdtemp(prefix="topiclake-spark-"))
    root = str(work / "root")
    try:
        fill(root, "bench", args.records)
        spark = get_spark(load_settings(root=root), app_name="topiclake-bench")
        times: dict[str, list[float]] = {"topiclake": [], "delta": []}
        for i in range(args.repeats):
            for fmt in ("topiclake", "delta"):  # alternating, same table, same session
                secs, rows = run_once(spark, fmt, root, "bench", work, i)
                assert rows == args.records, (fmt, rows)
                times[fmt].append(secs)
        spark.stop()
        rows = [
            {"source": f, "records": args.records, "median_s": median(t), "records_per_s": args.records / median(t)}
            for f, t in times.items()
        ]
        ratio = rows[0]["records_per_s"] / rows[1]["records_per_s"]
        for r in rows:
            r["ratio_vs_delta"] = r["records_per_s"] / rows[1]["records_per_s"]
        print_table(rows, ["source", "records", "median_s", "records_per_s", "ratio_vs_delta"])
        print(f"\ntopiclake / delta = {ratio:.2f} (target >= 0.8)")
        print(f"written: {write_results('spark_bench', rows, vars(args))}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
