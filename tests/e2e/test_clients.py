"""topiclake.Producer, AdminClient and the CLI against a real server."""

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.server import REPO
from topiclake import AdminClient, Producer, TopiclakeClientError


def test_producer_batches_and_resolves_futures(server):
    admin = AdminClient(server.url)
    admin.create_topic("prod-t", partitions=2)
    seen = []
    with Producer(server.url, linger_ms=20, compression="gzip") as p:
        futs = [
            p.send("prod-t", {"i": i}, key=f"k{i % 7}", callback=lambda md, err: seen.append((md, err)))
            for i in range(500)
        ]
        p.flush()
        mds = [f.result(timeout=10) for f in futs]
    assert len(seen) == 500 and all(err is None for _, err in seen)
    per_partition = {}
    for md in mds:
        per_partition.setdefault(md.partition, []).append(md.offset)
    for offs in per_partition.values():
        assert sorted(offs) == list(range(len(offs)))  # no duplicates, no gaps
    info = admin.describe_topic("prod-t")
    assert sum(p["high_watermark"] for p in info["partition_offsets"]) == 500


def test_producer_arrow_batches_keep_every_field_and_the_keyed_partition(server):
    """The Producer sends Arrow IPC; what lands is what the JSON API would have stored."""
    import httpx

    admin = AdminClient(server.url)
    admin.create_topic("prod-fields", partitions=3)
    done = []
    with Producer(server.url, value_format="binary") as p:
        a = p.send("prod-fields", b"\x00\xffraw", key="user-1", headers={"h": "v"}, timestamp_ms=1_700_000_000_000)
        b = p.send("prod-fields", "text", partition=2)
        b.add_done_callback(lambda f: done.append(f.result().offset))
        ma, mb = a.result(10), b.result(10)
    assert mb.partition == 2 and done == [mb.offset] and b.done() and b.exception() is None
    with Producer(server.url) as pj:  # value_format json: the same bytes as POSTing JSON
        mj = pj.send("prod-fields", {"n": 1, "s": "é"}, key="user-1").result(10)
    r = httpx.post(
        f"{server.url}/topics/prod-fields/records", json={"records": [{"key": "user-1", "value": {"n": 1, "s": "é"}}]}
    ).json()
    assert r["offsets"][0]["partition"] == ma.partition == mj.partition  # murmur2 of the key, as Kafka
    import base64

    def get(md):
        return httpx.get(
            f"{server.url}/topics/prod-fields/partitions/{md.partition}/records",
            params={"offset": md.offset, "value_format": "binary", "max_records": 1},
        ).json()["records"][0]

    rec_a = get(ma)
    assert base64.b64decode(rec_a["value"]) == b"\x00\xffraw" and rec_a["key"] == "user-1"
    assert rec_a["headers"] == {"h": "v"} and rec_a["timestamp"] == 1_700_000_000_000
    assert base64.b64decode(get(mb)["value"]) == b"text"
    assert base64.b64decode(get(mj)["value"]) == b'{"n":1,"s":"\xc3\xa9"}'


