"""Several gateways on one root (issue 12): real `topiclake serve` processes on 127.0.0.1.

- Produce scaling: Arrow batches of 100 B and 1 KB records into one 8-partition topic, through 1,
  2 and 4 gateway processes on this machine (clients spread over the gateways); records/s and
  MB/s, and the ratio to one gateway. Every gateway writes every partition today (no partition
  owners yet): Delta's transaction rule keeps offsets unique; conflicts cost retries.
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
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc

from bench.common import median, percentile, print_table, write_results
from bench.serving_bench import _raw_long_poll
from tests.e2e.server import ServerProcess
from topiclake import Consumer

FAST = {"TOPICLAKE_SERVER__GROUPS_SYNC_INTERVAL_S": "0.5"}  # membership: the defaults (1 s, 6 s timeout)


def start(n: int, root: Path) -> list[ServerProcess]:
    servers = [ServerProcess(root, env=FAST).start() for _ in range(n)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(len(httpx.get(s.url + "/cluster", timeout=5).json()["gateways"]) == n for s in servers):
            return servers
        time.sleep(0.2)
    raise RuntimeError("gateways did not see each other")


def arrow_batch(records: int, size: int) -> bytes:
    table = pa.table({"value": pa.array([b"x" * size] * records, pa.binary())})
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def produce_scaling(gateways: int, size: int, seconds: float, clients_per_gateway: int = 2) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="cluster-produce-")) / "data"
    servers = start(gateways, root)
    try:
        httpx.post(servers[0].url + "/topics", json={"name": "t", "partitions": 8}, timeout=30).raise_for_status()
        body = arrow_batch(max(1, 512 * 1024 // size), size)
        per_batch = max(1, 512 * 1024 // size)
        counts: list[int] = []
        stop = time.monotonic() + seconds

        def client(url: str) -> None:
            n = 0
            with httpx.Client(base_url=url, timeout=60) as c:
                while time.monotonic() < stop:
                    r = c.post(
                        "/topics/t/records",
                        content=body,
                        headers={"Content-Type": "application/vnd.apache.arrow.stream"},
                    )
                    if r.status_code == 200:
                        n += per_batch
            counts.append(n)

        threads = [threading.Thread(target=client, args=(s.url,)) for s in servers for _ in range(clients_per_gateway)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        records = sum(counts)
        metrics = "".join(httpx.get(s.url + "/metrics", timeout=10).text for s in servers)
        commits = sum(
            float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("topiclake_commits_total{")
        )
        return {
            "records_per_s": records / elapsed,
            "mb_per_s": records * size / elapsed / 1e6,
            "commits_per_s": commits / elapsed,
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
    args = p.parse_args()
    rows: list[dict[str, float | str]] = []
    for size in (100, 1000):
        base = None
        for n in args.gateways:
            r = produce_scaling(n, size, args.seconds)
            base = base or r["records_per_s"]
            rows.append({"figure": f"produce {size} B, {n} gateways", **r, "vs_1": r["records_per_s"] / base})
    print_table(rows, ["figure", "records_per_s", "mb_per_s", "commits_per_s", "vs_1"])
    other = {**failover(args.kills), **cross_gateway_wake(args.rounds)}
    print_table([other], list(other))
    write_results("cluster_bench", [*rows, other], vars(args))


if __name__ == "__main__":
    main()
