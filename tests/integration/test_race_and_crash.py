"""Invariants 1-3 under real concurrency: two OS processes, and a writer killed with SIGKILL."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from delta_log import TopicWriter

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spawn(*args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.append_worker", *map(str, args)],
        cwd=ROOT_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def read_acks(path) -> list[tuple[int, int, str]]:
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path).read().splitlines():
        base, count, tag = line.split()
        out.append((int(base), int(count), tag))
    return out


def table_rows(storage, topic):
    t = storage.open_topic(topic).to_pyarrow_table(columns=["offset", "key"]).sort_by("offset")
    return t.column("offset").to_pylist(), [k.decode() for k in t.column("key").to_pylist()]


@pytest.mark.slow
def test_two_processes_same_partition(storage, topic_factory, tmp_path):
    topic = topic_factory()
    procs = [spawn(storage.root, topic, 0, 40, 25, tmp_path / f"acks{i}", f"w{i}") for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()[-2000:]
    offsets, keys = table_rows(storage, topic)
    assert offsets == list(range(2000))  # unique and contiguous
    assert len(set(keys)) == 2000  # nothing lost, nothing duplicated
    for i in range(2):
        for base, count, tag in read_acks(tmp_path / f"acks{i}"):
            # every acked range holds exactly that request's records
            assert {k.rsplit("-", 1)[0] for k in keys[base : base + count]} == {tag}


@pytest.mark.slow
def test_sigkill_mid_stream_loses_nothing_acked(storage, topic_factory, tmp_path, settings):
    topic = topic_factory()
    ack_file = tmp_path / "acks"
    proc = spawn(storage.root, topic, 0, 100000, 20, ack_file, "c")
    deadline = time.monotonic() + 60
    while len(read_acks(ack_file)) < 30 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    acks = read_acks(ack_file)
    assert len(acks) >= 30
    offsets, keys = table_rows(storage, topic)
    assert offsets == list(range(len(offsets)))  # contiguous, unique
    tags = Counter(k.rsplit("-", 1)[0] for k in keys)
    assert all(n == 20 for n in tags.values())  # no partial commit visible
    for base, _count, tag in acks:
        assert tags[tag] == 20 and keys[base].startswith(tag + "-")
    # reopening and appending continues at the right offset
    w = TopicWriter(storage, topic, settings.writer)
    from tests.integration.conftest import make_batch

    assert w.append(make_batch(1)).ranges[0].base_offset == len(offsets)
