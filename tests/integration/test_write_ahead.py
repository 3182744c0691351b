"""`log` topics (topiclake.ack.mode=log) on a real root: acked once in the write-ahead log, seen by
readers at once, in the Delta table within the topic's max lag, exactly once after a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from conf import load_settings
from delta_log import ProducerSequence
from delta_log.errors import OwnerNotAvailableError, PartitionRecoveringError, StorageUnavailableError
from delta_log.log.wal import WAL_DIR, decode_frames, log_dirs
from delta_log.log.writer import AppendRequest, TopicWriter
from delta_log.maintenance.compaction import compact_topic
from delta_log.maintenance.retention import apply_retention
from delta_log.registry import TopicRegistry
from delta_log.table.storage import StorageRoot
from tests.integration.conftest import make_batch
from tests.integration.test_compaction import keyed
from tests.integration.test_retention import old_batch

LOG = {"topiclake.ack.mode": "log"}
QUICK_LEASES = {"TOPICLAKE_WRITER__WAL_LEASE_MS": "1000", "TOPICLAKE_WRITER__WAL_LEASE_MARGIN_MS": "300"}


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


def log_topic(registry: TopicRegistry, partitions: int = 2, lag_ms: int = 60_000, **config: str) -> str:
    name = f"log-{time.monotonic_ns() % 10**9}"
    config = LOG | {"topiclake.table.max.lag.ms": str(lag_ms)} | {k.replace("_", "."): v for k, v in config.items()}
    registry.catalog.create_topic(name, partitions=partitions, config=config)
    return name


def test_acks_come_from_the_log_readers_see_them_at_once_and_the_table_within_the_lag(registry, storage):
    topic = log_topic(registry, lag_ms=1500)
    committer = registry.committer(topic)
    commit, flushing, go_on = committer.writer.commit_staged, threading.Event(), threading.Event()

    def held_commit(*args, **kwargs):  # the flush waits until the acks and reads below are checked
        flushing.set()
        assert go_on.wait(30)
        return commit(*args, **kwargs)

    committer.writer.commit_staged = held_commit
    start = time.monotonic()
    results = [committer.submit(AppendRequest(batch=make_batch(10, partitions=2))).result(10) for _ in range(5)]
    assert [r.ranges[0].base_offset for r in results] == [0, 5, 10, 15, 20]
    reader = registry.reader(topic)
    fetched = reader.fetch(0, 0, max_records=100)
    assert fetched.records.column("offset").to_pylist() == list(range(25)) and fetched.high_watermark == 25
    assert table_offsets(storage, topic) == {}  # acked and read, no commit of the table among them
    assert flushing.wait(10)  # the flush is due within half the lag of the first ack
    go_on.set()
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


@pytest.mark.parametrize("run_bytes", [1, 1 << 40], ids=["runs sliced", "rows sorted"])
def test_a_flush_of_many_acks_writes_each_partition_once_in_offset_order(registry, storage, monkeypatch, run_bytes):
    """The flush lines up each partition's runs of every ack, by slicing them (large runs) or by a
    stable sort (many small ones): files in offset order either way."""
    monkeypatch.setattr("delta_log.core.records.SLICED_RUN_BYTES", run_bytes)
    topic = log_topic(registry, partitions=3, lag_ms=60_000)
    committer = registry.committer(topic)
    for _ in range(6):
        committer.submit(AppendRequest(batch=make_batch(7, partitions=3))).result(10)
    committer.close()  # one flush, of all six acks
    dt = DeltaTable(storage.topic_uri(topic))
    assert len(dt.file_uris()) == 3  # one file per partition: one flush (the other commits are its leases)
    total = 0
    for uri in dt.file_uris():
        offsets = pq.read_table(uri.removeprefix("file://"), columns=["offset"]).column("offset").to_pylist()
        assert offsets == list(range(len(offsets))), uri  # every ack's records, in offset order in the file
        total += len(offsets)
    assert total == 6 * 7


def test_log_topics_flush_at_wal_flush_bytes_not_at_the_group_commits_batch(tmp_path):
    """A flush of a `log` topic waits for `wal_flush_bytes` (or half the lag): files of a
    `batch_bytes` flush would all be merged again by the roll-up."""
    settings = load_settings(root=str(tmp_path / "root"), writer={"batch_bytes": 4096, "wal_flush_bytes": 1 << 20})
    registry = TopicRegistry(settings)
    try:
        topic = log_topic(registry, partitions=1, lag_ms=60_000)
        committer = registry.committer(topic)
        for _ in range(8):  # 8 x ~2.5 KB: over batch_bytes, under wal_flush_bytes
            committer.submit(AppendRequest(batch=make_batch(10, value_size=250))).result(10)
        assert committer.flushes == 0
        for _ in range(400):  # 1 MiB more: the next write is due at once
            committer.submit(AppendRequest(batch=make_batch(10, value_size=250))).result(10)
        deadline = time.monotonic() + 10
        while committer.flushes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert committer.flushes >= 1
    finally:
        registry.close()


def test_acks_that_come_during_a_flush_wait_for_their_own_window(registry, storage):
    """What is acked while a flush commits is flushed half a lag after it was acked, not at once:
    one Delta commit a window, not a second of the few requests one flush takes to run."""
    topic = log_topic(registry, partitions=1, lag_ms=4000)
    committer = registry.committer(topic)
    writer = committer.writer
    commit, committing = writer.commit_staged, threading.Event()

    def slow_commit(*args, **kwargs):
        committing.set()
        time.sleep(0.3)  # a slow commit (the acks below come during it)
        return commit(*args, **kwargs)

    writer.commit_staged = slow_commit
    committer.submit(AppendRequest(batch=make_batch(2))).result(10)
    assert committing.wait(10)  # the first window's flush (half the lag: 2 s) is committing
    during = [committer.submit(AppendRequest(batch=make_batch(2))).result(10) for _ in range(2)]
    deadline = time.monotonic() + 10
    while committer.flushes < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert committer.flushes == 1 and table_offsets(storage, topic) == {0: [0, 1]}
    time.sleep(0.5)  # their window is not over yet (it ends about 1.7 s after the first flush): they wait
    assert committer.flushes == 1
    while committer.flushes < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert table_offsets(storage, topic) == {0: list(range(6))} and [r.ranges[0].base_offset for r in during] == [2, 4]


WORKER = """
import os, sys, time
from conf import load_settings
from delta_log.registry import TopicRegistry
from delta_log.log.writer import AppendRequest, TopicWriter
from delta_log.maintenance.compaction import compact_topic
from delta_log.maintenance.retention import apply_retention
from delta_log.table.storage import StorageRoot
from tests.integration.conftest import make_batch
from tests.integration.test_compaction import keyed
from tests.integration.test_retention import old_batch
from delta_log.errors import OwnerNotAvailableError
root, topic, acks = sys.argv[1:4]
registry = TopicRegistry(load_settings(root=root))
committer = registry.committer(topic)
if os.environ.get("WORKER_TABLE_DOWN"):  # every ack stays in the log alone, however slow the acks
    from tests.integration.test_write_ahead import storage_down
    storage_down(committer.writer)
