"""Several gateways on one root (issue 12): real `topiclake serve` processes on 127.0.0.1.

- Produce scaling: Arrow batches of 100 B and 1 KB records into one 8-partition topic, through 1,
  2 and 4 gateway processes on this machine (clients spread over the gateways); records/s, MB/s,
  commits/s, commit conflicts/s and forwarded requests/s, the machine's CPU per record, and the
  ratio to one gateway. The load is 64 connections (each waits for its answer): measured, 16 (1 MiB
  in flight) left one gateway waiting on its commits, so the figure was a latency, not the capacity
  a second process could add to. It also prints the ceiling this machine puts on any ratio: its
  cores over the cores one gateway keeps busy. Twice per
  gateway count, in the same run: with partition owners (the default: each gateway appends only to
  the partitions it owns, forwarding the rest) and with `cluster.route_produce = false` (every
  gateway appends where the request arrives; Delta's transaction rule keeps offsets unique and
  conflicts cost retries). `--keyed` sends keyed records spread over all partitions instead (each
  request spans every owner, so it is appended where it arrives either way).
- Failover: a group of 2 consumers on 2 surviving gateways, its coordinator killed with kill -9;
  the time until the group answers Stable through a survivor (p50 and max over --kills rounds).
- Cross-gateway wake-up: a long-poll on gateway B, a produce through gateway A; produce sent ->
  long-poll answered, p50/p99.

    python -m bench.cluster_bench [--seconds 6] [--kills 5] [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc

from bench.common import median, metric_total, percentile, print_table, write_results
from bench.serving_bench import _raw_long_poll
from tests.e2e.server import ServerProcess
from topiclake import Consumer

FAST = {"TOPICLAKE_SERVER__GROUPS_SYNC_INTERVAL_S": "0.5"}  # membership: the defaults (1 s, 6 s timeout)


def start(n: int, root: Path, env: dict[str, str] | None = None) -> list[ServerProcess]:
    servers = [ServerProcess(root, env=FAST | (env or {})).start() for _ in range(n)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(len(httpx.get(s.url + "/cluster", timeout=5).json()["gateways"]) == n for s in servers):
            return servers
        time.sleep(0.2)
    raise RuntimeError("gateways did not see each other")


def arrow_batch(records: int, size: int, keyed: bool = False) -> bytes:
    """Random (incompressible) values: repeated bytes would flatter the parquet writer."""
    blob = os.urandom(records * size)
    columns = {"value": pa.array([blob[i * size : (i + 1) * size] for i in range(records)], pa.binary())}
    if keyed:
        columns["key"] = pa.array([f"k{i}".encode() for i in range(records)], pa.binary())
    table = pa.table(columns)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def json_batch(records: int, size: int, keyed: bool = False) -> bytes:
    values = os.urandom(records * size // 2).hex()
    rows = [{"value": values[i * size : (i + 1) * size], **({"key": f"k{i}"} if keyed else {})} for i in range(records)]
    return json.dumps({"records": rows}).encode()


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (every process: gateways, jobs, this client)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


async def _produce_connection(port: int, request: bytes, stop: float, counts: list[int]) -> None:
    """One keep-alive connection sending the same produce request back to back, over a bare
    socket: an HTTP client library's own per-request cost would load this 2-core machine's cores
    (which the gateways need) more than the requests do."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    ok = 0
    try:
        while time.monotonic() < stop:
            writer.write(request)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            if b" 200 " in status:
                ok += 1
            elif not status:
                break
    finally:
        writer.close()
    counts.append(ok)


