import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from delta_log import AppendRequest, ProducerSequence, TopicReader, TopicWriter
from delta_log.errors import DuplicateSequenceError, InvalidRecordError, OutOfOrderSequenceError, TopicNotFoundError
from delta_log.maintenance.topic_maintenance import TopicMaintenance
from delta_log.table.app_transactions import read_high_watermark, read_high_watermarks, read_producer_state
from tests.integration.conftest import make_batch


def all_offsets(storage, topic):
    t = DeltaTable(storage.topic_uri(topic)).to_pyarrow_table(columns=["partition", "offset"])
    out: dict[int, list[int]] = {}
    for p, o in zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True):
        out.setdefault(p, []).append(o)
    return {p: sorted(v) for p, v in out.items()}


def test_many_requests_one_commit_one_file_per_partition(storage, settings, topic_factory):
    topic = topic_factory(partitions=3)
    w = TopicWriter(storage, topic, settings.writer)
    v0 = w.table.version()
    results = w.append_many([AppendRequest(batch=make_batch(9, partitions=3)) for _ in range(4)])
    assert w.table.version() == v0 + 1
    assert [r.ranges[0].base_offset for r in results] == [0, 3, 6, 9]
    assert all(r.table_version == v0 + 1 for r in results)
    files = DeltaTable(storage.topic_uri(topic)).file_uris()
    assert len(files) == 3
    assert all_offsets(storage, topic) == {p: list(range(12)) for p in range(3)}
    assert {p: w.high_watermark(p) for p in range(3)} == {0: 12, 1: 12, 2: 12}
    # the high watermark is the Delta app transaction hw-<p>
    assert read_high_watermark(DeltaTable(storage.topic_uri(topic)), 1) == 12


def test_rows_sorted_by_offset_within_files(storage, settings, topic_factory):
    topic = topic_factory(partitions=2)
    w = TopicWriter(storage, topic, settings.writer)
    w.append_many([AppendRequest(batch=make_batch(50, partitions=2)) for _ in range(3)])
    import pyarrow.parquet as pq

    for f in DeltaTable(storage.topic_uri(topic)).file_uris():
        offs = pq.read_table(f, columns=["offset"]).column("offset").to_pylist()
        assert offs == sorted(offs) and offs == list(range(offs[0], offs[0] + len(offs)))


def test_idempotent_retry_returns_original_offsets(storage, settings, topic_factory):
    topic = topic_factory(partitions=2)
    w = TopicWriter(storage, topic, settings.writer)
    w.append(make_batch(4, partitions=2))
    p = ProducerSequence(producer_id="prod-1", sequence=7)
    first = w.append(make_batch(6, partitions=2), p)
    again = TopicWriter(storage, topic, settings.writer).append(make_batch(6, partitions=2), p)
    assert again.duplicate and again.ranges == first.ranges
    assert all_offsets(storage, topic) == {0: list(range(5)), 1: list(range(5))}
    with pytest.raises(DuplicateSequenceError):
        w.append(make_batch(6, partitions=2), ProducerSequence(producer_id="prod-1", sequence=3))
    nxt = w.append(make_batch(2, partitions=2), ProducerSequence(producer_id="prod-1", sequence=8))
    assert not nxt.duplicate and nxt.ranges[0].base_offset == 5


def test_duplicate_inside_one_flush_is_written_once(storage, settings, topic_factory):
    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    p = ProducerSequence(producer_id="p", sequence=0)
    r = w.append_many([AppendRequest(batch=make_batch(3), producer=p), AppendRequest(batch=make_batch(3), producer=p)])
    assert r[0].ranges == r[1].ranges and r[1].duplicate
    assert all_offsets(storage, topic) == {0: [0, 1, 2]}


def test_bad_producer_id():
    with pytest.raises(InvalidRecordError):
        ProducerSequence(producer_id="has space", sequence=0)
    with pytest.raises(InvalidRecordError):
        ProducerSequence(producer_id="ok", sequence=-1)


