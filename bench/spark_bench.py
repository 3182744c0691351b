"""Spark benchmark (issue 5): availableNow read of a topic through format("topiclake") vs
format("delta") on the same table, in the same run, alternating, medians over repeats.

Then a streaming ETL's micro-batches (topic -> Delta table, maxOffsetsPerTrigger 500, as the
streaming_etl notebook runs), with Delta's snapshot rebuilt by Delta's default 50 tasks against
conf/spark-defaults.conf's 4, alternating in the same session: the median seconds per micro-batch.

    python -m bench.spark_bench [--records 1000000] [--repeats 3] [--etl-records 4000]
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

SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


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


def topic_stream(spark, root: str, topic: str, **options: object):
    """`topic` from its earliest offset through format("topiclake"), with more source options."""
    reader = spark.readStream.format("topiclake").option("root", root).option("subscribe", topic)
    return reader.option("startingOffsets", "earliest").options(**options).load()


def run_once(spark, fmt: str, root: str, topic: str, work: Path, i: int) -> tuple[float, int]:
    if fmt == "topiclake":
        df = topic_stream(spark, root, topic)
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


def etl_batches(spark, root: str, topic: str, work: Path, name: str) -> list[float]:
    """Seconds per micro-batch of topic -> Delta sink, 500 records a batch (the first, which
    starts the source's Python workers, left out)."""
    q = (
        topic_stream(spark, root, topic, maxOffsetsPerTrigger=500)
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS json")
        .writeStream.format("delta")
        .option("checkpointLocation", str(work / f"ckpt-{name}"))
        .trigger(availableNow=True)
        .start(str(work / f"sink-{name}"))
    )
    q.awaitTermination()
    return [p["durationMs"]["triggerExecution"] / 1000 for p in q.recentProgress if p["numInputRows"]][1:]


def etl(spark, root: str, work: Path, records: int, repeats: int) -> list[dict]:
    fill(root, "etl", records, partitions=2)
    tuned = spark.conf.get(SNAPSHOT_PARTITIONS, "50")
    snapshots = {"delta default (50)": "50", f"spark-defaults.conf ({tuned})": tuned}
    per_batch: dict[str, list[float]] = {k: [] for k in snapshots}
    for i in range(repeats):
        for j, (label, value) in enumerate(snapshots.items()):  # alternating, same session
            spark.conf.set(SNAPSHOT_PARTITIONS, value)
            per_batch[label] += etl_batches(spark, root, "etl", work, f"etl-{j}-{i}")
    spark.conf.set(SNAPSHOT_PARTITIONS, tuned)
    base = median(per_batch["delta default (50)"])
    return [
        {"snapshot_partitions": k, "batches": len(v), "median_batch_s": median(v), "ratio_vs_default": median(v) / base}
        for k, v in per_batch.items()
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--etl-records", type=int, default=4000, help="0: skip the streaming ETL comparison")
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
        etl_rows = etl(spark, root, work, args.etl_records, args.repeats) if args.etl_records else []
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
        if etl_rows:
            print("\nstreaming ETL, topic -> Delta, 500 records per micro-batch:")
            print_table(etl_rows, ["snapshot_partitions", "batches", "median_batch_s", "ratio_vs_default"])
        print(f"written: {write_results('spark_bench', rows + etl_rows, vars(args))}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
