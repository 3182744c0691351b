"""1 producer, 3 consumer processes in one group; then one consumer is SIGKILLed."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.e2e.server import REPO
from topiclake import AdminClient, Producer


def read_out(paths):
    rows = []
    for p in paths:
        if os.path.exists(p):
            for line in open(p).read().splitlines():
                part, off, value = line.split(" ", 2)
                rows.append((int(part), int(off), value))
    return rows


def stable_members(url, group):
    import httpx

    r = httpx.get(f"{url}/groups/{group}")
    if r.status_code != 200 or r.json()["state"] != "Stable":
        return 0
    return len(r.json()["members"])


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_group_consumes_exactly_once_then_survives_a_kill(server, tmp_path):
    AdminClient(server.url).create_topic("e2e-group", partitions=6)
    outs = [tmp_path / f"c{i}.txt" for i in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.consumer_worker", server.url, "workers", "e2e-group", str(o), "3000"],
            cwd=REPO,
            stderr=subprocess.PIPE,
        )
        for o in outs
    ]
    try:
        wait_for(lambda: stable_members(server.url, "workers") == 3, 60, "3 stable members")
        with Producer(server.url, linger_ms=5, value_format="string") as p:
            for i in range(3000):
                p.send("e2e-group", f"v{i}", key=f"k{i % 50}")
        wait_for(lambda: len(read_out(outs)) >= 3000, 60, "3000 records consumed")
        rows = read_out(outs)
        assert len(rows) == 3000
        assert Counter(v for _, _, v in rows) == Counter(f"v{i}" for i in range(3000))  # each exactly once
        per_consumer = [{p for p, _, _ in read_out([o])} for o in outs]
        assert all(per_consumer) and not (per_consumer[0] & per_consumer[1]) and not (per_consumer[1] & per_consumer[2])

        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        with Producer(server.url, linger_ms=5, value_format="string") as p:
            for i in range(3000, 4500):
                p.send("e2e-group", f"v{i}", key=f"k{i % 50}")
        survivors = outs[1:]
        # the dead member's partitions move to the others within the session timeout; nothing is lost
        wait_for(
            lambda: {v for _, _, v in read_out(outs)} >= {f"v{i}" for i in range(4500)},
            60,
            "every record consumed after the kill",
        )
        after = read_out(survivors)
        assert {p for p, _, _ in after} == set(range(6))  # the survivors own every partition now
        counts = Counter(v for _, _, v in read_out(outs))
        assert all(counts[f"v{i}"] == 1 for i in range(3000, 4500))  # committed before the kill: no re-read
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(10)
