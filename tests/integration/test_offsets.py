import json

import pytest

from delta_log import OffsetCommit, OffsetStore, StorageRoot
from delta_log.errors import InvalidOffsetError
from delta_log.system.offsets import OFFSETS_SCHEMA


def test_commit_many_latest_wins_and_survives_restart(storage):
    s = OffsetStore(storage)
    v = s.commit(
        [
            OffsetCommit(group="g", topic="a", partition=0, offset=5, commit_timestamp_us=1),
            OffsetCommit(group="g", topic="a", partition=1, offset=7, commit_timestamp_us=1),
            OffsetCommit(group="h", topic="a", partition=0, offset=1, commit_timestamp_us=1),
        ]
    )
    v2 = s.commit([OffsetCommit(group="g", topic="a", partition=0, offset=9, metadata="m", commit_timestamp_us=2)])
    assert v2 == v + 1
    from deltalake import DeltaTable  # what this store wrote is a Delta table as delta-rs reads it

    dt = DeltaTable(s.uri)
    assert dt.version() == v2 and storage.read_system_table(dt, OFFSETS_SCHEMA).num_rows == 4
    restarted = OffsetStore(StorageRoot(storage.root))
    got = {k: c.offset for k, c in restarted.committed("g").items()}
    assert got == {("a", 0): 9, ("a", 1): 7}
    assert restarted.committed("g")[("a", 0)].metadata == "m"
    assert restarted.groups() == ["g", "h"]


def test_other_server_commits_visible_after_load(storage):
    a, b = OffsetStore(storage), OffsetStore(storage)
    b.commit([OffsetCommit(group="g", topic="a", partition=0, offset=3, commit_timestamp_us=5)])
    a.load()
    assert a.committed("g")[("a", 0)].offset == 3


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (OffsetCommit(group="", topic="a", partition=0, offset=1), "INVALID_GROUP"),
        (OffsetCommit(group="g", topic="a b", partition=0, offset=1), "INVALID_TOPIC"),
        (OffsetCommit(group="g", topic="a", partition=-1, offset=1), "INVALID_OFFSET"),
        (OffsetCommit(group="g", topic="a", partition=0, offset=-5), "INVALID_OFFSET"),
    ],
)
def test_bad_commits_write_nothing(storage, bad, code):
    s = OffsetStore(storage)
    before = s._dt.version()
    with pytest.raises(Exception) as e:
        s.commit([OffsetCommit(group="g", topic="a", partition=0, offset=1), bad])
    assert getattr(e.value, "code", None) == code
    assert not isinstance(e.value, InvalidOffsetError) or e.value.code == "INVALID_OFFSET"
    assert OffsetStore(storage)._dt.version() == before


def test_compaction_keeps_an_hour_of_the_log_for_the_lag_history(storage, monkeypatch):
    """The offsets table's rewrite cleans its log as the other system tables' do, but keeps the
    entries of the last hour (OFFSETS_HISTORY_S): a group's lag history travels back through
    them. The other tables keep 10 s."""
    import os

    from delta_log.table import storage as storage_module

    monkeypatch.setattr(storage_module, "SYSTEM_LOG_KEEP_VERSIONS", 10)
    store = OffsetStore(storage)
    for round_ in range(2):  # the first rewrite's checkpoint is what the second could clean up to
        for i in range(30):
            store.commit([OffsetCommit(group="g", topic="t", partition=0, offset=30 * round_ + i)])
        assert store.compact(min_files=5)
    log_dir = os.path.join(storage.fs_path(store.uri), "_delta_log")
    assert os.path.exists(os.path.join(log_dir, f"{1:020d}.json"))
    monkeypatch.setattr(storage_module, "SYSTEM_LOG_MIN_AGE_S", 0.0)  # not the offsets table's
    for i in range(30):
        store.commit([OffsetCommit(group="g", topic="t", partition=0, offset=60 + i)])
    assert store.compact(min_files=5)
    assert os.path.exists(os.path.join(log_dir, f"{1:020d}.json"))
    from deltalake import DeltaTable  # tombstones outlive the hour the vacuum keeps replaced files

    config = DeltaTable(store.uri).metadata().configuration
    assert config["delta.deletedFileRetentionDuration"] == "interval 7200 seconds"


def test_compaction_keeps_the_latest_per_key_and_never_drops_a_concurrent_commit(storage):
    import threading

    from delta_log.system.offsets import OffsetCommit, OffsetStore

    writer, compactor = OffsetStore(storage), OffsetStore(storage)
    for i in range(10):
        writer.commit([OffsetCommit(group="g", topic="t", partition=0, offset=i)])
    assert compactor.compact(min_files=5)
    assert len(compactor._dt.file_uris()) == 1
    assert OffsetStore(storage).committed("g")[("t", 0)].offset == 9
    assert not compactor.compact(min_files=5)  # one file now: nothing to do

    # The server compacts through the store it commits with (its commits wait for the rewrite);
    # another process (a Spark job with groupId) commits through its own store, racing it.
    stop = threading.Event()
    compactions = []

    def compact_loop():
        while not stop.is_set():
            compactions.append(compactor.compact(min_files=2))

    def other_process():
        for i in range(200, 240):
            writer.commit([OffsetCommit(group="g", topic="t", partition=i, offset=i)])

    threads = [threading.Thread(target=compact_loop), threading.Thread(target=other_process)]
    for t in threads:
        t.start()
    try:
        for i in range(1, 81):  # each commit its own key: a dropped one would be missing
            compactor.commit([OffsetCommit(group="g", topic="t", partition=i, offset=i)])
    finally:
        threads[1].join()
        stop.set()
        threads[0].join()
    final = OffsetStore(storage).committed("g")
    expected = {0: 9, **{i: i for i in range(1, 81)}, **{i: i for i in range(200, 240)}}
    assert {p: c.offset for (_, p), c in final.items()} == expected
    assert any(compactions)  # rewrites happened while commits raced them


