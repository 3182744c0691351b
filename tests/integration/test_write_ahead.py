"""`log` topics (topiclake.ack.mode=log) on a real root: acked once in the write-ahead log, seen by
readers at once, in the Delta table within the topic's max lag, exactly once after a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from delta_log import ProducerSequence
from delta_log.errors import OwnerNotAvailableError
from delta_log.log.wal import WAL_DIR, decode_frames, log_dirs
from delta_log.log.writer import AppendRequest
from delta_log.registry import TopicRegistry
from tests.integration.conftest import make_batch

LOG = {"topiclake.ack.mode": "log"}


def table_offsets(storage, topic) -> dict[int, list[int]]:
    t = DeltaTable(storage.topic_uri(topic)).to_pyarrow_table(columns=["partition", "offset"])
    out: dict[int, list[int]] = {}
    for p, o in zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True):
        out.setdefault(p, []).append(o)
    return {p: sorted(v) for p, v in out.items()}


@pytest.fixture
def registry(settings):
    r = TopicRegistry(settings)
    yield r
    r.close()


def log_topic(registry: TopicRegistry, partitions: int = 2, lag_ms: int = 60_000) -> str:
    name = f"log-{time.monotonic_ns() % 10**9}"
    registry.catalog.create_topic(name, partitions=partitions, config=LOG | {"topiclake.table.max.lag.ms": str(lag_ms)})
    return name


def test_acks_come_from_the_log_readers_see_them_at_once_and_the_table_within_the_lag(registry, storage):
    topic = log_topic(registry, lag_ms=1500)
    committer = registry.committer(topic)
    start = time.monotonic()
    results = [committer.submit(AppendRequest(batch=make_batch(10, partitions=2))).result(10) for _ in range(5)]
    acked = time.monotonic() - start
    assert [r.ranges[0].base_offset for r in results] == [0, 5, 10, 15, 20]
    assert acked < 1.0  # five acks, no Delta commit among them (a commit alone is ~30 ms; the lag 1.5 s)
    reader = registry.reader(topic)
    fetched = reader.fetch(0, 0, max_records=100)
    assert fetched.records.column("offset").to_pylist() == list(range(25)) and fetched.high_watermark == 25
    assert table_offsets(storage, topic) == {}  # the table has none of them yet
    deadline = time.monotonic() + 10
    while table_offsets(storage, topic) != {0: list(range(25)), 1: list(range(25))} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert table_offsets(storage, topic) == {0: list(range(25)), 1: list(range(25))}
    lag = time.monotonic() - start
    assert lag < 5, lag
    # the flushed segments are released (the one being written stays)
    wal = registry.write_ahead().wal
    assert wal.writes == 5


def test_idempotent_retries_are_answered_from_the_log_and_from_the_table(registry, storage):
    topic = log_topic(registry, lag_ms=60_000)
    committer = registry.committer(topic)
    producer = ProducerSequence(producer_id="p1", sequence=0)
    first = committer.submit(AppendRequest(batch=make_batch(4, partitions=2), producer=producer)).result(10)
    again = committer.submit(AppendRequest(batch=make_batch(4, partitions=2), producer=producer)).result(10)
    assert again.duplicate and again.ranges == first.ranges
    committer.close()  # flushes into the table
    assert table_offsets(storage, topic) == {0: [0, 1], 1: [0, 1]}
    registry.drop(topic)
    after = (
        registry.committer(topic).submit(AppendRequest(batch=make_batch(4, partitions=2), producer=producer)).result(10)
    )
    assert after.duplicate and after.ranges == first.ranges


WORKER = """
import os, sys, time
from conf import load_settings
from delta_log.registry import TopicRegistry
from delta_log.log.writer import AppendRequest
from tests.integration.conftest import make_batch
root, topic, acks = sys.argv[1:4]
registry = TopicRegistry(load_settings(root=root))
committer = registry.committer(topic)
with open(acks, "a", buffering=1) as out:
    for i in range(10_000):
        r = committer.submit(AppendRequest(batch=make_batch(7, partitions=3, key_prefix=f"r{i}-"))).result(30)
        out.write(" ".join(f"{x.partition}:{x.base_offset}:{x.count}" for x in r.ranges) + "\\n")
        os.fsync(out.fileno())
