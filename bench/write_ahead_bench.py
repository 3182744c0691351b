"""The produce path on `table` and `log` topics (issue 27), side by side with Apache Kafka, in one run.

    python -m bench.write_ahead_bench            # 3 alternating repeats
    python -m bench.write_ahead_bench --quick    # 1 repeat, shorter runs

Starts a real Kafka 4.x broker (bench/kafka_broker.py) and one `topiclake serve` on 127.0.0.1, and
for each mode (`topiclake.ack.mode` table, the default; log, the write-ahead tier) measures:
- throughput: Kafka's ProducerPerformance tool against the broker and against the listener (100 B
  and 1 KB, acks=all, linger.ms=5, batch.size=1 MiB), and Arrow IPC over HTTP (16 requests in
  flight, about 1 MB a request: 1,000 records of 1 KB, 10,000 of 100 B); the server's CPU seconds
  per million records;
- ack latency: HTTP produce requests of 10 records at 100, 250 and 500 requests/s, p50/p99 of the
  answer;
- send -> received: confluent-kafka producer (acks=all, linger.ms=5) and consumer at 500 records/s;
- table lag (log topics): from a request's ack until a Delta snapshot of the topic holds it, under
  Arrow IPC load;
- the disk alone: a small fsynced write at 500/s with no server (`fsync_floor`), the floor under a
  `log` topic's ack on this machine.
Results: bench/results/write_ahead_bench.json, printed as markdown tables with ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
from deltalake import DeltaTable

from bench.common import cpu_seconds, percentile, print_table, write_results
from bench.kafka_bench import PARTITIONS, kafka_latency, kafka_perf_tool, topiclake_arrow
from bench.kafka_broker import KafkaBroker
from tests.e2e.server import ServerProcess

MODES = ("table", "log")
CONNECTIONS = 32
ACK_RATES = (100, 250, 500)


def settle(pid: int, *, busy: float = 0.1, at_most_s: float = 20.0) -> None:
    """Wait until the server uses under `busy` of a core (its roll-ups and flushes of the run
    before are done), at most `at_most_s`: every run shares one server, and a run measured while
    the one before was still being flushed and merged got its figures too (a `log` topic's
    send -> received p99 of 134-280 ms after the Arrow runs, 21-39 ms on a quiet server).

    First, everything written so far goes to disk (`sync`): Kafka's broker writes its runs'
    gigabytes without fsync, and the kernel writes them back up to 30 s later, into the next runs'
    fsyncs (a `log` topic's send -> received p99 was 136 ms right after the broker's 600 MB and 15
    ms after a `sync` in one round; 24 and 25 ms in another)."""
    os.sync()
    deadline = time.monotonic() + at_most_s
    while time.monotonic() < deadline:
        c0 = cpu_seconds(pid)
        time.sleep(0.5)
        if (cpu_seconds(pid) - c0) / 0.5 < busy:
            return


def create(url: str, name: str, mode: str, partitions: int = PARTITIONS) -> None:
    config = {"topiclake.ack.mode": mode}
    httpx.post(f"{url}/topics", json={"name": name, "partitions": partitions, "config": config}).raise_for_status()


def ack_latency(url: str, topic: str, seconds: float, rate: float) -> list[float]:
    """HTTP produce requests of 10 records at `rate` requests/s, open loop over 32 keep-alive
    connections (one slow answer does not hold up the requests scheduled after it).

    The client is a minimal HTTP/1.1 one on asyncio (one thread, ~50 us a request): with httpx in
    32 threads the client's own GIL queue showed as tens of ms of p99, and Kafka's side of this
    comparison is measured with a C client."""
    return asyncio.run(_ack_latency(url, topic, seconds, rate))


async def _ack_latency(url: str, topic: str, seconds: float, rate: float) -> list[float]:
    parsed = urllib.parse.urlsplit(url)
    body = json.dumps({"records": [{"value": i} for i in range(10)]}).encode()
    head = (
        f"POST /topics/{topic}/records HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    conns = [await asyncio.open_connection(parsed.hostname, parsed.port) for _ in range(CONNECTIONS)]
    out: list[float] = []

    async def call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(head + body)
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        return status

    for reader, writer in conns:  # connected and warm before the clock starts
        await call(reader, writer)
    start = time.perf_counter() + 0.05

    async def loop(k: int) -> None:
        reader, writer = conns[k]
        i = k
        while (due := start + i / rate) - start <= seconds:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if await call(reader, writer) == 200:
                out.append((time.perf_counter() - due) * 1000)
            i += CONNECTIONS

    await asyncio.gather(*(loop(k) for k in range(CONNECTIONS)))
    for _, writer in conns:
        writer.close()
    return out


def fsync_floor(directory: Path, seconds: float, rate: float, frame_bytes: int = 1900) -> list[float]:
    """The disk alone: an fsynced write of one small frame at `rate` per second, open loop (ms from
    when each was due until it was durable), into a file written in place as the write-ahead log's
    segments are. No server, no Python beyond the loop: what an fsync per ack costs on this
    machine's disk, the floor under the HTTP ack latency of a `log` topic."""
    path = directory / "fsync-floor"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        span = 4 << 20
        os.pwrite(fd, bytes(span), 0)  # allocated and written once: the writes below grow nothing
        os.fsync(fd)
        frame, out, i, pos = os.urandom(frame_bytes), [], 0, 0
        start = time.perf_counter()
        while (due := start + i / rate) - start <= seconds:
            if (delay := due - time.perf_counter()) > 0:
                time.sleep(delay)
            os.pwrite(fd, frame, pos)
            os.fdatasync(fd)
            out.append((time.perf_counter() - due) * 1000)
            i, pos = i + 1, (pos + frame_bytes) % (span - frame_bytes)
        return out
    finally:
        os.close(fd)
        path.unlink()