def test_a_new_producer_sends_without_loading_pandas_or_the_server(server):
    """A fresh process's first requests: `pa.array` on Python objects imports pandas on first use
    (0.2-0.5 s here), and the server's package is the whole log; neither may stall them. Keys,
    nulls, a tombstone, explicit partitions and timestamps all travel as sent."""
    import httpx

    AdminClient(server.url).create_topic("prod-fresh", partitions=3)
    script = f"""
import sys
from topiclake import Producer
with Producer({server.url!r}, value_format="binary") as p:
    futs = [p.send("prod-fresh", b"v%d" % i, key=None if i % 3 else "k%d" % i) for i in range(30)]
    futs.append(p.send("prod-fresh", None, key="gone"))
    futs.append(p.send("prod-fresh", b"late", partition=1, timestamp_ms=1_700_000_000_000))
    for f in futs:
        md = f.result(30)
        print(md.partition, md.offset)
print(sorted(m for m in ("pandas", "delta_log.log", "delta_log.core.records", "deltalake") if m in sys.modules))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out[-1] == "[]", out[-1]
    placed = [tuple(map(int, line.split())) for line in out[:-1]]
    assert len(set(placed)) == 32 and placed[-1][0] == 1

    def record(partition, offset):
        return httpx.get(
            f"{server.url}/topics/prod-fresh/partitions/{partition}/records",
            params={"offset": offset, "value_format": "binary", "max_records": 1},
        ).json()["records"][0]

    first, tombstone, late = record(*placed[0]), record(*placed[30]), record(*placed[31])
    assert first["key"] == "k0" and first["value"] == "djA="  # b"v0"
    assert tombstone["key"] == "gone" and tombstone["value"] is None
    assert late["key"] is None and late["timestamp"] == 1_700_000_000_000


def test_producer_reports_errors(server):
    with Producer(server.url, retries=0) as p:
        fut = p.send("does-not-exist", 1)
        p.flush()
        with pytest.raises(TopiclakeClientError) as e:
            fut.result(timeout=10)
    assert e.value.code == "UNKNOWN_TOPIC"


def run_cli(server, *args, stdin=None):
    env = {**os.environ, "TOPICLAKE_URL": server.url}
    return subprocess.run(
        [sys.executable, "-m", "topiclake", *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_topics_and_produce(server, tmp_path):
    r = run_cli(server, "topics", "create", "cli-t", "--partitions", "2", "--config", "retention.ms=5000")
    assert r.returncode == 0, r.stderr
    assert "cli-t" in run_cli(server, "topics", "list").stdout.split()
    r = run_cli(server, "produce", "cli-t", stdin="one\ntwo\nthree\n")
    assert r.returncode == 0 and "produced 3 records" in r.stderr
    f = tmp_path / "in.txt"
    f.write_text("".join(f'k{i}:{{"n": {i}}}\n' for i in range(2000)))
    r = run_cli(
        server,
        "produce",
        "cli-t",
        str(f),
        "--key-separator",
        ":",
        "--value-format",
        "json",
        "--batch-size",
        "300",
        "--progress",
    )
    assert r.returncode == 0, r.stderr
    assert "100.0%" in r.stderr and "2,000 records" in r.stderr
    d = json.loads(run_cli(server, "topics", "describe", "cli-t").stdout)
    assert sum(p["high_watermark"] for p in d["partition_offsets"]) == 2003
    r = run_cli(server, "topics", "alter", "cli-t", "--partitions", "3", "--config", "cleanup.policy=compact")
    assert r.returncode == 0 and json.loads(r.stdout)["partitions"] == 3
    r = run_cli(server, "topics", "create", "bad name")
    assert r.returncode == 1 and "INVALID_TOPIC" in r.stderr
    assert run_cli(server, "topics", "delete", "cli-t").returncode == 0


def test_cli_consume_commits_only_what_it_printed(server):
    import httpx

    AdminClient(server.url).create_topic("cli-consume", partitions=2)
    with Producer(server.url, value_format="string") as p:
        for i in range(40):
            p.send("cli-consume", f"m{i}", partition=i % 2)
    r = run_cli(server, "consume", "cli-consume", "--group", "printers", "--from-beginning", "--max-records", "5")
    assert r.returncode == 0, r.stderr
    printed = r.stdout.split()
    assert len(printed) == 5
    committed = httpx.get(f"{server.url}/groups/printers/offsets").json()["offsets"]
    assert sum(o["offset"] for o in committed) == 5  # next run starts right after the last printed record
    r2 = run_cli(server, "consume", "cli-consume", "--group", "printers", "--max-records", "35")
    assert sorted(printed + r2.stdout.split()) == sorted(f"m{i}" for i in range(40))


def test_producer_merges_batches_that_filled_while_one_was_in_flight(server):
    """Small batches filled while the one before was in flight go together in the next request
    (up to max_request_bytes); every record's metadata still names its own offset."""
    import httpx

    AdminClient(server.url).create_topic("prod-merge", partitions=3)
    with Producer(server.url, value_format="string", batch_size=7, max_request_bytes=64 * 1024) as p:
        futs = [p.send("prod-merge", f"v{i}", partition=i % 3) for i in range(2000)]
        p.flush()
        mds = [f.result(timeout=10) for f in futs]
    for part in range(3):
        offsets = [md.offset for i, md in enumerate(mds) if i % 3 == part]
        assert all(md.partition == i % 3 for i, md in enumerate(mds))
        assert offsets == list(range(len(offsets)))  # the producer's order, no gap, no duplicate
        got = httpx.get(
            f"{server.url}/topics/prod-merge/partitions/{part}/records",
            params={"offset": 0, "max_records": 1000, "value_format": "string"},
        ).json()["records"]
        assert [r["value"] for r in got] == [f"v{i}" for i in range(part, 2000, 3)]


