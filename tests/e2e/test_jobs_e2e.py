"""The maintenance jobs beside live traffic, after crashes, and scheduled by `topiclake serve`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import REPO, ServerProcess
from tests.e2e.test_consumer_group_e2e import read_out, stable_members, wait_for
from topiclake import AdminClient, Producer

pytestmark = pytest.mark.slow


def cli(*args, env=None, timeout=180):
    out = subprocess.run(
        [sys.executable, "-m", "topiclake", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def workers(url, group, topic, outs, session_ms=3000):
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.consumer_worker", url, group, topic, str(o), str(session_ms)],
            cwd=REPO,
            stderr=subprocess.DEVNULL,
        )
        for o in outs
    ]


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(10)


def fetch_all(url, topic, partition):
    """Every record of a partition from its log start: (log start, [(offset, value)]). The server's
    own retention may move the log start while this reads: then it reads again from the new one."""
    for _ in range(10):
        info = httpx.get(f"{url}/topics/{topic}").json()
        po = next(p for p in info["partition_offsets"] if p["partition"] == partition)
        rows, offset = [], po["log_start_offset"]
        while offset < po["high_watermark"]:
            r = httpx.get(
                f"{url}/topics/{topic}/partitions/{partition}/records",
                params={"offset": offset, "max_records": 5000, "value_format": "string"},
            )
            if r.status_code == 416 and r.json()["error"]["details"]["log_start_offset"] > po["log_start_offset"]:
                break  # retention removed a prefix meanwhile
            assert r.status_code == 200, r.text
            body = r.json()
            rows += [(rec["offset"], rec["value"]) for rec in body["records"]]
            offset = body["next_offset"]
        else:
            return po["log_start_offset"], rows
    raise AssertionError(f"{topic}-{partition}: its log start kept moving while it was read")


class LiveProducer(threading.Thread):
    """Sends numbered records until stopped; remembers every ack and every error."""

    def __init__(self, url, topic):
        super().__init__(daemon=True)
        self.url, self.topic = url, topic
        self.stop_flag = threading.Event()
        self.acked: dict[tuple[int, int], str] = {}
        self.errors: list[BaseException] = []

    def run(self):
        with Producer(self.url, linger_ms=5, value_format="string") as p:
            i = 0
            while not self.stop_flag.is_set():
                futs = [(f"v{j}", p.send(self.topic, f"v{j}", key=f"k{j % 97}")) for j in range(i, i + 50)]
                i += 50
                for value, f in futs:
                    try:
                        md = f.result(30)
                        self.acked[(md.partition, md.offset)] = value
                    except BaseException as exc:
                        self.errors.append(exc)
                time.sleep(0.02)


def test_every_job_runs_beside_a_live_producer_and_consumer_group(tmp_path):
    srv = ServerProcess(tmp_path / "data", env={"TOPICLAKE_WRITER__ROLLUP_BASE_BYTES": "1"}).start()
    replica = tmp_path / "replica"
    procs = []
    try:
        AdminClient(srv.url).create_topic("live", partitions=3, config={"retention.bytes": 20_000})
        outs = [tmp_path / f"c{i}.txt" for i in range(2)]
        procs = workers(srv.url, "live-group", "live", outs)
        wait_for(lambda: stable_members(srv.url, "live-group") == 2, 60, "2 stable members")
        producer = LiveProducer(srv.url, "live")
        producer.start()
        wait_for(lambda: len(producer.acked) > 500, 60, "records flowing")
        starts = {p: fetch_all(srv.url, "live", p)[0] for p in range(3)}
        env = {"TOPICLAKE_ROOT": str(srv.root)}
        reports = {}
        for job in (["compaction"], ["retention"], ["rebalance"], ["replication", "--replica", str(replica)]):
            reports[job[0]] = json.loads(cli("jobs", *job, "--local", env=env).stdout)
            time.sleep(1)
        producer.stop_flag.set()
        producer.join(60)
        assert producer.errors == []  # no producer request failed
        assert (
            reports["compaction"]["topics"][0]["segments_after"] < reports["compaction"]["topics"][0]["segments_before"]
        )
        assert reports["retention"]["records_removed"] > 0
        assert reports["replication"]["records_copied"] > 0
        hw = {}
        for p in range(3):
            start, rows = fetch_all(srv.url, "live", p)
            offsets = [o for o, _ in rows]
            # invariant 1: unique, increasing, contiguous from the log start offset
            assert offsets == list(range(start, start + len(rows)))
            # invariant 7: retention removed a prefix; what remains is what was acked
            assert start >= starts[p]
            assert all(producer.acked[(p, o)] == v for o, v in rows if (p, o) in producer.acked)
            hw[p] = start + len(rows)
        # consumers: every offset they saw holds the acked value (invariant 6: compaction changed
        # nothing), and no gap: each partition's consumed offsets are contiguous up to the end
        wait_for(
            lambda: all(max((o for q, o, _ in read_out(outs) if q == p), default=-1) == hw[p] - 1 for p in range(3)),
            60,
            "consumers caught up",
        )
        seen = defaultdict(set)
        for p, o, v in read_out(outs):
            assert producer.acked.get((p, o), v) == v
            seen[p].add(o)
        for p in range(3):
            assert seen[p] == set(range(min(seen[p]), hw[p]))
    finally:
        stop_all(procs)
        srv.stop()


def test_rebalance_job_reassigns_a_dead_members_partitions_while_the_server_is_down(tmp_path):
    rebalance_while_the_server_is_down(tmp_path / "data", tmp_path)


def rebalance_while_the_server_is_down(root: Path | str, tmp_path: Path) -> None:
    """Also run by tests/s3 with the root in a bucket."""
    env = {
        "TOPICLAKE_SERVER__HEARTBEAT_PERSIST_INTERVAL_S": "0.2",
        "TOPICLAKE_SERVER__GROUPS_SYNC_INTERVAL_S": "0.2",
    }
    srv = ServerProcess(root, env=env).start()
    outs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    procs = []
    try:
        AdminClient(srv.url).create_topic("rb", partitions=4)
        procs = workers(srv.url, "rb-group", "rb", outs, session_ms=10_000)
        wait_for(lambda: stable_members(srv.url, "rb-group") == 2, 60, "2 stable members")
        before = httpx.get(f"{srv.url}/groups/rb-group").json()
        os.kill(procs[1].pid, signal.SIGKILL)  # consumer b dies; the server would notice after 10 s
        procs[1].wait()
        b_died = time.monotonic()
        time.sleep(6)
        srv.kill9()  # ... but dies first, 6 s later
        # The job must plan while b is silent for more than 10.4 s (session + persist and sync
        # intervals) and a (last seen at the crash, 6 s after b) for less: a 6-second window.
        time.sleep(max(0.0, 10.6 - (time.monotonic() - b_died)))
        report = json.loads(cli("jobs", "rebalance", "--local", "--root", str(srv.root), env=env).stdout)
        [g] = report["groups"]
        assert g["action"] == "expire" and len(g["expired"]) == 1 and g["generation"] == before["generation"] + 1
        srv.start()
        with Producer(srv.url, linger_ms=5, value_format="string") as p:
            for i in range(400):
                p.send("rb", f"after{i}", partition=i % 4)
        # the survivor owns all four partitions and reads what was produced after the restart
        wait_for(
            lambda: {v for _, _, v in read_out([outs[0]])} >= {f"after{i}" for i in range(400)},
            60,
            "survivor reads all",
        )
        info = httpx.get(f"{srv.url}/groups/rb-group").json()
        assert info["generation"] >= before["generation"] + 1 and len(info["members"]) == 1
    finally:
        stop_all(procs)
        srv.stop()


def test_replicate_lose_the_primary_promote_and_continue(tmp_path):
    srv = ServerProcess(tmp_path / "primary").start()
    replica = tmp_path / "replica"
    out = tmp_path / "c.txt"
    procs = []
    try:
        AdminClient(srv.url).create_topic("dr", partitions=2, config={"retention.ms": 604_800_000})
        with Producer(srv.url, linger_ms=5, value_format="string") as p:
            acked = {
                (m.partition, m.offset): f"v{i}"
                for i, m in enumerate([p.send("dr", f"v{i}", key=f"k{i}").result(30) for i in range(300)])
            }
        procs = workers(srv.url, "dr-group", "dr", [out])
        wait_for(lambda: len(read_out([out])) >= 300, 60, "group consumed 300")

        def committed_all() -> bool:  # the worker commits after it wrote a poll's records out
            lag = httpx.get(f"{srv.url}/groups/dr-group").json().get("lag", [])
            return sum(max(0, p["committed_offset"] or 0) for p in lag) >= 300

        wait_for(committed_all, 60, "group committed 300")
        stop_all(procs)  # the last commits are in
        committed = {
            p["partition"]: p["committed_offset"] for p in httpx.get(f"{srv.url}/groups/dr-group").json()["lag"]
        }
        cli("jobs", "replication", "--local", "--root", str(srv.root), "--replica", str(replica))
        hw = {
            p["partition"]: p["high_watermark"] for p in httpx.get(f"{srv.url}/topics/dr").json()["partition_offsets"]
        }
        srv.kill9()
        shutil.rmtree(srv.root)  # the primary is lost

        blocked = ServerProcess(replica)
        with pytest.raises(RuntimeError, match="replica promote"):
            blocked.start(timeout=30)
        cli("replica", "promote", "--root", str(replica))
        new = ServerProcess(replica).start()
        try:
            for p in range(2):
                _, rows = fetch_all(new.url, "dr", p)
                assert {(p, o): v for o, v in rows} == {k: v for k, v in acked.items() if k[0] == p}
            with Producer(new.url, linger_ms=5, value_format="string") as prod:
                mds = [prod.send("dr", f"new{i}", partition=i % 2).result(30) for i in range(10)]
            assert sorted({(m.partition, m.offset) for m in mds})[:1] == [(0, hw[0])]  # offsets continue
            assert min(m.offset for m in mds if m.partition == 1) == hw[1]
            # a 503 while the new gateway takes the group over is an answer clients retry
            wait_for(lambda: httpx.get(f"{new.url}/groups/dr-group").status_code != 503, 15, "the group described")
            resumed = httpx.get(f"{new.url}/groups/dr-group").json()
            assert "lag" in resumed, resumed
            assert {p["partition"]: p["committed_offset"] for p in resumed["lag"]} == committed
            out2 = tmp_path / "c2.txt"
            procs = workers(new.url, "dr-group", "dr", [out2])
            wait_for(lambda: len(read_out([out2])) >= 10, 60, "group resumed")
            time.sleep(1)
            assert sorted(v for _, _, v in read_out([out2])) == sorted(f"new{i}" for i in range(10))
        finally:
            stop_all(procs)
            new.stop()
    finally:
        stop_all(procs)
        srv.stop()


def test_serve_runs_the_jobs_in_a_separate_process_and_stops_it(tmp_path):
    env = {
        "TOPICLAKE_JOBS__SCHEDULE": "true",
        "TOPICLAKE_JOBS__COMPACTION_INTERVAL_S": "1",
        "TOPICLAKE_JOBS__RETENTION_INTERVAL_S": "1",
        "TOPICLAKE_JOBS__REBALANCE_INTERVAL_S": "1",
    }
    srv = ServerProcess(tmp_path / "data", env=env).start()
    try:
        AdminClient(srv.url).create_topic("sched", partitions=1)
        wait_for(
            lambda: all(
                f'"job": "{j}", "ok": true' in srv.log.read_text() for j in ("compaction", "retention", "rebalance")
            ),
            60,
            "each job ran once",
        )
        pid = int(srv.log.read_text().split("maintenance jobs scheduled (pid ")[1].split(")")[0])
        os.kill(pid, 0)  # alive beside the server
    finally:
        srv.stop()

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, 10, "the scheduler to exit with the server")