"""


def _run_worker(settings, topic: str, tmp_path: Path, acks_wanted: int, env: dict[str, str] | None = None) -> dict:
    """Start WORKER acking into `topic`, kill -9 it once it has `acks_wanted` acks; what it acked
    (partition -> offsets)."""
    acks = tmp_path / "acks.txt"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **(env or {})}
    proc = subprocess.Popen([sys.executable, str(script), settings.root, topic, str(acks)], env=env)
    deadline = time.monotonic() + 60
    while (not acks.exists() or len(acks.read_text().splitlines()) < acks_wanted) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    acked: dict[int, set[int]] = {}
    for line in acks.read_text().splitlines():
        for item in line.split():
            p, base, count = map(int, item.split(":"))
            acked.setdefault(p, set()).update(range(base, base + count))
    return acked


def _replay_until_complete(registry: TopicRegistry, timeout: float = 30) -> dict[str, int]:
    """Replay the dead worker's log; its partitions' leases end within the lease time."""
    written, complete = registry.replay_write_ahead()
    deadline = time.monotonic() + timeout
    while not complete and time.monotonic() < deadline:
        time.sleep(0.3)
        more, complete = registry.replay_write_ahead()
        for t, n in more.items():
            written[t] = written.get(t, 0) + n
    assert complete
    return written


def test_a_kill_between_ack_and_flush_loses_and_duplicates_nothing(registry, settings, storage, tmp_path):
    """A producer process acks into a `log` topic; kill -9 at a random moment; the next start
    replays the log: every acked record in the table once, offsets contiguous, and a second replay
    writes nothing."""
    topic = log_topic(registry, partitions=3, lag_ms=300)
    acked = _run_worker(settings, topic, tmp_path, 150)
    assert sum(len(v) for v in acked.values()) >= 150 * 7
    before = table_offsets(storage, topic)
    assert sum(map(len, before.values())) < sum(map(len, acked.values()))  # some acks were only in the log
    assert log_dirs(storage)
    written = _replay_until_complete(registry)
    assert written.get(topic, 0) > 0
    after = table_offsets(storage, topic)
    for p, offsets in after.items():
        assert offsets == list(range(len(offsets)))  # unique and contiguous
        assert acked.get(p, set()) <= set(offsets)  # every acked record is there
    assert registry.replay_write_ahead() == ({}, True)  # the dead process's log is gone once replayed
    assert not list((Path(settings.root) / WAL_DIR).glob("*/*.wal"))


def test_a_torn_frame_at_the_end_of_a_segment_is_ignored(registry, settings, storage, tmp_path):
    """The dead worker's log ends with a write cut short: the complete frames are replayed, the
    torn one is not (it was never acked)."""
    topic = log_topic(registry, partitions=3, lag_ms=60_000)
    acked = _run_worker(
        settings,
        topic,
        tmp_path,
        5,
        env={"TOPICLAKE_WRITER__WAL_LEASE_MS": "1000", "TOPICLAKE_WRITER__WAL_LEASE_MARGIN_MS": "300"},
    )
    (dead,) = [Path(d) for d in log_dirs(storage)]
    segment = max(dead.glob("*.wal"))
    data = segment.read_bytes()
    segment.write_bytes(data + data[: len(data) // 3])  # a write cut short by the crash
    whole: dict[int, set[int]] = {}  # what the complete frames hold (the kill may have come after an ack)
    for frame in decode_frames(data):
        for p, o in zip(frame.records["partition"].to_pylist(), frame.records["offset"].to_pylist(), strict=True):
            whole.setdefault(p, set()).add(o)
    _replay_until_complete(registry)
    after = {p: set(v) for p, v in table_offsets(storage, topic).items()}
    assert after == whole and all(acked[p] <= whole[p] for p in acked)
    assert not dead.exists()


def quick_leases(settings, lease_ms: int = 1000, margin_ms: int = 300):
    writer = settings.writer.model_copy(update={"wal_lease_ms": lease_ms, "wal_lease_margin_ms": margin_ms})
    return settings.model_copy(update={"writer": writer})


def test_switching_a_topic_back_to_table_acks_flushes_and_ends_the_leases(registry, storage):
    topic = log_topic(registry, partitions=2, lag_ms=60_000)
    first = registry.committer(topic).submit(AppendRequest(batch=make_batch(6, partitions=2))).result(10)
    registry.alter_config(topic, {"topiclake.ack.mode": "table"})
    assert table_offsets(storage, topic) == {0: [0, 1, 2], 1: [0, 1, 2]}  # flushed on the switch
    # the table path appends at once: the log's leases were ended, not left to expire
    second = registry.committer(topic).submit(AppendRequest(batch=make_batch(6, partitions=2))).result(10)
    assert [r.base_offset for r in first.ranges] == [0, 0] and [r.base_offset for r in second.ranges] == [3, 3]
    assert table_offsets(storage, topic) == {0: list(range(6)), 1: list(range(6))}


def test_a_lapsed_lease_taken_over_by_another_gateway_fences_the_first(settings, storage):
    """Two gateways, both alive: the first acks, goes quiet past its lease; the second claims the
    partition and acks; the first is refused from then on. Offsets stay unique and contiguous."""
    quick = quick_leases(settings)
    first, second = TopicRegistry(quick), TopicRegistry(quick)
    try:
        topic = log_topic(first, partitions=1, lag_ms=200)
        a = first.committer(topic).submit(AppendRequest(batch=make_batch(5))).result(10)
        time.sleep(1.5)  # flushed, then idle past its lease
        b = second.committer(topic).submit(AppendRequest(batch=make_batch(5))).result(10)
        assert (a.ranges[0].base_offset, b.ranges[0].base_offset) == (0, 5)
        with pytest.raises(OwnerNotAvailableError):
            first.committer(topic).submit(AppendRequest(batch=make_batch(5))).result(10)
        second.committer(topic).close()
        assert table_offsets(storage, topic) == {0: list(range(10))}
    finally:
        second.close()
        first.close()