def test_producer_send_blocks_while_its_buffer_is_full_then_times_out():
    """A gateway that never answers: sends fill buffer_bytes, then send() blocks for max_block_ms
    and raises TimeoutError saying what to do (Kafka's buffer.memory and max.block.ms)."""
    import socket
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    p = Producer(url, value_format="binary", buffer_bytes=64 * 1024, max_block_ms=300, retries=0, request_timeout=5)
    assert p.max_request_bytes == p.batch_bytes == 64 * 1024  # each capped by what may wait
    try:
        for _ in range(15):
            p.send("t", b"x" * 4000)  # 60 KB of the 64 KB
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="buffer_bytes or max_block_ms"):
            p.send("t", b"x" * 8000)
        assert 0.25 <= time.monotonic() - t0 < 3
        with pytest.raises(ValueError, match="cannot fit buffer_bytes"):
            p.send("t", b"x" * 70_000)  # could never fit
    finally:
        silent.close()  # the request in flight fails; close() then returns
        p.close(timeout=10)


def test_producer_flush_from_a_callback_is_refused(server):
    AdminClient(server.url).create_topic("prod-cb", partitions=1)
    errors = []

    def cb(md, err):
        try:
            p.flush()
        except RuntimeError as exc:
            errors.append(str(exc))

    with Producer(server.url) as p:
        p.send("prod-cb", 1, callback=cb)
        p.flush()
    assert errors and "callback" in errors[0]


def test_a_raising_callback_or_a_bad_header_does_not_stop_the_producer(server):
    """What a callback raises is logged (as Kafka's producer does); a header key that is not a
    string, or a partition or timestamp that is not a 64-bit int, is refused at send(); records
    sent afterwards still go and resolve."""
    AdminClient(server.url).create_topic("prod-robust", partitions=1)
    with Producer(server.url, value_format="string") as p:
        p.send("prod-robust", "a", callback=lambda md, err: 1 / 0)
        with pytest.raises(TypeError, match="Header keys"):
            p.send("prod-robust", "b", headers={1: "x"})
        for bad in ({"timestamp_ms": 1.5e12}, {"timestamp_ms": 2**63}, {"partition": "0"}):
            with pytest.raises(TypeError, match="an int of 64 bits"):
                p.send("prod-robust", "b", **bad)
        p.flush(10)
        md = p.send("prod-robust", "c").result(10)
    assert md.offset == 1


def test_a_merged_request_stays_under_max_request_bytes_with_headers(server):
    """Records with headers count their headers: many small records with a 200-byte header, merged
    while a request is in flight, never make a request over max_request_bytes (the gateway would
    refuse it whole)."""
    AdminClient(server.url).create_topic("prod-headers", partitions=1)
    limit = 256 * 1024
    with Producer(server.url, value_format="binary", batch_size=50, max_request_bytes=limit, retries=0) as p:
        futs = [p.send("prod-headers", b"v", headers={"h": "x" * 200}) for _ in range(3000)]
        p.flush(60)
        assert [f.result(10).offset for f in futs] == list(range(3000))
    # the estimate against the body: 1,000 such records as one request's Arrow stream
    from topiclake.client import _ROW_BYTES, _Batch

    batch = _Batch("t", 0.0)
    for i in range(1000):
        batch.values.append(b"v")
        batch.keys.append(None)
        batch.headers[i] = [{"key": "h", "value": b"x" * 200}]
    estimate = 1000 * (1 + _ROW_BYTES + 1 + 200 + _ROW_BYTES)
    assert len(_Batch.to_arrow([batch])) <= estimate


class _Watching:
    """An httpx transport around the real one that records the produce requests in flight at once
    (by lane: their Producer-Id), to see what the Producer sends concurrently."""

    def __init__(self) -> None:
        import threading

        import httpx

        self._inner = httpx.HTTPTransport()
        self._lock = threading.Lock()
        self.now: list[str] = []
        self.peak = 0
        self.overlaps: list[tuple[str, ...]] = []  # lanes in flight together, when one lane was there twice

    def handle_request(self, request):
        lane = request.headers.get("producer-id")
        if lane is None:  # metadata reads
            return self._inner.handle_request(request)
        with self._lock:
            self.now.append(lane)
            self.peak = max(self.peak, len(self.now))
            if self.now.count(lane) > 1:
                self.overlaps.append(tuple(self.now))
        try:
            return self._inner.handle_request(request)
        finally:
            with self._lock:
                self.now.remove(lane)

    def close(self) -> None:
        self._inner.close()


