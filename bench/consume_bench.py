"""Consume benchmark (issue 4): a real `topiclake serve` on 127.0.0.1.

    python -m bench.consume_bench [--records 1000000] [--seconds 10]

- Fetch throughput over HTTP (Arrow IPC): 100-byte values served from the tail cache (records/s),
  and 1 KB values from cold segments after a server restart (MB/s).
- End-to-end latency at 500 records/s: produce ack -> record received by a long-polling fetch
  consumer and by an SSE subscriber (p50 / p99).
Prints tables and writes bench/results/consume_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc

from bench.common import median, percentile, print_table, write_results
from tests.e2e.server import ServerProcess

ARROW = "application/vnd.apache.arrow.stream"


def json_values(n: int, value_size: int) -> list[bytes]:
    """JSON events of about `value_size` bytes that compress as such payloads do (parquet's snappy
    stores them at a fraction of their size), unlike random bytes."""
    out = []
    for i in range(n):
        event = {
            "event_id": f"{i:012d}",
            "user_id": (i * 7919) % 100_003,
            "type": ("page_view", "click", "purchase", "search")[i % 4],
            "url": f"https://shop.example/products/{(i * 31) % 5000}?ref=campaign-{i % 17}",
            "user_agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)",
            "ts": 1_764_000_000_000 + i,
        }
        raw = json.dumps(event).encode()
        pad = max(0, value_size - len(raw) - 12)
        out.append(raw[:-1] + b', "pad": "' + b"-" * pad + b'"}')
    return out


def load(url: str, topic: str, partitions: int, records: int, value_size: int, *, kind: str = "random") -> None:
    """Produce `records` over Arrow IPC, 50,000 a request: random bytes, or JSON events (`kind="json"`)."""
    per = 50_000
    if kind == "json":
        values = json_values(per, value_size)
    else:
        blob = os.urandom(per * value_size)
        values = [blob[i * value_size : (i + 1) * value_size] for i in range(per)]
    with httpx.Client(base_url=url, timeout=120) as c:
        sent = 0
        while sent < records:
            n = min(per, records - sent)
            t = pa.table(
                {"value": values[:n], "partition": pa.array([(sent + i) % partitions for i in range(n)], pa.int32())}
            )
            sink = pa.BufferOutputStream()
            with ipc.new_stream(sink, t.schema) as w:
                w.write_table(t)
            c.post(
                f"/topics/{topic}/records", content=sink.getvalue().to_pybytes(), headers={"Content-Type": ARROW}
            ).raise_for_status()
            sent += n


def fetch_all(
    url: str, topic: str, partitions: int, max_records: int, *, client: str = "httpx", max_bytes: int = 256 << 20
) -> tuple[int, int, float]:
    """Read every partition from offset 0 to its high watermark, one thread per partition.

    `client="http.client"` uses the standard library, which reads a body with one readinto where
    httpx's pure-Python HTTP/1.1 layer reads 64 KiB pieces (measured: 1.0-1.3 GB/s vs 0.5-0.8 GB/s
    on 10 MB responses): with httpx the client, not the server, caps the figure.
    """
    import http.client

    totals = [0, 0]
    lock = threading.Lock()
    host, port = url.removeprefix("http://").rsplit(":", 1)

    def one(p: int) -> None:
        path = f"/topics/{topic}/partitions/{p}/records"
        conn = http.client.HTTPConnection(host, int(port), timeout=120) if client == "http.client" else None
        hc = httpx.Client(base_url=url, timeout=120) if conn is None else None

        def get(offset: int) -> tuple[bytes, int, int]:  # body, next offset, high watermark
            query = f"offset={offset}&max_records={max_records}&max_bytes={max_bytes}"
            if conn is not None:
                conn.request("GET", f"{path}?{query}", headers={"Accept": ARROW})
                resp = conn.getresponse()
                body = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"fetch failed: {resp.status} {body[:300]!r}")
                return body, int(resp.getheader("X-Next-Offset") or 0), int(resp.getheader("X-High-Watermark") or 0)
            assert hc is not None
            r = hc.get(f"{path}?{query}", headers={"Accept": ARROW})
            r.raise_for_status()
            return r.content, int(r.headers["X-Next-Offset"]), int(r.headers["X-High-Watermark"])

        offset, recs, nbytes = 0, 0, 0
        try:
            while True:
                body, offset, hw = get(offset)
                table = ipc.open_stream(pa.BufferReader(body)).read_all()
                if table.num_rows == 0:
                    break
                recs += table.num_rows
                nbytes += pa.compute.sum(pa.compute.binary_length(table.column("value"))).as_py()
                if offset >= hw:
                    break
        finally:
            if conn is not None:
                conn.close()
            if hc is not None:
                hc.close()
        with lock:
            totals[0] += recs
            totals[1] += nbytes

    threads = [threading.Thread(target=one, args=(p,)) for p in range(partitions)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return totals[0], totals[1], time.perf_counter() - start


def e2e_latency(url: str, topic: str, seconds: float, rate: float) -> dict[str, list[float]]:
    """Produce `rate` records/s (batching producer); a long-poll consumer and an SSE subscriber time arrival."""
    sent_at: dict[int, float] = {}
    acked_at: dict[int, float] = {}
    received: dict[str, dict[int, float]] = {"long-poll fetch": {}, "SSE": {}}
    stop = threading.Event()

    def long_poll() -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            offset = 0
            while not stop.is_set():
                r = c.get(
                    f"/topics/{topic}/partitions/0/records",
                    params={"offset": offset, "max_wait_ms": 1000, "value_format": "string"},
                )
                now = time.perf_counter()
                for rec in r.json()["records"]:
                    received["long-poll fetch"][int(rec["value"])] = now
                offset = r.json()["next_offset"]

    def sse() -> None:
        try:
            with httpx.stream(
                "GET",
                f"{url}/topics/{topic}/partitions/0/stream",
                params={"offset": 0, "value_format": "string"},
                timeout=30,
            ) as resp:
                event = ""
                for line in resp.iter_lines():
                    if stop.is_set():
                        break
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "record":  # not the first `position` event
                        now = time.perf_counter()
                        received["SSE"][int(json.loads(line[6:])["value"])] = now
        except httpx.HTTPError:
            if not stop.is_set():  # the server going away after the measure ends the stream
                raise

    readers = [threading.Thread(target=long_poll, daemon=True), threading.Thread(target=sse, daemon=True)]
    for t in readers:
        t.start()
    time.sleep(0.5)
    from topiclake import Producer

    # Open loop through the batching Python producer (linger 2 ms), as a client sending 500
    # records/s would; latency counts from each record's scheduled send.
    with Producer(url, linger_ms=2, value_format="string") as producer:
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < seconds:
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent_at[i] = due
            producer.send(
                topic, str(i), partition=0, callback=lambda md, err, i=i: acked_at.__setitem__(i, time.perf_counter())
            )
            i += 1
    time.sleep(1.5)
    stop.set()
    out: dict[str, list[float]] = {}
    for consumer, times in received.items():
        out[f"{consumer}: send -> received"] = [(t - sent_at[i]) * 1000 for i, t in times.items() if i in sent_at]
        # the measure: from the producer's ack (after the commit) to the consumer having the record;
        # negative when the consumer got it before the ack travelled back
        out[f"{consumer}: ack -> received"] = [(t - acked_at[i]) * 1000 for i, t in times.items() if i in acked_at]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--cold-mb", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="topiclake-consume-"))
    rows = []
    srv = ServerProcess(work / "data").start()
    try:
        httpx.post(srv.url + "/topics", json={"name": "tail100", "partitions": 4}).raise_for_status()
        httpx.post(srv.url + "/topics", json={"name": "cold1k", "partitions": 4}).raise_for_status()
        httpx.post(srv.url + "/topics", json={"name": "latency", "partitions": 1}).raise_for_status()
        httpx.post(srv.url + "/topics", json={"name": "json1k", "partitions": 4}).raise_for_status()
        load(srv.url, "tail100", 4, args.records, 100)
        recs, nbytes, secs = fetch_all(srv.url, "tail100", 4, 100_000)
        rows.append(
            {
                "workload": "fetch Arrow, 100 B values, tail cache",
                "records": recs,
                "records_per_s": recs / secs,
                "MB_per_s": nbytes / 1e6 / secs,
            }
        )
        load(srv.url, "cold1k", 4, args.cold_mb * 1000, 1000)
        load(srv.url, "json1k", 4, args.cold_mb * 1000 // 2, 1000, kind="json")
    finally:
        srv.stop()
    srv = ServerProcess(work / "data", port=srv.port).start()  # cold: a new process, no caches
    try:
        recs, nbytes, secs = fetch_all(srv.url, "cold1k", 4, 20_000)
        rows.append(
            {
                "workload": "fetch Arrow, 1 KB values, cold segments",
                "records": recs,
                "records_per_s": recs / secs,
                "MB_per_s": nbytes / 1e6 / secs,
            }
        )
        # as Kafka's consumers ask: 1 MB a partition (max.partition.fetch.bytes), JSON that compresses
        recs, nbytes, secs = fetch_all(srv.url, "json1k", 4, 100_000, max_bytes=1 << 20)
        rows.append(
            {
                "workload": "fetch Arrow, 1 KB JSON values, cold segments, 1 MB fetches",
                "records": recs,
                "records_per_s": recs / secs,
                "MB_per_s": nbytes / 1e6 / secs,
            }
        )
        print_table(rows, ["workload", "records", "records_per_s", "MB_per_s"])
        lat = e2e_latency(srv.url, "latency", args.seconds, 500)
        lat_rows = [
            {
                "consumer": k,
                "received": len(v),
                "p50_ms": median(v),
                "p99_ms": percentile(v, 99),
                "max_ms": max(v) if v else float("nan"),
            }
            for k, v in lat.items()
        ]
        print("\n## End-to-end latency at 500 records/s (batching producer, linger 2 ms)")
        print_table(lat_rows, ["consumer", "received", "p50_ms", "p99_ms", "max_ms"])
        print(f"\nwritten: {write_results('consume_bench', rows + lat_rows, vars(args))}")
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