with open(acks, "a", buffering=1) as out:
    for i in range(10_000):
        try:
            r = committer.submit(AppendRequest(batch=make_batch(7, partitions=3, key_prefix=f"r{i}-"))).result(30)
        except OwnerNotAvailableError:  # a lease that lapsed on a loaded machine: not acked, a client retries
            continue
        out.write(" ".join(f"{x.partition}:{x.base_offset}:{x.count}" for x in r.ranges) + "\\n")
        os.fsync(out.fileno())
"""


def _run_worker(
    settings, topic: str, tmp_path: Path, acks_wanted: int, env: dict[str, str] | None = None, table_down: bool = False
) -> dict:
    """Start WORKER acking into `topic`, kill -9 it once it has `acks_wanted` acks; what it acked
    (partition -> offsets). `table_down`: its table commits fail, so nothing it acks is flushed
    (with short leases a flush is due 0.35 s after the first ack, which a loaded machine outlasts)."""
    acks = tmp_path / "acks.txt"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **(env or {})}
    if table_down:
        env["WORKER_TABLE_DOWN"] = "1"
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


def test_a_dead_gateways_partitions_refuse_reads_until_replayed_and_are_replayed_at_once_when_known_dead(
    registry, settings, storage, tmp_path
):
    """A gateway killed while its leases run (30 s here): its partitions answer
    PartitionRecoveringError, never a high watermark below its acks, while the leases bind; once
    its process is known to have ended (the cluster's view: `gone_wal_owners`), its leases bind no
    one and the replay writes everything at once."""
    topic = log_topic(registry, partitions=3)
    long_leases = {"TOPICLAKE_WRITER__WAL_LEASE_MS": "30000", "TOPICLAKE_WRITER__WAL_LEASE_MARGIN_MS": "1500"}
    acked = _run_worker(settings, topic, tmp_path, 30, env=long_leases, table_down=True)
    assert table_offsets(storage, topic) == {}
    written, complete = registry.replay_write_ahead()
    assert (written, complete) == ({}, False)
    assert registry.recovering == {topic: frozenset(acked)}
    reader = registry.reader(topic)
    for p in acked:
        with pytest.raises(PartitionRecoveringError):
            reader.fetch(p, 0)
        with pytest.raises(PartitionRecoveringError):
            reader.high_watermark(p)
        with pytest.raises(PartitionRecoveringError):
            reader.resolve_offsets("latest", partitions=[p])
    with pytest.raises(PartitionRecoveringError):
        reader.partition_offsets()

    dead = [d.name for d in (Path(settings.root) / WAL_DIR).iterdir() if d.is_dir()]
    registry.gone_wal_owners = lambda: dead
    written, complete = registry.replay_write_ahead()
    assert complete and written[topic] >= sum(map(len, acked.values())) and registry.recovering == {}
    after = table_offsets(storage, topic)
    for p, offsets in acked.items():  # (a write durable but not yet acked when killed is there too)
        assert after[p] == list(range(len(after[p]))) and offsets <= set(after[p])
        assert reader.high_watermark(p) == len(after[p])
    # and this gateway takes the partitions over at once: the dead one's leases bind no one
    assert registry.committer(topic).submit(AppendRequest(batch=make_batch(3))).result(10).error is None


def test_a_torn_frame_at_the_end_of_a_segment_is_ignored(registry, settings, storage, tmp_path):
    """The dead worker's log ends with a write cut short: the complete frames are replayed, the
    torn one is not (it was never acked)."""
    topic = log_topic(registry, partitions=3, lag_ms=60_000)
    acked = _run_worker(settings, topic, tmp_path, 5, env=QUICK_LEASES, table_down=True)
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


@pytest.mark.parametrize("path", ["switched to table", "direct writer"])
def test_the_table_path_replays_a_dead_holders_log_before_it_appends(registry, settings, storage, tmp_path, path):
    """A gateway dies holding acks in its log; with no gateway replaying it, the topic is switched
    back to `table` (or a direct writer, as the Spark sink without a gateway, appends): the first
    append after the lease lapsed writes the dead gateway's acks first, then its own after them."""
    topic = log_topic(registry, partitions=3, lag_ms=60_000)
    acked = _run_worker(settings, topic, tmp_path, 20, env=QUICK_LEASES, table_down=True)
    assert table_offsets(storage, topic) == {}  # every ack is in the dead worker's log alone
    time.sleep(1.2)  # its leases lapse
    batch = make_batch(9, partitions=3, key_prefix="after-")
    if path == "switched to table":
        registry.alter_config(topic, {"topiclake.ack.mode": "table"})
        result = registry.committer(topic).submit(AppendRequest(batch=batch)).result(30)
    else:
        result = TopicWriter(storage, topic, settings.writer).append(batch)
    assert result.error is None, result.error
    after = table_offsets(storage, topic)
    bases = {r.partition: r.base_offset for r in result.ranges}
    for p in range(3):
        assert bases[p] >= len(acked[p])  # (a write may have been durable just before the kill, unacked)
        assert after[p] == list(range(bases[p] + 3)) and acked[p] <= set(after[p])
    assert TopicWriter(storage, topic, settings.writer).replay_write_ahead() == 0  # nothing left, nothing twice


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
        b = _submit_once_the_lease_lapsed(second, topic, make_batch(5))
        assert (a.ranges[0].base_offset, b.ranges[0].base_offset) == (0, 5)
        with pytest.raises(OwnerNotAvailableError):
            first.committer(topic).submit(AppendRequest(batch=make_batch(5))).result(10)
        second.committer(topic).close()
        assert table_offsets(storage, topic) == {0: list(range(10))}
    finally:
        second.close()
        first.close()


def _submit_once_the_lease_lapsed(registry: TopicRegistry, topic: str, batch, timeout: float = 20):
    """Submit, retrying while another gateway's lease still holds the partition (its last renewal,
    by a flush on a niced thread, may come late on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return registry.committer(topic).submit(AppendRequest(batch=batch)).result(10)
        except OwnerNotAvailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def storage_down(writer):
    """Make `writer`'s table commits fail (storage trouble); returns the healthy commit to put back."""
    healthy = writer.commit_staged

    def failing(*args, **kwargs):
        raise StorageUnavailableError("the storage is down (injected)")

    writer.commit_staged = failing
    return healthy


# -- the jobs on `log` topics: they work on the table, beside a flusher appending what was acked ------
def test_retention_beside_a_log_topics_acks_and_flushes(registry, storage, settings):
    topic = log_topic(registry, partitions=1, lag_ms=100, retention_ms="60000")
    committer = registry.committer(topic)
    hour_ago = int(time.time() * 1000) - 3_600_000
    for _ in range(5):
        committer.submit(AppendRequest(batch=old_batch(10, hour_ago, topic))).result(10)
    committer.flush_table()
    stop, acked, errors = threading.Event(), [], []

    def produce() -> None:
        try:
            while not stop.is_set():
                r = committer.submit(AppendRequest(batch=old_batch(5, int(time.time() * 1000), topic))).result(10)
                acked.append(r.ranges[0].base_offset)
        except Exception as exc:  # pragma: no cover - the assertion below shows it
            errors.append(exc)

    t = threading.Thread(target=produce)
    t.start()
    try:
        time.sleep(0.3)  # acks in the log, flushes under way
        report = apply_retention(storage, topic, settings.writer)
        time.sleep(0.3)
    finally:
        stop.set()
        t.join()
    committer.close()
    assert not errors and report.committed and report.records_removed == 50
    assert registry.reader(topic).log_start_offset(0) == 50
    end = max(acked) + 5
    assert table_offsets(storage, topic) == {0: list(range(50, end))}  # the old prefix went, every ack stayed


def test_key_compaction_of_a_log_topic_keeps_the_latest_per_key_at_its_offset(registry, storage, settings):
    topic = log_topic(registry, partitions=1, cleanup_policy="compact", delete_retention_ms="0")
    committer = registry.committer(topic)

    def ack_and_flush(keys: list[bytes], values: list[bytes | None]) -> None:
        committer.submit(AppendRequest(batch=keyed(keys, values, topic))).result(10)
        committer.flush_table()  # one segment per flush

    ack_and_flush([b"a", b"b", b"a", b"c"], [b"1", b"1", b"2", b"1"])
    ack_and_flush([b"b", b"c"], [b"2", None])
    ack_and_flush([b"a"], [b"3"])
    report = compact_topic(storage, topic, settings.writer, target_bytes=1 << 30)
    assert report.committed and report.records_removed == 5
    # acked after the compaction, read from the log's tail before the table holds it
    after = committer.submit(AppendRequest(batch=keyed([b"z"], [b"1"], topic))).result(10)
    assert after.ranges[0].base_offset == 7
    registry.drop(topic)  # a fresh reader: what the table and the tail hold, not a cache of before
    assert registry.reader(topic).fetch(0, 0, max_records=10).records.column("offset").to_pylist() == [4, 6, 7]


def test_replication_of_a_log_topic_copies_what_its_table_holds(registry, storage, settings, tmp_path):
    from jobs import replication

    topic = log_topic(registry, partitions=2, retention_ms="86400000")
    committer = registry.committer(topic)
    replica = StorageRoot(str(tmp_path / "replica"))
    jobs = settings.jobs.model_copy(update={"replica_root": replica.root})
    for _ in range(5):
        committer.submit(AppendRequest(batch=make_batch(40, partitions=2))).result(10)
    committer.flush_table()
    committer.submit(AppendRequest(batch=make_batch(10, partitions=2))).result(10)  # acked, not flushed
    first = replication.run(None, settings.model_copy(update={"jobs": jobs}))
    assert first.records_copied == 200  # what the table holds; the log's tail follows
    committer.flush_table()
    second = replication.run(None, settings.model_copy(update={"jobs": jobs}))
    assert second.records_copied == 10
    assert table_offsets(replica, topic) == table_offsets(storage, topic) == {0: list(range(105)), 1: list(range(105))}


def test_a_lease_renewed_while_acks_wait_for_the_table_keeps_their_offsets(settings, storage):
    """The table flush keeps failing (storage trouble), so the lease is renewed by a claim of its
    own while acked records are only in the log; the claim runs beside the writer thread, and the
    acks after it continue the offsets (the table's high watermark is behind the acks)."""
    registry = TopicRegistry(quick_leases(settings))
    try:
        topic = log_topic(registry, partitions=1, lag_ms=200)
        committer = registry.committer(topic)
        healthy = storage_down(committer.writer)
        bases = []
        for _ in range(8):  # 2 s: past a lease's renewal point, with nothing flushed
            bases.append(committer.submit(AppendRequest(batch=make_batch(5))).result(10).ranges[0].base_offset)
            time.sleep(0.25)
        assert committer.flush_failures > 0 and table_offsets(storage, topic) == {}
        assert bases == list(range(0, 40, 5))
        committer.writer.commit_staged = healthy
        committer.close()
        assert table_offsets(storage, topic) == {0: list(range(40))}
    finally:
        registry.close()


def test_a_slow_claim_does_not_hold_up_other_topics_acks(registry):
    """A topic's first write claims its partitions (a Delta commit, after replaying other
    gateways' logs): it runs on a lease thread, so the writer thread goes on acking other topics."""
    slow, fast = log_topic(registry, partitions=1), log_topic(registry, partitions=1)
    stuck = registry.committer(slow)
    with stuck._writer_lock:  # its claim waits here, as behind a slow storage
        waiting = stuck.submit(AppendRequest(batch=make_batch(3)))
        acked = registry.committer(fast).submit(AppendRequest(batch=make_batch(3))).result(10)
        assert acked.ranges[0].base_offset == 0 and not waiting.done()
        later = stuck.submit(AppendRequest(batch=make_batch(3)))  # parked behind the first, in order
    assert [f.result(10).ranges[0].base_offset for f in (waiting, later)] == [0, 3]


def test_a_claim_that_fails_answers_its_requests_with_the_reason(registry):
    """A claim that raises something other than a refusal (a bug, an unreadable log) answers its
    parked requests with a storage error; it does not claim again and again with them waiting."""
    topic = log_topic(registry, partitions=1)
    committer = registry.committer(topic)

    def unreadable(writer):
        raise RuntimeError("the write-ahead directory cannot be listed (injected)")

    committer.replay_others = unreadable
    with pytest.raises(StorageUnavailableError, match="injected"):
        committer.submit(AppendRequest(batch=make_batch(3))).result(10)
    committer.replay_others = lambda writer: 0
    assert committer.submit(AppendRequest(batch=make_batch(3))).result(10).ranges[0].base_offset == 0
    committer.close()  # nothing left waiting: it does not sit out its timeout
    assert committer.queue_depth == 0


def _wal_records(topic: str, n: int):
    import pyarrow as pa

    from delta_log.core.records import TOPIC_SCHEMA

    rows = [
        {"key": None, "value": b"v" * 100, "topic": topic, "partition": 0, "offset": i, "timestamp": None,
         "timestampType": 0, "headers": []}
        for i in range(n)
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, TOPIC_SCHEMA)


def test_a_recycled_segment_file_yields_only_its_own_frames(storage, tmp_path):
    """A released segment's file is written over by a later segment: what is left of its old
    frames after the new ones is never read back as the new segment's (their records were in
    their tables; read again they could land in a topic created anew under the same name)."""
    from delta_log.log.wal import WriteAheadLog, encode_frame, frame_header, read_dir

    payload = encode_frame(_wal_records("old", 50), [])
    frame = len(frame_header(payload, b"salt0000")) + payload.size
    wal = WriteAheadLog(storage, "recycling", segment_bytes=5 * frame + 100, spares=False)
    for _ in range(5):  # segment 0: five frames of an old topic, full
        wal.append(encode_frame(_wal_records("old", 50), []), {("old", 0): 50})
    for _ in range(5):  # segment 1: five of another
        wal.append(encode_frame(_wal_records("new", 50), []), {("new", 0): 50})
    assert wal.release({("old", 0): 50}) == 1  # segment 0 released: its file is kept to reuse
    assert not list(Path(wal.dir).glob("00000000000000000000.wal"))
    (free,) = Path(wal.dir).glob("free-*")
    # (the log's first file is zero-filled to a segment's size first: no write of it extends it)
    assert free.stat().st_size == wal.segment_bytes and not list(decode_frames(free.read_bytes()))  # no frame left
    # segment 2, over segment 0's file (segment 1 is full): a frame of the same size as the old ones
    # ("odl" is as long as "old"), so the next bytes are exactly the old second frame's, whole and
    # with a valid CRC
    wal.append(encode_frame(_wal_records("odl", 50), []), {("odl", 0): 50})
    segment = Path(wal.dir) / f"{2:020d}.wal"
    assert not list(Path(wal.dir).glob("free-*")) and segment.stat().st_size == wal.segment_bytes  # the old frames stay
    frames = [f for path, f in read_dir(storage, wal.dir) if path.endswith(segment.name)]
    assert [set(f.records.column("topic").to_pylist()) for f in frames] == [{"odl"}]
    wal.close()


def test_a_segment_all_in_its_tables_starts_again_over_its_own_file(storage, monkeypatch):
    """The segment being written, once every record in it is in its table, is written over from
    its first byte by the next write: one file, that never grows past its largest cycle (a growing
    file's fdatasync commits the filesystem journal); the old frames are never read back, and a
    frame that came after the tables caught up keeps the segment as it is."""
    from delta_log.log.wal import WriteAheadLog, encode_frame, read_dir

    wal = WriteAheadLog(storage, "in-place")
    for _ in range(5):
        wal.append(encode_frame(_wal_records("old", 50), []), {("old", 0): 50})
    (path,) = Path(wal.dir).glob("*.wal")
    inode, size, written = path.stat().st_ino, path.stat().st_size, wal.pending_bytes()
    assert wal.release({("old", 0): 50}) == 0  # the segment being written is never deleted...
    wal.append(encode_frame(_wal_records("odl", 50), []), {("odl", 0): 50})  # ...but starts again
    assert list(Path(wal.dir).iterdir()) == [path] and path.stat().st_ino == inode  # the same file
    assert path.stat().st_size == size  # (zero-filled ahead: 4 MiB, or the log's segment size)
    assert [set(f.records.column("topic").to_pylist()) for _, f in read_dir(storage, wal.dir)] == [{"odl"}]
    assert wal.pending_bytes() == written / 5

    # the tables catch up while a frame is being written (`release` runs on the flusher's thread):
    # that frame is not all in its table, so the next write keeps the segment as it is
    sync = os.fdatasync

    def sync_then_release(fd: int) -> None:
        sync(fd)
        monkeypatch.setattr(os, "fdatasync", sync)
        wal.release({("odl", 0): 50})

    monkeypatch.setattr(os, "fdatasync", sync_then_release)
    wal.append(encode_frame(_wal_records("odl", 50), []), {("odl", 0): 100})
    wal.append(encode_frame(_wal_records("odl", 50), []), {("odl", 0): 150})
    assert [f.records.num_rows for _, f in read_dir(storage, wal.dir)] == [50, 50, 50]
    wal.close()


def _frame_bytes(topic: str, n: int) -> int:
    from delta_log.log.wal import encode_frame, frame_header

    payload = encode_frame(_wal_records(topic, n), [])
    return len(frame_header(payload, b"salt0000")) + payload.size


def test_a_segment_is_released_only_once_its_tables_are_on_disk(storage, monkeypatch):
    """A flush's commit is visible before it is on disk (delta-rs writes a local table's files
    and log entry without fsync): the log keeps the segments that hold its records until a
    `syncfs` of the root that began after the commit has returned. Before, a power loss could
    take acked records from both."""
    import delta_log.log.wal as wal_mod
    from delta_log.log.wal import WriteAheadLog, encode_frame

    entered, go = threading.Event(), threading.Semaphore(0)
    calls: list[str] = []
    real = wal_mod.sync_filesystem

    def held_sync(path: str) -> None:  # each sync waits for the test's go
        calls.append(path)
        entered.set()
        assert go.acquire(timeout=10)
        real(path)

    monkeypatch.setattr(wal_mod, "sync_filesystem", held_sync)
    wal = WriteAheadLog(storage, "synced", segment_bytes=3 * _frame_bytes("t#1", 50), spares=False)
    try:
        for _ in range(3):  # segment 0, full
            wal.append(encode_frame(_wal_records("t#1", 50), []), {("t#1", 0): 50})
        wal.append(encode_frame(_wal_records("u#2", 50), []), {("u#2", 0): 50})
        for _ in range(2):
            wal.append(encode_frame(_wal_records("u#2", 50), []), {("u#2", 0): 50})  # segment 1, full
        wal.append(encode_frame(_wal_records("v#3", 50), []), {("v#3", 0): 50})  # segment 2
        first, second = (Path(wal.dir) / f"{n:020d}.wal" for n in (0, 1))
        assert not calls  # nothing asked for a sync yet
        wal.in_tables({("t#1", 0): 50})  # the table holds segment 0's records, visibly
        assert entered.wait(10)
        assert first.exists() and wal.release_syncs == 0  # not released while the sync runs
        # the table takes segment 1's records while that sync runs: they were not on disk when it
        # began, so they wait for the next one
        wal.in_tables({("u#2", 0): 50})
        go.release()  # the first sync returns
        deadline = time.monotonic() + 10
        while first.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not first.exists() and second.exists()  # (the second sync waits for its go)
        go.release()
        assert wal.settle(10)
        assert not second.exists() and wal.release_syncs == 2 and calls == [wal.dir, wal.dir]
        assert (Path(wal.dir) / f"{2:020d}.wal").exists()  # the segment being written stays
    finally:
        go.release(2)
        wal.close()


def test_the_next_segment_file_is_written_ahead_so_no_write_extends_a_file(storage, monkeypatch):
    """Half way through a segment a zero-filled file of a segment's size is written ahead (on a
    thread of its own, paced); the roll renames it, so no ack's fdatasync extends a file (which
    commits ext4's journal: tens to hundreds of ms at 500 acks/s). Not for a log that fills its
    segments fast: its writes are large, and the spares would add to its disk writes."""
    import delta_log.log.wal as wal_mod
    from delta_log.log.wal import WriteAheadLog, decode_frames, encode_frame, read_dir

    fast = WriteAheadLog(storage, "fast", segment_bytes=4 * _frame_bytes("t#1", 50))
    for i in range(3):
        fast.append(encode_frame(_wal_records("t#1", 50), []), {("t#1", 0): 50 * (i + 1)})
    time.sleep(0.5)
    assert not list(Path(fast.dir).glob("free-*"))  # half a segment in well under _SPARE_AFTER_S
    fast.close()

    monkeypatch.setattr(wal_mod, "_SPARE_AFTER_S", 0.0)  # (this log's frames come as fast)
    wal = WriteAheadLog(storage, "ahead", segment_bytes=4 * _frame_bytes("t#1", 50))
    wal_dir = Path(wal.dir)
    try:
        sizes: set[int] = set()
        for i in range(2):  # half of segment 0 (the log's first file: zero-filled before its first frame)
            wal.append(encode_frame(_wal_records("t#1", 50), []), {("t#1", 0): 50 * (i + 1)})
            sizes |= {p.stat().st_size for p in wal_dir.glob("*.wal")}
        deadline = time.monotonic() + 20
        while not wal._free and time.monotonic() < deadline:
            time.sleep(0.02)  # (written in chunks, each fdatasynced, paced)
        (spare,) = wal_dir.glob("free-*")
        assert spare.stat().st_size == wal.segment_bytes and not list(decode_frames(spare.read_bytes()))
        for i in range(2, 6):  # the rest of segment 0, then half of segment 1: the spare, renamed
            wal.append(encode_frame(_wal_records("t#1", 50), []), {("t#1", 0): 50 * (i + 1)})
            sizes |= {p.stat().st_size for p in wal_dir.glob("*.wal")}
        assert sorted(p.name for p in wal_dir.glob("*.wal")) == [f"{0:020d}.wal", f"{1:020d}.wal"]
        assert sizes == {wal.segment_bytes}  # no write extended a file
        offsets = [o for _, f in read_dir(storage, wal.dir) for o in f.records.column("offset").to_pylist()]
        assert len(offsets) == 6 * 50  # every frame read back, none of the zeros taken for one
    finally:
        wal.close()


def test_a_topic_made_again_under_its_name_keeps_its_acks_in_the_log(tmp_path):
    """A deleted topic's flushes told the log its partitions were in the table up to high offsets.
    Made again under its name, its offsets start at 0: its acked records stay in the log until its
    own flushes (released on the old topic's word, a crash would lose them)."""
    from delta_log.log.wal import read_dir

    writer = {"wal_segment_bytes": 32 * 1024, "wal_lease_ms": 120_000}  # (no flush to renew a lease)
    settings = load_settings(root=str(tmp_path / "root"), writer=writer)
    registry = TopicRegistry(settings)
    try:
        topic = log_topic(registry, partitions=1, lag_ms=60_000)
        old = registry.committer(topic)
        for _ in range(20):  # 1,000 records, then flushed by the delete
            old.submit(AppendRequest(batch=make_batch(50, value_size=100, topic=topic))).result(10)
        registry.delete_topic(topic)
        registry.catalog.create_topic(topic, partitions=1, config=LOG | {"topiclake.table.max.lag.ms": "60000"})
        again = registry.committer(topic)
        for _ in range(20):  # offsets 0-199 again, over several segments; not flushed (60 s lag)
            again.submit(AppendRequest(batch=make_batch(10, value_size=100, topic=topic))).result(10)
        # another topic's flush makes the log release what its tables hold
        other = log_topic(registry, partitions=1, lag_ms=60_000)
        registry.committer(other).submit(AppendRequest(batch=make_batch(5))).result(10)
        registry.drop(other)
        wal = registry.write_ahead().wal
        assert wal.settle(10)
        logged = [
            o
            for _, f in read_dir(registry.storage, wal.dir)
            for t, o in zip(f.records.column("topic").to_pylist(), f.records.column("offset").to_pylist(), strict=True)
            if t == topic and f.records.num_rows == 10
        ]
        assert sorted(logged) == list(range(200))
        assert not (Path(wal.dir) / f"{0:020d}.wal").exists()  # the old topic's first segment was released
    finally:
        registry.close()


def test_a_replay_leaves_out_what_was_acked_for_a_table_deleted_since(registry, storage, settings):
    """A dead gateway's log holds acks of a topic since deleted and made again under its name (the
    new table starts its offsets at 0 again): a replay writes only what was acked for the table
    there now. Each frame names the table its records were acked for."""
    from delta_log.log.wal import WriteAheadLog, encode_frame

    def dead_gateway_acked(owner: str, topic: str, n: int) -> None:
        wal = WriteAheadLog(storage, owner, spares=False)
        table_id = TopicWriter(storage, topic, settings.writer).table_id()
        wal.append(encode_frame(_wal_records(topic, n), [], {topic: table_id}), {(topic, 0): n})
        wal.close()

    topic = log_topic(registry, partitions=1)
    dead_gateway_acked("gone-1", topic, 50)  # acked, never flushed: then the topic is deleted
    registry.delete_topic(topic)
    registry.catalog.create_topic(topic, partitions=1, config=LOG)
    dead_gateway_acked("gone-2", topic, 10)  # the new topic's acks
    written, complete = registry.replay_write_ahead()
    assert written == {topic: 10} and complete
    assert table_offsets(storage, topic) == {0: list(range(10))}


def test_a_claim_never_takes_a_partition_whose_holders_acks_its_replay_left_out(settings, storage):
    """The first gateway acks records it cannot flush yet; the second wants the partition while
    the first's lease runs, and that lease ends between the second's replay (which leaves a leased
    partition to its holder) and its claim. The claim must not take the partition then: it would
    append from offset 0 over acked records. It is refused, and a later claim replays them first."""
    quick = quick_leases(settings)
    first, second = TopicRegistry(quick), TopicRegistry(quick)
    try:
        topic = log_topic(first, partitions=1, lag_ms=200)
        holder = first.committer(topic)
        healthy = storage_down(holder.writer)  # acked, in the first's log only
        a = holder.submit(AppendRequest(batch=make_batch(5))).result(10)
        claimer = second.committer(topic)
        replay = claimer.replay_others

        def replay_then_wait_out_the_lease(writer):
            n = replay(writer)
            deadline = time.monotonic() + 5
            while writer.leased_by_others([0], claimer.holder) and time.monotonic() < deadline:
                time.sleep(0.05)  # a lease the replay saw held ends here, before the claim
            return n

        claimer.replay_others = replay_then_wait_out_the_lease
        refused = 0
        while True:
            try:
                b = claimer.submit(AppendRequest(batch=make_batch(5))).result(20)
                break
            except OwnerNotAvailableError:
                refused += 1
                assert refused < 20
                time.sleep(0.2)
        assert a.ranges[0].base_offset == 0 and b.ranges[0].base_offset == 5
        holder.writer.commit_staged = healthy
        claimer.close()
        assert table_offsets(storage, topic) == {0: list(range(10))}
    finally:
        second.close()
        first.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own priority is Linux's")
def test_table_flushes_run_below_the_threads_that_ack(registry):
    """The flush's burst of parquet and Delta work yields the cores to the event loop and the log's
    writer (see FLUSH_NICE): its thread runs FLUSH_NICE below the process."""
    from delta_log.log.write_ahead import FLUSH_NICE

    topic = log_topic(registry, lag_ms=200)
    registry.committer(topic).submit(AppendRequest(batch=make_batch(4, partitions=2))).result(10)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []
    done = threading.Event()

    def probe() -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        done.set()

    registry.write_ahead().pool.submit(probe)
    assert done.wait(10)
    assert FLUSH_NICE > 0 and seen == [min(mine + FLUSH_NICE, 19)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the caller's is its own
