import pytest

from delta_log import OffsetCommit, OffsetStore, StorageRoot
from delta_log.errors import InvalidOffsetError


def test_commit_many_latest_wins_and_survives_restart(storage):
    s = OffsetStore(storage)
    v = s.commit(
        [
            OffsetCommit(group="g", topic="a", partition=0, offset=5, commit_timestamp_us=1),
            OffsetCommit(group="g", topic="a", partition=1, offset=7, commit_timestamp_us=1),
            OffsetCommit(group="h", topic="a", partition=0, offset=1, commit_timestamp_us=1),
        ]
    )
    s.commit([OffsetCommit(group="g", topic="a", partition=0, offset=9, metadata="m", commit_timestamp_us=2)])
    assert s._dt.version() == v + 1
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
