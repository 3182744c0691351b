"""Spark sink benchmark (issue 16): `df.write.format("topiclake")` vs `df.write.format("delta")
.mode("append")` of the same rows, in one session, alternating, medians over repeats (no gateway:
the sink appends directly); then with a gateway on the root: the sink through it, idle and beside an
HTTP producer's load on the same topic, and the sink appending directly beside that load (conflict
retries from the gateway's metrics, the HTTP producer's records/s alone and meanwhile).

    python -m bench.sink_bench [--records 1000000] [--repeats 3] [--partitions 4]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import median, metric_total, print_table, write_results
from conf import load_settings
from delta_log import Catalog, StorageRoot
from tests.e2e.server import ServerProcess
from topiclake import Producer


def http_load(url: str, topic: str, stop: threading.Event, acks: list[float]) -> None:
    """One keep-alive producer, 10-record requests back to back: acks' times land in `acks`."""
    with Producer(url, linger_ms=1, value_format="string") as p:
        while not stop.is_set():
            futures = [p.send(topic, "x" * 100, partition=i % 2) for i in range(10)]
            for f in futures:
                f.result(timeout=60)
            acks.append(time.monotonic())


def row(name: str, records: int, secs: float, delta: dict) -> dict:
    return {
        "writer": name,
        "records": records,
        "median_s": secs,
        "records_per_s": records / secs,
        "ratio_vs_delta": records / secs / delta["records_per_s"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args(argv)
    from delta_log.spark import get_spark

    work = Path(tempfile.mkdtemp(prefix="topiclake-sink-"))
    root = str(work / "root")
    settings = load_settings(root=root)
    catalog = Catalog(StorageRoot(root), settings.writer)
    catalog.create_topic("sink", partitions=args.partitions)
    srv = None
    try:
        spark = get_spark(settings, app_name="topiclake-sink-bench")
        df = spark.range(args.records).selectExpr(
            "CAST(id AS STRING) AS key",
            "CAST(substring(repeat(sha2(CAST(id AS STRING), 256), 2), 1, 100) AS BINARY) AS value",
        )
        df = df.repartition(4).cache()
        df.count()
        times: dict[str, list[float]] = {"topiclake sink": [], "delta append": []}
        for i in range(args.repeats + 1):  # the first round warms the Python workers, not counted
            for name in times:
                start = time.perf_counter()
                if name == "topiclake sink":
                    df.write.format("topiclake").option("topic", "sink").mode("append").save()
                else:
                    df.write.format("delta").mode("append").save(str(work / "delta"))
                if i:
                    times[name].append(time.perf_counter() - start)
        delta = {"records_per_s": args.records / median(times["delta append"])}
        rows = [row(name, args.records, median(t), delta) for name, t in times.items()]

        # with a live gateway on the same root and topic: through it (found in the root's membership)
        srv = ServerProcess(Path(root)).start()
        start = time.perf_counter()
        df.write.format("topiclake").option("topic", "sink").mode("append").save()
        secs = time.perf_counter() - start
        rows.append(row("topiclake sink via an idle gateway", args.records, secs, rows[1]))

        # ... and beside an HTTP producer's load on the same topic: through the gateway, then direct
        stop, acks = threading.Event(), []
        t = threading.Thread(target=http_load, args=(srv.url, "sink", stop, acks))
        t.start()
        time.sleep(5)
        http_alone = len([a for a in acks if a > time.monotonic() - 4]) * 10 / 4
        notes = [f"HTTP producer (10 x 100 B per request, one connection) alone: {http_alone:,.0f} records/s"]
        for mode in ("auto", "none"):
            conflicts0 = metric_total(httpx.get(srv.url + "/metrics").text, "topiclake_commit_conflicts_total")
            n0, start = len(acks), time.perf_counter()
            name = "topiclake sink via the busy gateway" if mode == "auto" else "topiclake sink direct, busy gateway"
            try:
                df.write.format("topiclake").option("topic", "sink").option("gateway", mode).mode("append").save()
                secs = time.perf_counter() - start
                rows.append(row(name, args.records, secs, rows[1]))
                outcome = "ok"
            except Exception as exc:  # the measurement: a direct writer can starve
                secs = time.perf_counter() - start
                outcome = "failed: " + (
                    "gave up after conflicting commits" if "conflicting" in str(exc) else str(exc)[:200]
                )
                rows.append(
                    {
                        "writer": name,
                        "records": args.records,
                        "median_s": secs,
                        "records_per_s": 0.0,
                        "ratio_vs_delta": 0.0,
                    }
                )
            conflicts = (
                metric_total(httpx.get(srv.url + "/metrics").text, "topiclake_commit_conflicts_total") - conflicts0
            )
            notes.append(
                f"{name}: {outcome}; HTTP producer meanwhile {(len(acks) - n0) * 10 / secs:,.0f} records/s, "
                f"gateway conflicts retried {conflicts:.0f}"
            )
        stop.set()
        t.join()
        spark.stop()
        print_table(rows, ["writer", "records", "median_s", "records_per_s", "ratio_vs_delta"])
        print("\n" + "\n".join(notes))
        meta = vars(args) | {"notes": notes}
        print(f"written: {write_results('sink_bench', rows, meta)}")
    finally:
        if srv is not None:
            srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
