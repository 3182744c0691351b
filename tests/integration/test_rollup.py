import threading
import time

import pyarrow as pa

from conf import ReaderSettings
from delta_log import TopicReader, TopicWriter
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.maintenance.topic_maintenance import TopicMaintenance
from delta_log.table.segment_files import segments_of
from tests.integration.conftest import make_batch, rewrite_segment


def snapshot(storage, topic):
    t = storage.open_topic(topic).to_pyarrow_table()
    return t.sort_by([("partition", "ascending"), ("offset", "ascending")])


def test_rollup_keeps_every_record_and_offset(storage, settings, topic_factory):
    topic = topic_factory(partitions=2)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(40):
        w.append(make_batch(6, partitions=2))
    before = snapshot(storage, topic)
    reader = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=3600))
    old_fetch = reader.fetch(0, 0, max_records=1000).records
    roller = TopicMaintenance(storage, topic, settings.maintenance, settings.writer)
    try:
        report = roller.run_once()["rollup"]
    finally:
        roller.close()
    # each partition's 40 small files: a run of 32 (RUN_FACTOR x fanout) and one of 8
    assert report.runs == 4 and report.files_removed == 80 and report.conflicts == 0
    assert sum(len(v) for v in segments_of(storage.open_topic(topic)).values()) == 4
    assert snapshot(storage, topic).equals(before)  # invariant 6: same records, same offsets
    # a reader holding the old index still reads (replaced files stay until vacuum), then refreshes
    assert reader.fetch(0, 0, max_records=1000).records.equals(old_fetch)
    reader.refresh()
    assert reader.fetch(0, 0, max_records=1000).records.equals(old_fetch)
    assert reader.partition_offsets()[0].segments == 2
    # rolled-up commits are dataChange=false
    hist = storage.open_topic(topic).history(1)[0]
    assert hist.get("operationParameters", {}).get("mode") == "Append" or hist["operation"] == "WRITE"
    assert w.append(make_batch(2, partitions=2)).ranges[0].base_offset == 120


def test_rollup_beside_a_live_writer(storage, settings, topic_factory):
    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    roller = TopicMaintenance(storage, topic, settings.maintenance, settings.writer)
    w.on_commit = roller.notify_commit
    errors = []

    def produce():
        try:
            for _ in range(120):
                w.append(make_batch(3))
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    t = threading.Thread(target=produce)
    t.start()
    t.join()
    roller.run_once()
    roller.close()
    assert not errors
    offsets = snapshot(storage, topic).column("offset").to_pylist()
    assert offsets == list(range(360))  # unique, contiguous, nothing lost or doubled
    files = len(segments_of(storage.open_topic(topic))[0])
    assert files < 30, files  # 120 commits, rolled up


