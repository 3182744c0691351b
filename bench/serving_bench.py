"""Serving under careless and greedy clients (issue 19): a real `topiclake serve` on 127.0.0.1.

- Idle long-polls: N fetches waiting for records (max_wait_ms 30 s) on a quiet topic; the server's
  CPU while they wait, in % of one core (from /proc: user + system time over the window).
- Wake-up latency: W long-polls (1, 20, 100) wait on one partition; a produce is sent; the time
  from sending it to each long-poll's answer, commit included (p50, p99 over rounds).
- Greedy fetches: F concurrent fetches with max_bytes=2**62 of a partition holding ~120 MB; the
  server's peak RSS (VmHWM) and the slowest /healthz answer while they render.

`--compare DIR` runs the same scenarios against a server from another checkout (e.g. a worktree
of the previous main) in the same run, and prints after/before ratios: these machines are shared
and noisy, only side-by-side figures mean anything.

    python -m bench.serving_bench [--polls 500] [--compare /tmp/before]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import cpu_seconds, percentile, print_table, write_results
from tests.e2e.server import REPO, ServerProcess


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def idle_long_polls(url: str, pid: int, polls: int, window_s: float) -> dict[str, float]:
    limits = httpx.Limits(max_connections=polls + 10, max_keepalive_connections=polls + 10)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        hw = (await c.get("/topics/idle/offsets", params={"at": "latest"})).json()["partitions"][0]["offset"]

        async def poll() -> int:
            r = await c.get(
                "/topics/idle/partitions/0/records", params={"offset": hw, "max_wait_ms": 30_000, "max_records": 10}
            )
            return r.status_code

        tasks = [asyncio.create_task(poll()) for _ in range(polls)]
        await asyncio.sleep(3)  # all connected and waiting
        start_cpu, start = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(window_s)
        used = cpu_seconds(pid) - start_cpu
        elapsed = time.monotonic() - start
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"idle_cpu_pct_of_core": 100 * used / elapsed}


async def _raw_long_poll(port: int, path: str, done: list[float]) -> None:
    """One long-poll over a bare socket: httpx's own per-response cost (~10 ms under 100
    concurrent answers) would be measured instead of the server's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = b""
    while chunk := await reader.read(65536):
        data += chunk
    done.append(time.monotonic())
    writer.close()
    assert b" 200 " in data.split(b"\r\n", 1)[0] and b'"offset"' in data, data[:300]


async def wake_up(url: str, port: int, waiters: int, rounds: int) -> dict[str, float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        for _ in range(rounds):
            hw = (await c.get("/topics/wake/offsets", params={"at": "latest"})).json()["partitions"][0]["offset"]
            done: list[float] = []
            path = f"/topics/wake/partitions/0/records?offset={hw}&max_wait_ms=20000&max_records=10"
            tasks = [asyncio.create_task(_raw_long_poll(port, path, done)) for _ in range(waiters)]
            await asyncio.sleep(1.0)
            sent = time.monotonic()
            r = await c.post("/topics/wake/records", json={"records": [{"value": "wake", "partition": 0}]})
            assert r.status_code == 200, r.text
            await asyncio.gather(*tasks)
            latencies += [(t - sent) * 1000 for t in done]
    return {f"wake{waiters}_p50_ms": percentile(latencies, 50), f"wake{waiters}_p99_ms": percentile(latencies, 99)}


def greedy_fetches(url: str, pid: int, fetches: int) -> dict[str, float]:
    health: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while not stop.is_set():
                t = time.monotonic()
                c.get("/healthz")
                health.append((time.monotonic() - t) * 1000)
                time.sleep(0.05)

    def greedy(_: int) -> int:
        with httpx.Client(base_url=url, timeout=300) as c:
            r = c.get(
                "/topics/big/partitions/0/records",
                params={"offset": 0, "max_bytes": 2**62, "max_records": 1_000_000, "value_format": "binary"},
            )
            return len(r.content)

    before = rss_mb(pid)
    prober = threading.Thread(target=probe)
    prober.start()
    start = time.monotonic()
    threads = [threading.Thread(target=greedy, args=(i,)) for i in range(fetches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    stop.set()
    prober.join()
    return {
        "rss_before_mb": before,
        "peak_rss_mb": peak_rss_mb(pid),
        "healthz_max_ms": max(health),
        "greedy_s": elapsed,
    }


def create_topics(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        for name in ("idle", "wake", "big"):
            assert c.post("/topics", json={"name": name, "partitions": 1}).status_code == 201


def fill_big(url: str) -> None:
    value = "x" * 100_000
    with httpx.Client(base_url=url, timeout=300) as c:
        for _ in range(24):  # 24 x 50 x 100 kB = 120 MB in one partition
            body = {"records": [{"value": value, "partition": 0} for _ in range(50)]}
            assert c.post("/topics/big/records?value_format=string", json=body).status_code == 200


def run_one(repo: Path, label: str, args: argparse.Namespace) -> dict[str, float | str]:
    work = Path(tempfile.mkdtemp(prefix=f"serving-{label}-"))
    srv = ServerProcess(work / "data", repo=repo).start()
    try:
        assert srv.proc is not None
        pid = srv.proc.pid
        create_topics(srv.url)
        row: dict[str, float | str] = {"server": label}
        row.update(asyncio.run(idle_long_polls(srv.url, pid, args.polls, args.window)))
        for waiters in args.waiters:
            row.update(asyncio.run(wake_up(srv.url, srv.port, waiters, args.rounds)))
        fill_big(srv.url)  # last: its roll-ups would add CPU to the idle window
        row.update(greedy_fetches(srv.url, pid, args.fetches))
        return row
    finally:
        srv.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--polls", type=int, default=500)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--waiters", type=int, nargs="+", default=[1, 20, 100])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--fetches", type=int, default=4)
    p.add_argument("--compare", type=Path, help="another checkout (the 'before') to run side by side")
    args = p.parse_args()
    rows = [run_one(REPO, "this", args)]
    if args.compare:
        rows.append(run_one(args.compare, "compare", args))
        this, other = rows
        rows.append(
            {"server": "this/compare"}
            | {k: float(this[k]) / float(other[k]) for k in this if k != "server" and float(other[k])}
        )
    cols = [
        "server",
        "idle_cpu_pct_of_core",
        *(f"wake{w}_{q}_ms" for w in args.waiters for q in ("p50", "p99")),
        "rss_before_mb",
        "peak_rss_mb",
        "healthz_max_ms",
        "greedy_s",
    ]
    print_table(rows, cols)
    write_results("serving_bench", rows, {"polls": args.polls, "waiters": args.waiters, "fetches": args.fetches})


if __name__ == "__main__":
    main()