def test_two_writer_objects_interleave_without_duplicates(storage, settings, topic_factory):
    topic = topic_factory()
    a = TopicWriter(storage, topic, settings.writer)
    b = TopicWriter(storage, topic, settings.writer)
    seen = []
    for _ in range(10):
        seen += [r.base_offset for r in a.append(make_batch(5)).ranges]
        seen += [r.base_offset for r in b.append(make_batch(5)).ranges]  # b's snapshot is stale: conflict
    assert sorted(seen) == list(range(0, 100, 5))
    assert b.conflicts > 0
    assert all_offsets(storage, topic) == {0: list(range(100))}


def test_a_kafka_producer_moving_to_a_writer_with_a_stale_snapshot_continues(storage, settings, topic_factory):
    """A partition's leader moves (a gateway died): the producer's next batch reaches a writer that
    has not read the batches the old leader appended since. That is no gap: the writer reads the
    newest version before it refuses, and the batch is appended; a real gap is still refused."""
    topic = topic_factory()
    old, new = TopicWriter(storage, topic, settings.writer), TopicWriter(storage, topic, settings.writer)

    def batch(first: int, n: int = 5) -> ProducerSequence:
        return ProducerSequence(producer_id="k.7.0", sequence=first + n - 1, first_sequence=first)

    new.append(make_batch(5), batch(0))
    for first in (5, 10, 15):
        old.append(make_batch(5), batch(first))
    got = new.append(make_batch(5), batch(20))
    assert [(r.partition, r.base_offset) for r in got.ranges] == [(0, 20)]
    with pytest.raises(OutOfOrderSequenceError):
        new.append(make_batch(5), batch(30))
    assert all_offsets(storage, topic) == {0: list(range(25))}


def test_append_retries_after_concurrent_delete(storage, settings, topic_factory):
    topic = topic_factory(partitions=2)
    w = TopicWriter(storage, topic, settings.writer)
    w.append(make_batch(10, partitions=2))
    # another engine deletes data concurrently (as retention does), through its own table object
    DeltaTable(storage.topic_uri(topic)).delete("partition = 0")
    r = w.append(make_batch(4, partitions=2))
    assert [x.base_offset for x in r.ranges] == [5, 5]  # offsets continue; no restart at 0
    assert all_offsets(storage, topic) == {0: [5, 6], 1: list(range(7))}


def test_unknown_topic(storage, settings):
    with pytest.raises(TopicNotFoundError):
        TopicWriter(storage, "nope", settings.writer)


def test_unnormalized_batch_rejected_nothing_written(storage, settings, topic_factory):
    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    with pytest.raises(TypeError):
        w.append(pa.table({"value": [b"x"]}))
    assert DeltaTable(storage.topic_uri(topic)).version() == 0


def test_checkpoints_and_no_per_commit_log_cleanup(storage, settings, topic_factory):
    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(105):
        w.append(make_batch(1))
    log_dir = os.path.join(storage.topic_uri(topic), "_delta_log")
    deadline = time.monotonic() + 30  # the checkpoint thread makes them, off the commit path
    while not any(n.endswith(".checkpoint.parquet") for n in os.listdir(log_dir)):
        assert time.monotonic() < deadline, "no checkpoint after 105 commits"
        time.sleep(0.05)
    assert "00000000000000000000.json" in os.listdir(log_dir)  # hot path never cleans the log
    assert TopicReader(storage, topic).high_watermark(0) == 105


def test_partition_sorted_batches_take_the_slice_path_with_same_result(storage, settings, topic_factory):
    import numpy as np

    def sort(b):
        return b.take(pa.array(np.argsort(b.column("partition").to_numpy(), kind="stable")))

    results = {}
    for name, prep in (("unsorted", lambda b: b), ("sorted", sort)):
        topic = topic_factory(partitions=3)
        w = TopicWriter(storage, topic, settings.writer)
        r = w.append_many(
            [AppendRequest(batch=prep(make_batch(10, partitions=3, key_prefix=f"r{i}-"))) for i in range(3)]
        )
        t = DeltaTable(storage.topic_uri(topic)).to_pyarrow_table(columns=["partition", "offset", "key"])
        results[name] = (
            [x.ranges for x in r],
            sorted(
                zip(
                    t.column("partition").to_pylist(),
                    t.column("offset").to_pylist(),
                    t.column("key").to_pylist(),
                    strict=True,
                )
            ),
        )
    assert results["sorted"] == results["unsorted"]