def test_two_rollers_race_without_doubling(storage, settings, topic_factory):
    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(64):
        w.append(make_batch(2))
    before = snapshot(storage, topic)
    rollers = [TopicMaintenance(storage, topic, settings.maintenance, settings.writer) for _ in range(2)]
    threads = [threading.Thread(target=r.run_once) for r in rollers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in rollers:
        r.close()
    assert snapshot(storage, topic).equals(before)
    done = sum(rep.runs for r in rollers for rep in r.rollup_reports)
    assert done >= 2  # 64 segments -> two runs of 32 between the two
    assert len(segments_of(storage.open_topic(topic))[0]) == 2


def _last_checkpoint(storage, topic: str) -> int:
    import json
    import os

    path = os.path.join(storage.topic_uri(topic), "_delta_log", "_last_checkpoint")
    try:
        with open(path) as f:
            return int(json.load(f)["version"])
    except FileNotFoundError:
        return -1


def test_log_stays_small_and_stale_readers_recover(tmp_path):
    import os

    from conf import load_settings
    from delta_log import Catalog, StorageRoot

    settings = load_settings(
        root=str(tmp_path / "root"),
        writer={
            "log_keep_versions": 20,
            "log_min_age_s": 0,
            "cleanup_every_commits": 10,
            "checkpoint_interval": 10,
            "checkpoint_min_interval_s": 0,
        },
    )
    storage = StorageRoot(settings.root)
    Catalog(storage, settings.writer).create_topic("small-log")
    stale = TopicReader(storage, "small-log", ReaderSettings(refresh_interval_s=3600))
    roller = TopicMaintenance(storage, "small-log", settings.maintenance, settings.writer)
    w = TopicWriter(storage, "small-log", settings.writer, on_commit=roller.notify_commit)
    for _ in range(150):
        w.append(make_batch(2))
    # the writer's checkpoints are made by the checkpoint thread, off the commit path: the log is
    # cleaned up to the latest one
    deadline = time.monotonic() + 30
    while _last_checkpoint(storage, "small-log") < 140:
        assert time.monotonic() < deadline, "the checkpoint thread fell behind"
        time.sleep(0.05)
    roller.run_once(commits=10)
    roller.close()
    log_dir = os.path.join(storage.topic_uri("small-log"), "_delta_log")
    names = os.listdir(log_dir)
    commits = sorted(int(n.split(".")[0]) for n in names if n.endswith(".json"))
    checkpoints = sorted(int(n.split(".")[0]) for n in names if n.endswith(".checkpoint.parquet"))
    # everything before the newest checkpoint at least `log_keep_versions` old went; that checkpoint
    # and every commit after it stay (a busy machine spaces checkpoints wider than the interval, so
    # the count is bounded by where they fell, not by the interval alone)
    anchor = max(c for c in checkpoints if c <= commits[-1] - 20)
    assert commits == list(range(anchor, commits[-1] + 1)), (anchor, commits)
    assert checkpoints[0] == anchor
    assert commits[0] > 0 and len(commits) < 150
    # a reader whose version predates the retained log re-opens from the checkpoint
    stale.refresh()
    assert stale.fetch(0, 0, max_records=1000).records.column("offset").to_pylist() == list(range(300))
    assert TopicWriter(storage, "small-log", settings.writer).append(make_batch(1)).ranges[0].base_offset == 300


def test_a_gateway_rolls_up_the_partitions_it_owns(settings, storage):
    """With several gateways each partition's owner keeps it compact: the registry's roll-up scope
    (in a cluster: the partitions this gateway owns) limits its passes, whoever wrote the files;
    with no scope (one gateway, or run by hand) every partition is rolled up."""
    from delta_log.registry import TopicRegistry

    registry = TopicRegistry(settings)
    try:
        registry.catalog.create_topic("owned", partitions=2)
        other = TopicWriter(storage, "owned", settings.writer)  # another gateway, or the Spark sink
        for _ in range(16):
            other.append(make_batch(4, partitions=2, partition_of=lambda i: i % 2))
        registry.set_rollup_scope(lambda topic, n: [0] if (topic, n) == ("owned", 2) else [])
        registry.committer("owned")  # opens the topic's writer and maintenance, as produce does
        maintenance = registry.maintenance("owned")
        assert maintenance is not None
        assert maintenance.run_task("rollup").files_removed == 16
        assert {p: len(s) for p, s in segments_of(storage.open_topic("owned")).items()} == {0: 1, 1: 16}
        registry.set_rollup_scope(None)
        assert maintenance.run_task("rollup").files_removed == 16
        assert {p: len(s) for p, s in segments_of(storage.open_topic("owned")).items()} == {0: 1, 1: 1}
    finally:
        registry.close()
    assert snapshot(storage, "owned").column("offset").to_pylist() == list(range(32)) + list(range(32))


def test_rollup_sorts_a_run_holding_a_file_out_of_order(storage, settings, topic_factory):
    """Our writer's files are sorted, and a run of adjacent ones merges without sorting; a file
    another engine wrote out of order (Spark's bin-packing OPTIMIZE does) is sorted in the merge."""
    import pyarrow.parquet as pq

    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(8):
        w.append(make_batch(5))
    uri = storage.topic_uri(topic)
    victim = segments_of(storage.open_topic(topic))[0][3]
    rewrite_segment(storage, topic, victim, [4, 3, 2, 1, 0])
    before = snapshot(storage, topic)
    report = TopicMaintenance(storage, topic, settings.maintenance, settings.writer, background=False).run_task(
        "rollup"
    )
    assert report.runs == 1
    (merged,) = segments_of(storage.open_topic(topic))[0]
    assert pq.read_table(storage.file_path(uri, merged.path)).column("offset").to_pylist() == list(range(40))
    assert pq.read_metadata(storage.file_path(uri, merged.path)).created_by.startswith("parquet-cpp")  # decoded
    assert snapshot(storage, topic).equals(before)


def test_rollup_copies_encoded_chunks_and_states_the_same_stats(storage, settings, topic_factory):
    """Segments this writer wrote (marked as ascending by offset) are merged by copying their
    column chunks (parquet-rs writes the new file: nothing is decoded); the records, their order,
    the row groups and the Delta stats are what decoding and encoding them again would give."""
    import json
    import os

    import pyarrow.parquet as pq

    from delta_log.table.segment_files import SORTED_BY_OFFSET, segment_stats

    topic = topic_factory()
    writer = settings.writer.model_copy(update={"max_row_group_rows": 8})  # 5-row groups are "full" enough
    w = TopicWriter(storage, topic, writer)
    for _ in range(8):
        w.append(make_batch(5))
    uri = storage.topic_uri(topic)
    inputs = segments_of(storage.open_topic(topic))[0]
    groups = sum(pq.read_metadata(storage.file_path(uri, s.path)).num_row_groups for s in inputs)
    before = snapshot(storage, topic)
    report = TopicMaintenance(storage, topic, settings.maintenance, writer, background=False).run_task("rollup")
    assert report.runs == 1
    (merged,) = segments_of(storage.open_topic(topic))[0]
    path = storage.file_path(uri, merged.path)
    meta = pq.read_metadata(path)
    assert meta.created_by.startswith("parquet-rs") and meta.num_row_groups == groups == 8
    table = pq.read_table(path)
    assert table.schema.metadata[b"topiclake.order"] == SORTED_BY_OFFSET["topiclake.order"].encode()
    assert table.column("offset").to_pylist() == list(range(40))
    assert snapshot(storage, topic).equals(before)
    decoded = table.append_column("partition", pa.array([0] * 40, pa.int32())).select(TOPIC_SCHEMA.names)
    stats = [
        json.loads(e["add"]["stats"])
        for name in sorted(os.listdir(os.path.join(uri, "_delta_log")))
        if name.endswith(".json")
        for e in map(json.loads, open(os.path.join(uri, "_delta_log", name)))
        if "add" in e and e["add"]["path"] == merged.path
    ]
    assert stats == [json.loads(segment_stats(decoded.cast(TOPIC_SCHEMA)))]
    assert TopicReader(storage, topic, ReaderSettings()).fetch(0, 0, max_records=100).records.num_rows == 40


def test_segments_the_copy_would_not_keep_right_are_merged_by_decoding(storage, settings, topic_factory):
    """The chunk copy refuses, and the roll-up decodes, sorts and encodes again: a segment another
    writer left (no order mark: written before the mark, or by a job), offsets that do not ascend
    across the files, and row groups too small to keep (copying keeps them as they are; decoding
    writes them full)."""
    import pyarrow.parquet as pq

    from delta_log.table.segment_files import ParquetOptions, merge_segments

    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(8):
        w.append(make_batch(5))
    uri = storage.topic_uri(topic)
    paths = [s.path for s in sorted(segments_of(storage.open_topic(topic))[0], key=lambda s: s.first_offset)]
    full_enough = ParquetOptions(row_group_rows=8)
    copied = merge_segments(storage, uri, 0, paths, full_enough)
    assert copied is not None and copied.records == 40
    assert merge_segments(storage, uri, 0, [paths[1], paths[0], *paths[2:]], full_enough) is None  # out of order
    assert merge_segments(storage, uri, 0, paths, ParquetOptions()) is None  # 5-row groups of 8,192
    # the roll-up of those small row groups: decoded, written full
    before = snapshot(storage, topic)
    report = TopicMaintenance(storage, topic, settings.maintenance, settings.writer, background=False).run_task(
        "rollup"
    )
    assert report.runs == 1
    (merged,) = segments_of(storage.open_topic(topic))[0]
    meta = pq.read_metadata(storage.file_path(uri, merged.path))
    assert meta.created_by.startswith("parquet-cpp") and meta.num_row_groups == 1
    assert snapshot(storage, topic).equals(before)
    # a file another writer left: the same rows, no mark (rewritten in place, so only merged here)
    foreign = storage.file_path(uri, paths[1])
    pq.write_table(pq.read_table(foreign).replace_schema_metadata(None), foreign)
    assert merge_segments(storage, uri, 0, paths, full_enough) is None


def test_on_local_disk_the_rollup_plans_on_the_followed_log_and_a_stale_plan_conflicts(
    storage, settings, topic_factory
):
    """On local disk a pass plans on a reader that follows the log and writes its entry on that
    reader's version: no table object is read. A plan made on a version since which another
    roll-up removed its files is refused at the commit, and its merged files are deleted."""
    import os

    from delta_log.maintenance.rollup import roll_up
    from delta_log.table.segment_files import ParquetOptions

    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(16):
        w.append(make_batch(3))
    before = snapshot(storage, topic)
    stale = TopicReader(storage, topic).followed_log()
    assert stale is not None and len(stale.segments[0]) == 16

    roller = TopicMaintenance(storage, topic, settings.maintenance, settings.writer, background=False)
    try:
        assert roller.run_task("rollup").files_removed == 16
        assert roller._dt is None  # planned and committed without the table object
    finally:
        roller.close()
    assert snapshot(storage, topic).equals(before)

    part_dir = os.path.join(storage.topic_uri(topic), "partition=0")
    files_before = set(os.listdir(part_dir))
    report = roll_up(
        storage,
        storage.topic_uri(topic),
        stale,
        settings.maintenance,
        parquet=ParquetOptions.of(settings.writer),
        attempts=5,
    )
    assert report.conflicts == 1 and report.files_added == 0
    assert set(os.listdir(part_dir)) == files_before  # its merged files were deleted
    assert snapshot(storage, topic).equals(before)
