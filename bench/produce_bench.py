"""Produce benchmark (issue 3): a real `topiclake serve` on 127.0.0.1, several client processes.

    python -m bench.produce_bench [--seconds 10] [--clients 4] [--compare <checkout of the previous main>]

- Arrow IPC, 1 KB values: MB/s sustained, beside a raw pyarrow.parquet write of the same records.
- JSON, 100-byte values: records/s.
- Ack latency at a fixed 500 requests/s of 10-record JSON batches: p50 / p99.
Prints a table and writes bench/results/produce_bench.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from bench.common import median, metric_total, percentile, print_table, write_results
from tests.e2e.server import REPO, ServerProcess

ARROW = "application/vnd.apache.arrow.stream"


def random_values(n: int, value_size: int) -> list[bytes]:
    """Incompressible values: repeated bytes would flatter every parquet writer."""
    blob = os.urandom(n * value_size)
    return [blob[i * value_size : (i + 1) * value_size] for i in range(n)]


def arrow_body(n: int, value_size: int, partitions: int, seed: int) -> bytes:
    t = pa.table(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": random_values(n, value_size),
            "partition": pa.array([(seed + i) % partitions for i in range(n)], pa.int32()),
        }
    )
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def json_body(n: int, value_size: int) -> bytes:
    return json.dumps(
        {
            "value_format": "string",
            "records": [{"value": os.urandom(value_size // 2).hex()} for _ in range(n)],
        }
    ).encode()


#: Requests each client keeps in flight (Kafka's producer allows 5 per connection by default).
IN_FLIGHT = 4


def _worker(url: str, topic: str, kind: str, seconds: float, out: mp.Queue) -> None:
    if kind == "arrow":
        body, headers, records = arrow_body(1000, 1024, 4, int(time.time())), {"Content-Type": ARROW}, 1000
    elif kind == "json":
        body, headers, records = json_body(1000, 100), {"Content-Type": "application/json"}, 1000
    else:
        body, headers, records = json_body(10, 100), {"Content-Type": "application/json"}, 10
    lat: list[float] = []
    sent = errors = 0
    lock = threading.Lock()

    def loop() -> None:  # one of IN_FLIGHT requests outstanding per client process
        nonlocal sent, errors
        with httpx.Client(base_url=url, timeout=30) as c:
            while time.perf_counter() - start < seconds:
                t0 = time.perf_counter()
                r = c.post(f"/topics/{topic}/records", content=body, headers=headers)
                with lock:
                    lat.append((time.perf_counter() - t0) * 1000)
                    if r.status_code == 200:
                        sent += records
                    else:
                        errors += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=loop) for _ in range(IN_FLIGHT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    out.put({"records": sent, "errors": errors, "seconds": elapsed, "latencies": lat, "body_bytes": len(body)})


async def _open_loop(url: str, topic: str, rate: float, seconds: float) -> dict:
    """Send 10-record JSON requests on a fixed schedule whatever the answers take (open loop).

    Raw HTTP/1.1 keep-alive sockets, so the generator itself stays cheap on a shared 2-core box;
    latency counts from each request's scheduled send time (no coordinated omission).
    """
    import asyncio
    from urllib.parse import urlparse

    u = urlparse(url)
    body = json_body(10, 100)
    head = (
        f"POST /topics/{topic}/records HTTP/1.1\r\nHost: {u.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    request = head + body
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    lat: list[float] = []
    errors = 0

    async def one(scheduled: float) -> None:
        nonlocal errors
        conn = idle.pop() if idle else await asyncio.open_connection(u.hostname, u.port)
        reader, writer = conn
        writer.write(request)
        await writer.drain()
        headers = await reader.readuntil(b"\r\n\r\n")
        status = int(headers.split(b" ", 2)[1])
        length = int(headers.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        lat.append((time.perf_counter() - scheduled) * 1000)
        errors += status != 200
        idle.append(conn)

    start = time.perf_counter()
    tasks = []
    i = 0
    while (now := time.perf_counter() - start) < seconds:
        due = i / rate
        if due > now:
            await asyncio.sleep(due - now)
        tasks.append(asyncio.create_task(one(start + due)))
        i += 1
    await asyncio.gather(*tasks)
    for _, w in idle:
        w.close()
    return {"requests": i, "seconds": time.perf_counter() - start, "latencies": lat, "errors": errors}


def _open_loop_worker(url: str, topic: str, rate: float, seconds: float, out: mp.Queue) -> None:
    import asyncio

    out.put(asyncio.run(_open_loop(url, topic, rate, seconds)))


def run_fixed_rate(url: str, topic: str, rate: float, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    p = ctx.Process(target=_open_loop_worker, args=(url, topic, rate, seconds, q))
    p.start()
    res = q.get(timeout=seconds + 120)
    p.join()
    return res


def run_clients(url: str, topic: str, kind: str, clients: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, topic, kind, seconds, q)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [q.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    wall = max(r["seconds"] for r in results)
    return {
        "records": sum(r["records"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "seconds": wall,
        "latencies": [x for r in results for x in r["latencies"]],
    }


def raw_parquet_mb_s(records: int, value_size: int) -> float:
    """The physical limit: pyarrow.parquet.write_table of the same records, same row groups."""
    n = 10_000
    t = pa.table(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": random_values(n, value_size),
            "offset": pa.array(range(n), pa.int64()),
        }
    )
    d = Path(tempfile.mkdtemp())
    try:
        loops = max(1, records // n)
        start = time.perf_counter()
        for i in range(loops):
            pq.write_table(t, d / f"{i}.parquet", row_group_size=8192)
        return loops * n * value_size / 1e6 / (time.perf_counter() - start)
    finally:
        shutil.rmtree(d)


def measure(args: argparse.Namespace, repo: Path, label: str) -> list[dict]:
    """Every workload against one server running `repo`'s code."""
    work = Path(tempfile.mkdtemp(prefix="topiclake-produce-"))
    srv = ServerProcess(work / "data", repo=repo).start()
    rows: list[dict] = []
    try:
        for name in ("arrow1k", "json100", "latency"):
            httpx.post(srv.url + "/topics", json={"name": name, "partitions": 4}).raise_for_status()
        arrow = run_clients(srv.url, "arrow1k", "arrow", args.clients, args.seconds)
        mb_s = arrow["records"] * 1024 / 1e6 / arrow["seconds"]
        raw = raw_parquet_mb_s(arrow["records"], 1024)
        rows.append(
            {
                "code": label,
                "workload": f"Arrow IPC 1 KB, {args.clients} clients",
                "records_per_s": arrow["records"] / arrow["seconds"],
                "MB_per_s": mb_s,
                "raw_parquet_MB_per_s": raw,
                "ratio_vs_raw": mb_s / raw,
                "p50_ms": median(arrow["latencies"]),
                "p99_ms": percentile(arrow["latencies"], 99),
                "errors": arrow["errors"],
            }
        )
        js = run_clients(srv.url, "json100", "json", args.clients, args.seconds)
        rows.append(
            {
                "code": label,
                "workload": f"JSON 100 B, {args.clients} clients",
                "records_per_s": js["records"] / js["seconds"],
                "MB_per_s": js["records"] * 100 / 1e6 / js["seconds"],
                "p50_ms": median(js["latencies"]),
                "p99_ms": percentile(js["latencies"], 99),
                "errors": js["errors"],
            }
        )
        lat = run_fixed_rate(srv.url, "latency", 500, args.seconds)
        rows.append(
            {
                "code": label,
                "workload": "JSON 10-record batches at 500 req/s (open loop)",
                "records_per_s": lat["requests"] * 10 / lat["seconds"],
                "p50_ms": median(lat["latencies"]),
                "p99_ms": percentile(lat["latencies"], 99),
                "errors": lat["errors"],
            }
        )
        metrics = httpx.get(srv.url + "/metrics").text
        commits = metric_total(metrics, "topiclake_commits_total")
        print(f"{label}: Delta commits during the run: {commits:.0f}")
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--compare", type=Path, help="another checkout to measure first (e.g. the previous main)")
    args = ap.parse_args(argv)
    rows = measure(args, args.compare, "before") if args.compare else []
    rows += measure(args, REPO, "this")
    print_table(
        rows,
        [
            "code",
            "workload",
            "records_per_s",
            "MB_per_s",
            "raw_parquet_MB_per_s",
            "ratio_vs_raw",
            "p50_ms",
            "p99_ms",
            "errors",
        ],
    )
    meta = {"seconds": args.seconds, "clients": args.clients, "compare": str(args.compare or "")}
    print(f"written: {write_results('produce_bench', rows, meta)}")


if __name__ == "__main__":
    main()
