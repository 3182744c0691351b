"""Many small active topics (issue 27): 1,000 topics at 10 records/s each, on `table` and on `log` topics.

    python -m bench.many_topics_bench                 # 1,000 topics, 25 s measured per mode
    python -m bench.many_topics_bench --quick         # 1,000 topics, 10 s
    python -m bench.many_topics_bench --topics 200 --rate 10 --modes log --producers idempotent

One real `topiclake serve` (embedded root, Kafka listener on). For each mode, `--topics` one-partition
topics are created with `topiclake.ack.mode` set, then a confluent-kafka producer (acks=all,
linger.ms=5, as a Kafka application writing to many topics would run it) sends `--rate` records of
100 B a second to every topic, open loop, spread evenly over time. How many records travel in
one Produce request depends on the client's in-flight limit: with confluent-kafka's defaults (no
idempotence, up to 1,000,000 requests in flight) it sends what each linger window holds, a few
records, without waiting for answers; with enable.idempotence=true (the Java client's default) at
most 5 requests are in flight, so the records that wait meanwhile travel together. Both are run (`--producers`).

Printed per mode: how long the first write to every topic took (before the clock starts: readers
open, `log` topics claim their partitions); records/s offered and acked; ack latency p50/p99 (send -> delivery report); Delta
commits a second and records per commit (from /metrics); the server's CPU (cores, and microseconds
per record); and, for `log` topics, the table lag (the oldest unflushed ack, max over topics, sampled
every second). DESIGN.md's envelope says commits are the budget: this shows where it binds.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Producer

from bench.common import cpu_seconds, metric_total, percentile, print_table, write_results
from tests.e2e.server import ServerProcess

MODES = ("table", "log")
VALUE = b"x" * 100
_LAG = re.compile(r'^topiclake_table_lag_seconds\{topic="[^"]*"\} ([0-9.eE+-]+)$', re.M)


def create_topics(url: str, names: list[str], mode: str, lag_ms: int | None = None) -> float:
    """Create the topics over four connections; returns the seconds it took."""
    start = time.perf_counter()
    config = {"topiclake.ack.mode": mode} | ({"topiclake.table.max.lag.ms": str(lag_ms)} if lag_ms else {})

    def make(part: list[str]) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            for name in part:
                r = c.post("/topics", json={"name": name, "partitions": 1, "config": config})
                if r.status_code != 201:
                    raise RuntimeError(f"creating {name}: {r.status_code} {r.text}")

    threads = [threading.Thread(target=make, args=(names[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


class Sampler(threading.Thread):
    """Reads /metrics every second: Delta commits, records committed, and the largest table lag."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.lags = url, threading.Event(), []

    def totals(self) -> tuple[float, float]:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        return metric_total(text, "topiclake_commits_total"), metric_total(text, "topiclake_records_in_total")

    def run(self) -> None:
        while not self.stop.wait(1.0):
            text = httpx.get(self.url + "/metrics", timeout=30).text
            self.lags.append(max((float(v) for v in _LAG.findall(text)), default=0.0) * 1000)