def produce_scaling(
    gateways: int,
    size: int,
    seconds: float,
    *,
    owners: bool,
    batch_bytes: int,
    connections: int,
    keyed: bool = False,
    media: str = "arrow",
) -> dict[str, float]:
    """`connections` keep-alive connections in all, spread evenly over the gateways, each sending
    Arrow batches of about `batch_bytes` back to back."""
    root = Path(tempfile.mkdtemp(prefix="cluster-produce-")) / "data"
    servers = start(gateways, root, {"TOPICLAKE_CLUSTER__ROUTE_PRODUCE": str(owners).lower()})
    try:
        httpx.post(servers[0].url + "/topics", json={"name": "t", "partitions": 8}, timeout=30).raise_for_status()
        per_batch = max(1, batch_bytes // size)
        if media == "json":
            body, content_type = json_batch(per_batch, size, keyed), "application/json"
        else:
            body, content_type = arrow_batch(per_batch, size, keyed), "application/vnd.apache.arrow.stream"
        head = (
            "POST /topics/t/records?value_format=string HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        request = head.encode() + body
        counts: list[int] = []

        async def run() -> float:
            t0 = time.monotonic()
            stop = t0 + seconds
            await asyncio.gather(
                *(_produce_connection(servers[i % gateways].port, request, stop, counts) for i in range(connections))
            )
            return time.monotonic() - t0

        busy = _busy_seconds()
        elapsed = asyncio.run(run())
        busy = _busy_seconds() - busy
        records = sum(counts) * per_batch
        metrics = "".join(httpx.get(s.url + "/metrics", timeout=10).text for s in servers)
        return {
            "records_per_s": records / elapsed,
            "mb_per_s": records * size / elapsed / 1e6,
            "commits_per_s": metric_total(metrics, "topiclake_commits_total") / elapsed,
            "conflicts_per_s": metric_total(metrics, "topiclake_commit_conflicts_total") / elapsed,
            "forwarded_per_s": metric_total(metrics, "topiclake_produce_forwarded_total") / elapsed,
            "cpu_cores": busy / elapsed,
            "cpu_us_per_record": busy / records * 1e6 if records else float("nan"),
        }
    finally:
        for s in servers:
            s.stop()


def failover(kills: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="cluster-failover-")) / "data"
    servers = start(3, root)
    times: list[float] = []
    try:
        httpx.post(servers[0].url + "/topics", json={"name": "f", "partitions": 4}, timeout=30).raise_for_status()
        for k in range(kills):
            group = f"bench-{k}"
            view = httpx.get(servers[0].url + "/cluster", params={"group": group}, timeout=10).json()
            victim = next(
                s
                for s in servers
                if s.url == next(g["url"] for g in view["gateways"] if g["gateway_id"] == view["coordinator"])
            )
            others = [s for s in servers if s is not victim]
            consumers = [Consumer(s.url, group_id=group, session_timeout_ms=6000) for s in others]
            stop = threading.Event()

            def run(c: Consumer, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    try:
                        c.subscribe(["f"])
                        break
                    except Exception:
                        time.sleep(0.2)
                while not stop.is_set():
                    try:
                        c.poll(0.2)
                    except Exception:
                        time.sleep(0.2)

            threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in consumers]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and not (
                len({c.generation for c in consumers}) == 1 and sum(len(c.assignment()) for c in consumers) == 4
            ):
                time.sleep(0.1)
            t0 = time.monotonic()
            assert victim.proc is not None
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait(10)
            while time.monotonic() - t0 < 60:
                try:
                    r = httpx.get(others[0].url + f"/groups/{group}", timeout=5)
                    if r.status_code == 200 and r.json()["state"] == "Stable" and len(r.json()["members"]) == 2:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            times.append(time.monotonic() - t0)
            stop.set()
            for t in threads:
                t.join(10)
            for c in consumers:
                c.close()
            victim.start()
            time.sleep(2)
    finally:
        for s in servers:
            s.stop()
    return {"failover_p50_s": median(times), "failover_max_s": max(times)}


async def _cross_wake(a: ServerProcess, b: ServerProcess, rounds: int) -> list[float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=30) as c:
        for _ in range(rounds):
            hw = (await c.get(b.url + "/topics/w/offsets")).json()["partitions"][0]["offset"]
            done: list[float] = []
            task = asyncio.create_task(
                _raw_long_poll(b.port, f"/topics/w/partitions/0/records?offset={hw}&max_wait_ms=20000", done)
            )
            await asyncio.sleep(0.5)
            sent = time.monotonic()
            (await c.post(a.url + "/topics/w/records", json={"records": [{"value": 1}]})).raise_for_status()
            await task
            latencies.append((done[0] - sent) * 1000)
    return latencies


def cross_gateway_wake(rounds: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="cluster-wake-")) / "data"
    a, b = start(2, root)
    try:
        httpx.post(a.url + "/topics", json={"name": "w", "partitions": 1}, timeout=30).raise_for_status()
        lat = asyncio.run(_cross_wake(a, b, rounds))
        return {"cross_wake_p50_ms": percentile(lat, 50), "cross_wake_p99_ms": percentile(lat, 99)}
    finally:
        a.stop()
        b.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--gateways", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--batch-kb", type=int, default=64, help="Arrow request size (default 64 KiB)")
    p.add_argument(
        "--connections", type=int, default=64, help="client connections in all, spread over the gateways (default 64)"
    )
    p.add_argument("--keyed", action="store_true", help="keyed records over all partitions")
    p.add_argument("--produce-only", action="store_true")
    args = p.parse_args()
    rows: list[dict[str, float | str]] = []
    for size in args.sizes:
        base = None
        for n in args.gateways:
            for owners in (True, False) if n > 1 else (True,):
                r = produce_scaling(
                    n,
                    size,
                    args.seconds,
                    owners=owners,
                    batch_bytes=args.batch_kb * 1024,
                    connections=args.connections,
                    keyed=args.keyed,
                )
                base = base or r["records_per_s"]
                how = "" if n == 1 else (", owners" if owners else ", anywhere")
                figure = f"produce {size} B{' keyed' if args.keyed else ''}, {n} gateways{how}"
                rows.append({"figure": figure, **r, "vs_1": r["records_per_s"] / base})
    columns = [
        "figure",
        "records_per_s",
        "mb_per_s",
        "commits_per_s",
        "conflicts_per_s",
        "forwarded_per_s",
        "cpu_cores",
        "cpu_us_per_record",
        "vs_1",
    ]
    print_table(rows, columns)
    cores = len(os.sched_getaffinity(0))
    for size in args.sizes:
        one = next(
            (r for r in rows if r["figure"].startswith(f"produce {size} B") and ", 1 gateways" in r["figure"]), None
        )
        if one is None:  # --gateways without 1: no base to compare with
            continue
        print(
            f"{size} B: one gateway keeps {one['cpu_cores']:.2f} of {cores} cores busy (client included), so no "
            f"number of gateways can pass {cores / float(one['cpu_cores']):.2f}x here while a record costs the CPU "
            "it costs one gateway (busy time is the whole machine's: other load lowers this figure)"
        )
    if args.produce_only:
        write_results("cluster_bench", rows, vars(args))
        return
    other = {**failover(args.kills), **cross_gateway_wake(args.rounds)}
    print_table([other], list(other))
    write_results("cluster_bench", [*rows, other], vars(args))


if __name__ == "__main__":
    main()