def _watched_producer(url: str, **kw):
    import httpx

    p = Producer(url, **kw)
    watching = _Watching()
    p._http.close()
    p._http = httpx.Client(base_url=url, timeout=30, transport=watching)  # type: ignore[arg-type]
    return p, watching


@pytest.mark.parametrize("max_in_flight", [1, 4])
def test_producer_sends_partitions_side_by_side_and_each_partition_in_order(server, max_in_flight):
    """Kafka's max.in.flight with idempotence: requests of different partitions go at once (up to
    max_in_flight), never two of one partition, and each partition's records land in send order;
    keyed records land where the gateway (and Kafka) put the key: murmur2 over the partitions."""
    import httpx

    from delta_log.core.partitioner import partition_for_key

    topic = f"prod-lanes-{max_in_flight}"
    AdminClient(server.url).create_topic(topic, partitions=4)
    p, watching = _watched_producer(server.url, value_format="binary", linger_ms=2, max_in_flight=max_in_flight)
    keyed, keyless = [], []
    with p:
        for i in range(6000):
            key = f"k{i % 50}"
            keyed.append((key, i, p.send(topic, b"v%d" % i, key=key)))
            keyless.append((i, p.send(topic, b"n%d" % i)))
        p.flush(60)
    assert watching.overlaps == []  # a partition never had two requests out
    assert (watching.peak > 1) == (max_in_flight > 1) and watching.peak <= max_in_flight
    for key, _, fut in keyed:
        assert fut.result(10).partition == partition_for_key(key.encode(), 4)
    stored = {}
    for part in range(4):
        got = httpx.get(
            f"{server.url}/topics/{topic}/partitions/{part}/records",
            params={"offset": 0, "max_records": 20_000, "value_format": "binary"},
        ).json()["records"]
        assert [r["offset"] for r in got] == list(range(len(got)))
        stored[part] = [base64_text(r["value"]) for r in got]
    assert sum(map(len, stored.values())) == 12_000
    spread = {part for part, values in stored.items() if any(v.startswith("n") for v in values)}
    assert len(spread) > 1  # keyless records: one sticky partition at a time, not one for good
    for part, values in stored.items():  # each partition holds its records in send order
        assert [int(v[1:]) for v in values if v.startswith("v")] == sorted(
            i for key, i, f in keyed if f.result().partition == part
        )
        assert [int(v[1:]) for v in values if v.startswith("n")] == sorted(
            i for i, f in keyless if f.result().partition == part
        )


def base64_text(value: str) -> str:
    import base64

    return base64.b64decode(value).decode()


def test_producer_reads_a_grown_partition_count_and_a_topic_made_later(server):
    """The partition count is read when a topic is first sent to, and again after
    metadata_max_age_ms: keys then spread over the new partitions. A topic that does not exist yet
    is partitioned by the gateway (its sends fail as UNKNOWN_TOPIC) and read again once made."""
    import time

    from delta_log.core.partitioner import partition_for_key

    admin = AdminClient(server.url)
    admin.create_topic("prod-grow", partitions=1)
    with Producer(server.url, metadata_max_age_ms=300, retries=0) as p:
        assert {p.send("prod-grow", i, key=f"k{i}").result(10).partition for i in range(40)} == {0}
        admin.add_partitions("prod-grow", 4)
        time.sleep(0.4)
        mds = [(f"k{i}", p.send("prod-grow", i, key=f"k{i}")) for i in range(40)]
        assert all(f.result(10).partition == partition_for_key(k.encode(), 4) for k, f in mds)
        assert {f.result().partition for _, f in mds} == {0, 1, 2, 3}
        with pytest.raises(TopiclakeClientError, match="UNKNOWN_TOPIC"):
            p.send("prod-later", 1).result(10)
        admin.create_topic("prod-later", partitions=2)
        time.sleep(1.1)  # an unknown topic is asked about again after a second
        assert p.send("prod-later", 2, key="a").result(10).partition == partition_for_key(b"a", 2)