def test_a_delete_reaches_another_server_that_read_the_offset_even_after_compaction(storage, tmp_path):
    from delta_log.maintenance.replication import replicate_offsets

    a, b = OffsetStore(storage), OffsetStore(storage)
    a.commit(
        [
            OffsetCommit(group="g", topic="t", partition=0, offset=4),
            OffsetCommit(group="h", topic="t", partition=0, offset=2),
        ]
    )
    b.load()
    assert b.committed("g")[("t", 0)].offset == 4
    a.delete("g", [("t", 0)])
    assert a.committed("g") == {} and a.groups() == ["h"]
    assert a.compact(min_files=1)
    b.load()  # b read the offset before; the delete survived the compaction and reaches it
    assert b.committed("g") == {} and b.groups() == ["h"]
    replica = StorageRoot(str(tmp_path / "replica"))
    assert replicate_offsets(storage, replica) == 2
    assert OffsetStore(replica).committed("g") == {}
    assert OffsetStore(replica).committed("h")[("t", 0)].offset == 2


def test_a_takeover_between_the_epoch_check_and_the_commit_refuses_the_commit(storage, monkeypatch):
    """The store writes its own log entries on local disk: a claim that lands after the epoch was
    read and before the entry is linked makes the entry conflict (its coordinator txn), the epoch
    is read again, and the stale coordinator is told so; nothing of it is written."""
    from delta_log.errors import NotCoordinatorError
    from delta_log.system.own_log import OwnLog

    first = OffsetStore(storage)
    assert first._own is not None  # local disk: the store's own log entries
    epoch = first.claim_coordinator("g")
    first.commit([OffsetCommit(group="g", topic="t", partition=0, offset=1)], fence=("g", epoch))
    read_epoch = OwnLog.txn_version
    raced = []

    def racing(self, dt, app_id):
        seen = read_epoch(self, dt, app_id)
        if not raced:
            raced.append(OffsetStore(StorageRoot(storage.root)).claim_coordinator("g"))
        return seen

    monkeypatch.setattr(OwnLog, "txn_version", racing)
    with pytest.raises(NotCoordinatorError):
        first.commit([OffsetCommit(group="g", topic="t", partition=0, offset=9)], fence=("g", epoch))
    assert raced == [epoch + 1]
    assert OffsetStore(StorageRoot(storage.root)).committed("g")[("t", 0)].offset == 1


def test_two_servers_append_past_each_other_and_checkpoints_follow(storage):
    """Blind appends of two stores interleave (each skips the other's versions); a checkpoint is
    written every delta.checkpointInterval (100) versions, as delta-rs's hook would."""
    import time
    from pathlib import Path

    a, b = OffsetStore(storage), OffsetStore(StorageRoot(storage.root))
    for i in range(60):
        a.commit([OffsetCommit(group="ga", topic="t", partition=0, offset=i)])
        b.commit([OffsetCommit(group="gb", topic="t", partition=0, offset=i)])
    fresh = OffsetStore(StorageRoot(storage.root))
    assert fresh.committed("ga")[("t", 0)].offset == 59 and fresh.committed("gb")[("t", 0)].offset == 59
    log_dir = Path(storage.fs_path(a.uri)) / "_delta_log"
    deadline = time.monotonic() + 30
    while not list(log_dir.glob("*.checkpoint.parquet")) and time.monotonic() < deadline:
        time.sleep(0.1)
    # each store checkpoints the newest version once it crossed 100 (two stores: up to two)
    versions = sorted(int(p.name.split(".")[0]) for p in log_dir.glob("*.checkpoint.parquet"))
    assert versions and all(100 <= v <= 120 for v in versions) and len(versions) <= 2


def test_a_protocol_change_hands_the_commits_back_to_delta_rs(storage):
    """A constraint added from outside (Spark, delta-rs) raises the table's writer protocol: the
    store sees it in the log, stops writing entries itself, and its commits go on through
    delta-rs, which enforces the constraint."""
    from deltalake import DeltaTable

    for fenced in (False, True):
        root = storage.root + ("/fenced" if fenced else "/plain")
        s = OffsetStore(StorageRoot(root))
        assert s._own is not None
        fence = ("g", s.claim_coordinator("g")) if fenced else None
        s.commit([OffsetCommit(group="g", topic="t", partition=0, offset=1)], fence=fence)
        DeltaTable(s.uri).alter.add_constraint({"partition_nonnegative": "partition >= 0"})
        s.commit([OffsetCommit(group="g", topic="t", partition=1, offset=2)], fence=fence)
        assert s._own is None
        s.commit([OffsetCommit(group="g", topic="t", partition=0, offset=3)], fence=fence)
        got = {k: c.offset for k, c in OffsetStore(StorageRoot(root)).committed("g").items()}
        assert got == {("t", 0): 3, ("t", 1): 2}
        engines = {json.loads(line)["commitInfo"].get("engineInfo", "") for line in _commit_infos(s.uri)}
        assert any(e.startswith("delta-rs") for e in engines)


def _commit_infos(uri):
    import glob
    import os

    for path in sorted(glob.glob(os.path.join(uri, "_delta_log", "*.json")))[-2:]:
        with open(path) as f:
            yield next(line for line in f if '"commitInfo"' in line)