def table_lag(url: str, root: Path, topic: str, seconds: float) -> list[float]:
    """Under Arrow IPC load: for sampled acks, ms from the ack until a fresh Delta snapshot's high
    watermark of the partition covers the acked offsets."""
    acks: list[tuple[float, int, int]] = []  # (ack time, partition, end offset)
    stop = threading.Event()

    def produce() -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                r = c.post(f"/topics/{topic}/records", json={"records": [{"value": "x" * 1000, "partition": 0}] * 100})
                if r.status_code == 200:
                    acks.append((time.perf_counter(), 0, r.json()["offsets"][-1]["offset"] + 1))

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for t in threads:
        t.start()
    dt = DeltaTable(str(root / "topics" / topic))
    seen: list[float] = []
    start = time.perf_counter()
    checked = 0
    while time.perf_counter() - start < seconds:
        dt.update_incremental()
        hw = dt.transaction_version("hw-0") or 0
        now = time.perf_counter()
        while checked < len(acks) and acks[checked][2] <= hw:
            seen.append((now - acks[checked][0]) * 1000)
            checked += 1
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.write_ahead_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int)
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    seconds = 3.0 if args.quick else 6.0
    latency_s = 5.0 if args.quick else 10.0
    work = Path(tempfile.mkdtemp(prefix="topiclake-wal-bench-", dir=os.environ.get("BENCH_TMP")))
    rows: list[dict[str, Any]] = []
    latency: list[dict[str, Any]] = []
    kafka = KafkaBroker(work / "kafka").start()
    srv = ServerProcess(work / "topiclake" / "data").start()
    assert srv.proc is not None
    try:
        for size in (100, 1024):
            tool_records = int((400_000 if size == 100 else 150_000) * seconds)
            kafka.create_topic(f"p{size}", partitions=PARTITIONS)
            for mode in MODES:
                create(srv.url, f"p{size}-{mode}", mode)
            for rep in range(repeats):
                r = kafka_perf_tool(kafka, f"p{size}", size, tool_records)
                rows.append(
                    {"workload": f"produce {size} B", "system": "Kafka ProducerPerformance", "repeat": rep, **r}
                )
                print(f"produce {size} B #{rep} Kafka: {r['records_s']:,.0f} records/s", flush=True)
                for mode in MODES:
                    topic = f"p{size}-{mode}"
                    runs: list[tuple[str, Any, tuple[Any, ...]]] = [
                        (f"listener ProducerPerformance, {mode}", kafka_perf_tool,
                         (kafka, topic, size, tool_records, srv.kafka)),
                        (f"Arrow IPC over HTTP, {mode}", topiclake_arrow, (srv.url, topic, size, seconds)),
                    ]  # fmt: skip
                    for system, fn, fn_args in runs:
                        settle(srv.proc.pid)
                        cpu0 = cpu_seconds(srv.proc.pid)
                        t0 = time.perf_counter()
                        r = fn(*fn_args)
                        elapsed = time.perf_counter() - t0
                        cpu = cpu_seconds(srv.proc.pid) - cpu0
                        r["cpu_s_per_million"] = cpu / max(r["records_s"] * elapsed, 1) * 1e6
                        rows.append({"workload": f"produce {size} B", "system": system, "repeat": rep, **r})
                        print(f"produce {size} B #{rep} {system}: {r['records_s']:,.0f} records/s", flush=True)

        kafka.create_topic("lat", partitions=1)
        series: dict[str, list[float]] = {}
        for mode in MODES:
            create(srv.url, f"lat-{mode}", mode, partitions=1)
            create(srv.url, f"ack-{mode}", mode, partitions=1)
        for system, bootstrap, topic in [("Kafka", kafka.bootstrap, "lat")] + [
            (f"listener, {m}", srv.kafka, f"lat-{m}") for m in MODES
        ]:
            settle(srv.proc.pid)
            got = kafka_latency(bootstrap, topic, latency_s, 500)
            for measure, values in got.items():
                series[f"{system}: {measure}"] = values
        for mode in MODES:
            for rate in ACK_RATES:  # 500 is the target; the lower rates show where the gateway saturates
                settle(srv.proc.pid)
                series[f"HTTP produce ack (10 records, {rate}/s), {mode}"] = ack_latency(
                    srv.url, f"ack-{mode}", latency_s, rate
                )
            if mode == "log":  # the same disk, just after: its stalls are the host's, not the gateway's
                settle(srv.proc.pid)
                series["the disk alone: a 1.9 KB pwrite + fdatasync at 500/s (floor of the log ack)"] = fsync_floor(
                    work, latency_s, 500
                )
        create(srv.url, "lag-log", "log", partitions=1)
        series["table lag after ack, log (4 x 100 KB requests in a loop)"] = table_lag(
            srv.url, work / "topiclake" / "data", "lag-log", latency_s
        )
        for name, values in series.items():
            latency.append(
                {
                    "measure": name,
                    "p50_ms": percentile(values, 50),
                    "p99_ms": percentile(values, 99),
                    "samples": len(values),
                }
            )
    finally:
        srv.stop()
        kafka.stop()
    shutil.rmtree(work, ignore_errors=True)

    def med(workload: str, system: str, key: str = "records_s") -> float:
        values = sorted(r[key] for r in rows if r["workload"] == workload and r["system"] == system)
        return values[len(values) // 2] if values else float("nan")

    medians = [
        {
            "workload": wl,
            "system": s,
            "records_s": med(wl, s),
            "MB_s": med(wl, s, "mb_s"),
            "cpu_s_per_million": med(wl, s, "cpu_s_per_million") if "cpu_s_per_million" in r else float("nan"),
        }
        for wl in dict.fromkeys(r["workload"] for r in rows)
        for s, r in {r["system"]: r for r in rows if r["workload"] == wl}.items()
    ]
    ratios = {}
    for size in (100, 1024):
        kafka_rate = med(f"produce {size} B", "Kafka ProducerPerformance")
        for mode in MODES:
            for system in (f"listener ProducerPerformance, {mode}", f"Arrow IPC over HTTP, {mode}"):
                ratios[f"{system} / Kafka ProducerPerformance ({size} B)"] = (
                    med(f"produce {size} B", system) / kafka_rate
                )
    print("\n## Produce (medians)\n")
    print_table(medians, ["workload", "system", "records_s", "MB_s", "cpu_s_per_million"])
    print("\n## Latency\n")
    print_table(latency, ["measure", "p50_ms", "p99_ms", "samples"])
    print("\n## Ratios\n")
    print_table([{"ratio": k, "value": v} for k, v in ratios.items()], ["ratio", "value"])
    write_results("write_ahead_bench", rows, {"medians": medians, "latency": latency, "ratios": ratios})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