def drive(
    bootstrap: str,
    topics: list[str],
    rate: float,
    warmup: float,
    seconds: float,
    srv: ServerProcess,
    *,
    idempotent: bool,
) -> dict:
    """Send `rate` records/s to each topic for warmup + seconds; measure over the last `seconds`."""
    assert srv.proc is not None
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            "message.timeout.ms": 120_000,
            "enable.idempotence": idempotent,
        }
    )
    latencies: list[float] = []
    failed = [0]
    measuring = [False]

    def report(sent: float) -> Any:
        def cb(err: Any, _msg: Any) -> None:
            if err is not None:
                failed[0] += measuring[0]  # (not what the purge at the end drops)
            elif measuring[0]:
                latencies.append((time.perf_counter() - sent) * 1000)

        return cb

    # every topic's first write first (its reader opens; on `log` topics its partition is claimed,
    # a Delta commit each): a one-time cost, reported apart from the steady state measured below
    primed = time.perf_counter()
    for name in topics:
        producer.produce(name, VALUE)
    producer.flush(600)
    first_writes_s = time.perf_counter() - primed
    total_rate = rate * len(topics)
    tick = 0.01
    start = time.perf_counter()
    sampler = Sampler(srv.url)
    sent = i = 0
    cpu0 = commits0 = records0 = t0 = 0.0
    while True:
        now = time.perf_counter()
        if not measuring[0] and now - start >= warmup:
            measuring[0] = True
            cpu0, t0 = cpu_seconds(srv.proc.pid), now
            commits0, records0 = sampler.totals()
            sent = 0
            sampler.start()
        if now - start >= warmup + seconds:
            break
        due = int((now - start) * total_rate)  # records that should have been sent by now
        while i < due:
            producer.produce(topics[i % len(topics)], VALUE, on_delivery=report(time.perf_counter()))
            i += 1
            sent += measuring[0]
        producer.poll(0)
        time.sleep(max(0.0, tick - (time.perf_counter() - now)))
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds(srv.proc.pid) - cpu0
    commits, records = sampler.totals()
    sampler.stop.set()
    sampler.join()
    measuring[0] = False
    producer.poll(0)
    producer.purge()  # what a saturated run still holds is not measured: drop it
    producer.flush(10)
    acked_s = len(latencies) / elapsed
    return {
        "first_writes_s": first_writes_s,
        "offered_s": sent / elapsed,
        "acked_s": acked_s,
        "failed": failed[0],
        "ack_p50_ms": percentile(latencies, 50),
        "ack_p99_ms": percentile(latencies, 99),
        "commits_s": (commits - commits0) / elapsed,
        "records_per_commit": (records - records0) / max(commits - commits0, 1),
        "server_cores": cpu / elapsed,
        "cpu_us_per_record": cpu / max(acked_s * elapsed, 1) * 1e6,
        "table_lag_p50_ms": percentile(sampler.lags, 50) if sampler.lags else 0.0,
        "table_lag_p99_ms": percentile(sampler.lags, 99) if sampler.lags else 0.0,
    }


def one_run(args: argparse.Namespace, mode: str, kind: str, seconds: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="topiclake-topics-bench-", dir=os.environ.get("BENCH_TMP")))
    srv = ServerProcess(work / "data").start()
    assert srv.proc is not None
    try:
        names = [f"{mode}-{i:05d}" for i in range(args.topics)]
        made = create_topics(srv.url, names, mode, args.lag_ms if mode == "log" else None)
        print(f"{mode}: {args.topics} topics created in {made:.1f} s", flush=True)
        spy = None
        if os.environ.get("BENCH_PROFILE"):  # py-spy the server meanwhile: BENCH_PROFILE=<path prefix>
            spy = subprocess.Popen(
                ["py-spy", "record", "-p", str(srv.proc.pid), "-d", str(int(seconds) + 5), "-o",
                 f"{os.environ['BENCH_PROFILE']}.{mode}.{kind}.txt", "-f", "raw", "--nonblocking"]
            )  # fmt: skip
        r = drive(srv.kafka, names, args.rate, 5.0, seconds, srv, idempotent=kind == "idempotent")
        if spy is not None:
            spy.wait(60)
        return r
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.many_topics_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=10.0, help="records a second per topic")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--lag-ms", type=int, help="topiclake.table.max.lag.ms of the log topics (default: its default)")
    ap.add_argument(
        "--producers",
        nargs="+",
        choices=("plain", "idempotent"),
        default=["plain", "idempotent"],
        help="confluent-kafka's default (many small requests in flight), and enable.idempotence=true (5 in flight)",
    )
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = ap.parse_args(argv)
    seconds = args.seconds or (10.0 if args.quick else 25.0)
    rows: list[dict[str, Any]] = []
    for mode in args.modes:
        for kind in args.producers:
            # a server of its own for each run: a saturated run leaves a backlog behind for minutes
            r = one_run(args, mode, kind, seconds)
            rows.append({"mode": mode, "producer": kind, "topics": args.topics, "rate_per_topic": args.rate, **r})
            print(f"{mode}, {kind}: {r}", flush=True)
    columns = [
        "mode",
        "producer",
        "first_writes_s",
        "offered_s",
        "acked_s",
        "ack_p50_ms",
        "ack_p99_ms",
        "commits_s",
        "records_per_commit",
        "server_cores",
        "cpu_us_per_record",
        "table_lag_p50_ms",
        "table_lag_p99_ms",
    ]
    print(f"\n## {args.topics} topics x {args.rate:g} records/s (100 B, acks=all, confluent-kafka)\n")
    print_table(rows, columns)
    write_results("many_topics_bench", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