def test_one_producer_several_sequences_in_one_flush(storage, settings, topic_factory):
    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    p5, p6 = ProducerSequence(producer_id="pp", sequence=5), ProducerSequence(producer_id="pp", sequence=6)
    r = w.append_many(
        [
            AppendRequest(batch=make_batch(2), producer=p5),
            AppendRequest(batch=make_batch(2), producer=p6),
            AppendRequest(batch=make_batch(2), producer=ProducerSequence(producer_id="pp", sequence=4)),
        ]
    )
    assert [x.ranges[0].base_offset for x in r[:2]] == [0, 2]
    assert isinstance(r[2].error, DuplicateSequenceError)  # older, behind a newer one
    state = read_producer_state(DeltaTable(storage.topic_uri(topic)), "pp", 0)
    assert state is not None and state.last_sequence == 6
    again = w.append(make_batch(2), p6)  # a retry of the newest: its original offsets
    assert again.duplicate and again.ranges[0].base_offset == 2
    with pytest.raises(DuplicateSequenceError):
        w.append(make_batch(2), p5)
    assert all_offsets(storage, topic) == {0: [0, 1, 2, 3]}


def test_cached_transactions_follow_other_writers_and_a_cleaned_log(storage, settings, topic_factory):
    """The writer keeps high watermarks and producer state across its commits (TransactionCache);
    after other writers' commits, a roll-up's, and log entries deleted by cleanup, what it uses must
    still be what the table says, partition by partition."""
    topic = topic_factory(partitions=4)
    a = TopicWriter(storage, topic, settings.writer)
    b = TopicWriter(storage, topic, settings.writer)
    only = lambda p: make_batch(3, partitions=4, partition_of=lambda i: p)  # noqa: E731

    def agrees(w: TopicWriter) -> None:
        w.refresh()
        table = storage.open_topic(topic)
        assert read_high_watermarks(w._txns, 4) == read_high_watermarks(table, 4)
        for p in range(4):
            assert read_producer_state(w._txns, "prod-b", p) == read_producer_state(table, "prod-b", p)

    for i in range(6):
        a.append(only(0))
        b.append(only(1 + i % 3), ProducerSequence(producer_id="prod-b", sequence=i))
        agrees(a)
    assert a.append(only(1)).ranges[0].base_offset == 6  # b wrote 3 records to partition 1 twice
    roller = TopicMaintenance(storage, topic, settings.maintenance, settings.writer, background=False)
    roller.run_task("rollup")
    roller.close()
    b.append(only(2), ProducerSequence(producer_id="prod-b", sequence=6))
    agrees(a)
    # entries since a's version gone: a falls back to the table
    version = a.table.version()
    for _ in range(3):
        b.append(only(3), ProducerSequence(producer_id="prod-b", sequence=7 + _))
    b.table.create_checkpoint()
    log_dir = Path(storage.fs_path(storage.topic_uri(topic))) / "_delta_log"
    for v in range(version + 1, b.table.version()):  # as log cleanup would: never the newest
        (log_dir / f"{v:020d}.json").unlink()
    agrees(a)
    assert a.append(only(3)).ranges[0].base_offset == 15
    assert all_offsets(storage, topic) == {0: list(range(18)), 1: list(range(9)), 2: list(range(9)), 3: list(range(18))}


def test_the_cache_starts_over_when_the_topic_is_created_again(storage, settings, catalog, topic_factory):
    """A topic deleted and created again starts its versions over: a writer's cached high
    watermarks of the old table must not survive into the new one (they would not be refused)."""
    topic = topic_factory(partitions=2)
    on_one = lambda n: make_batch(n, partitions=2, partition_of=lambda i: 1)  # noqa: E731
    a = TopicWriter(storage, topic, settings.writer.model_copy(update={"reopen_every_commits": 1}))
    for _ in range(5):
        a.append(on_one(3))  # hw-1 = 15, and a re-opens its table after each commit
    catalog.delete_topic(topic)
    catalog.create_topic(topic, partitions=2)
    b = TopicWriter(storage, topic, settings.writer)
    for _ in range(5):
        b.append(on_one(5))  # hw-1 = 25 in the new table, at the version a's cache last saw
    a.refresh()
    assert a.table.version() == b.table.version()
    assert a.append(on_one(1)).ranges[0].base_offset == 25
    assert all_offsets(storage, topic) == {1: list(range(26))}


def _entry_actions(storage, topic, version):
    with open(os.path.join(storage.topic_uri(topic), "_delta_log", f"{version:020d}.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_own_commits_skip_other_partitions_appends_and_replan_on_their_own(storage, settings, topic_factory):
    """Commits written by the writer itself (delta_log.table.log_entries): a version taken by an
    append to OTHER partitions is passed over without planning again (as delta-rs's append retry);
    one that wrote the same high watermark is a conflict, planned again, and no offset is given
    twice. The entries are Delta's: delta-rs and a fresh table object read them."""
    topic = topic_factory(partitions=2)
    a = TopicWriter(storage, topic, settings.writer)
    b = TopicWriter(storage, topic, settings.writer)
    a.append(make_batch(3, partition_of=lambda i: 0))
    b.append(make_batch(3, partition_of=lambda i: 1))  # b had not read a's commit: another partition
    assert b.conflicts == 0
    a.append(make_batch(2, partition_of=lambda i: 1))  # a has not read b's: same partition
    assert a.conflicts == 1
    assert all_offsets(storage, topic) == {0: [0, 1, 2], 1: [0, 1, 2, 3, 4]}
    fresh = DeltaTable(storage.topic_uri(topic))
    assert read_high_watermarks(fresh, [0, 1]) == {0: 3, 1: 5}
    version = fresh.version()
    actions = _entry_actions(storage, topic, version)
    info = actions[0]["commitInfo"]
    assert info["engineInfo"] == "topiclake" and info["operation"] == "WRITE" and info["topiclake.records"] == "2"
    assert {a["txn"]["appId"] for a in actions if "txn" in a} == {"hw-1"}
    (add,) = [a["add"] for a in actions if "add" in a]
    assert add["partitionValues"] == {"partition": "1"} and json.loads(add["stats"])["numRecords"] == 2
    assert a.table.version() == version  # `table` catches up with the writer's own commits


def test_own_commits_replan_after_a_metadata_change(storage, settings, topic_factory):
    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer)
    w.append(make_batch(2))
    other = DeltaTable(storage.topic_uri(topic))
    other.alter.set_table_properties({"delta.logRetentionDuration": "interval 8 days"})  # metaData, elsewhere
    w.append(make_batch(2))
    assert w.conflicts == 1  # planned again on the new metadata
    assert all_offsets(storage, topic) == {0: [0, 1, 2, 3]}
    assert DeltaTable(storage.topic_uri(topic)).metadata().configuration["delta.logRetentionDuration"] == (
        "interval 8 days"
    )


def test_a_file_change_passes_appends_but_not_a_removal_of_its_files(storage, settings, topic_factory):
    """The rule for roll-up and retention entries written on local disk: appends in between are
    passed over; a commit in between that removed one of the same files is a conflict."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import RemoveAction

    from delta_log.table import log_entries

    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer)
    w.append(make_batch(2))
    dt = DeltaTable(storage.topic_uri(topic))
    read_version = dt.version()
    (path,) = [os.path.relpath(u, storage.topic_uri(topic)) for u in dt.file_uris()]
    w.append(make_batch(2))  # another writer's append lands first
    log_dir = os.path.join(storage.topic_uri(topic), "_delta_log")
    gone = RemoveAction(path, True, 1, 10, {"partition": "0"})
    entry = log_entries.append_entry([gone], [], {}, partition_by=["partition"])
    version = log_entries.commit(log_dir, read_version, entry, removed=frozenset([path]))
    assert version == read_version + 2
    assert all_offsets(storage, topic) == {0: [2, 3]}  # the first file is gone, the append stays
    with pytest.raises(CommitFailedError, match="removed"):  # planned on the same version: refused
        log_entries.commit(log_dir, read_version, entry, removed=frozenset([path]))


def test_a_writer_whose_version_left_the_log_reads_the_table_again(storage, settings, topic_factory):
    """A quiet writer's version cleaned up from under it (log cleanup keeps recent versions only):
    its next commit must not land in the hole below the checkpoint, where no reader looks."""
    from delta_log.maintenance.log_cleanup import cleanup_log

    topic = topic_factory(partitions=1)
    a = TopicWriter(storage, topic, settings.writer)
    b = TopicWriter(storage, topic, settings.writer)
    a.append(make_batch(1))
    for _ in range(40):
        b.append(make_batch(1))
    DeltaTable(storage.topic_uri(topic)).create_checkpoint()
    assert cleanup_log(storage, storage.topic_uri(topic), keep_versions=10, min_age_s=0)
    r = a.append(make_batch(5))
    assert [(x.base_offset, x.count) for x in r.ranges] == [(41, 5)]
    fresh = DeltaTable(storage.topic_uri(topic))
    assert fresh.version() == r.table_version and read_high_watermark(fresh, 0) == 46
    assert all_offsets(storage, topic) == {0: list(range(46))}


def test_a_writer_of_a_topic_made_again_elsewhere_leaves_no_gap(storage, settings, catalog, topic_factory):
    topic = topic_factory(partitions=1)
    a = TopicWriter(storage, topic, settings.writer)
    for _ in range(5):
        a.append(make_batch(1))
    catalog.delete_topic(topic)  # as another gateway would
    catalog.create_topic(topic, partitions=1)
    r = a.append(make_batch(1))
    assert r.table_version == 1 and r.ranges[0].base_offset == 0
    assert DeltaTable(storage.topic_uri(topic)).version() == 1  # contiguous: readable


def test_a_full_txn_cache_starting_over_mid_plan_gives_no_offset_twice(storage, settings, topic_factory):
    """The cache starts over when full, bringing the table object up to date meanwhile: what the
    attempt read before that is of an older version, so it plans again."""
    topic = topic_factory(partitions=3)
    a = TopicWriter(storage, topic, settings.writer)
    b = TopicWriter(storage, topic, settings.writer)

    def on(*ps):
        return make_batch(len(ps), partitions=3, partition_of=lambda i: ps[i])

    a.append(on(0, 1))
    b.append(on(0))
    a._txns._max_entries = len(a._txns._known)  # full: the next new app id starts it over
    a.append(on(0, 2))
    assert all_offsets(storage, topic) == {0: [0, 1, 2], 1: [0], 2: [0]}


def test_short_lived_writers_still_checkpoint(storage, settings, topic_factory):
    """Checkpoints follow the table's versions, not one writer's life (a writer released when idle,
    the Spark sink's per commit)."""
    topic = topic_factory(partitions=1)
    for _ in range(6):
        w = TopicWriter(storage, topic, settings.writer)
        for _ in range(9):
            w.append(make_batch(1))
    log_dir = os.path.join(storage.topic_uri(topic), "_delta_log")
    deadline = time.monotonic() + 30
    while sum(n.endswith(".checkpoint.parquet") for n in os.listdir(log_dir)) < 3:
        assert time.monotonic() < deadline, sorted(os.listdir(log_dir))
        time.sleep(0.05)
