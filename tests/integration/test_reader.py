import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from conf import ReaderSettings
from delta_log import TopicReader, TopicWriter
from delta_log.errors import InvalidOffsetError, OffsetOutOfRangeError, PartitionNotFoundError
from tests.integration.conftest import make_batch, rewrite_segment


@pytest.fixture
def filled(storage, settings, topic_factory):
    topic = topic_factory(partitions=2)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(20):
        w.append(make_batch(10, partitions=2, value_size=100))  # 5 per partition per commit
    return topic, w


def test_fetch_across_segments(storage, filled):
    topic, _ = filled
    r = TopicReader(storage, topic)
    res = r.fetch(1, 7, max_records=30)
    assert res.records.column("offset").to_pylist() == list(range(7, 37))
    assert set(res.records.column("partition").to_pylist()) == {1}
    assert res.records.column("topic").to_pylist()[0] == topic
    assert res.next_offset == 37 and res.high_watermark == 100 and res.log_start_offset == 0
    assert r.partition_offsets()[1].segments == 20


def test_fetch_max_bytes_returns_at_least_one(storage, filled):
    topic, _ = filled
    r = TopicReader(storage, topic)
    assert r.fetch(0, 0, max_records=100, max_bytes=1).records.num_rows == 1
    res = r.fetch(0, 0, max_records=100, max_bytes=1000)
    assert 1 < res.records.num_rows < 10


def test_fetch_at_high_watermark_is_empty_beyond_is_error(storage, filled):
    topic, _ = filled
    r = TopicReader(storage, topic)
    assert r.fetch(0, 100).records.num_rows == 0
    with pytest.raises(OffsetOutOfRangeError) as e:
        r.fetch(0, 101)
    assert e.value.details["high_watermark"] == 100 and e.value.details["log_start_offset"] == 0


def test_bad_fetch_arguments(storage, filled):
    topic, _ = filled
    r = TopicReader(storage, topic)
    with pytest.raises(InvalidOffsetError):
        r.fetch(0, -1)
    with pytest.raises(InvalidOffsetError):
        r.fetch(0, 0, max_records=0)
    with pytest.raises(PartitionNotFoundError):
        r.fetch(2, 0)


def test_log_start_offset_after_prefix_delete(storage, filled):
    topic, _w = filled
    DeltaTable(storage.topic_uri(topic)).delete('"offset" < 25 AND partition = 0')
    r = TopicReader(storage, topic)
    assert r.log_start_offset(0) >= 25
    with pytest.raises(OffsetOutOfRangeError) as e:
        r.fetch(0, 3)
    assert e.value.details["log_start_offset"] == r.log_start_offset(0)


def test_incremental_refresh_sees_other_writer(storage, filled, settings):
    topic, _ = filled
    r = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=3600, end_refresh_interval_s=0))
    other = TopicWriter(storage, topic, settings.writer)
    other.append(make_batch(4, partitions=2))
    # asking past the known high watermark forces a refresh
    assert r.fetch(0, 100).records.column("offset").to_pylist() == [100, 101]


def test_tail_cache_serves_and_survives_gaps(storage, settings, topic_factory):
    topic = topic_factory()
    r = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=3600))
    w = TopicWriter(storage, topic, settings.writer, on_commit=r.on_commit)
    w.append(make_batch(5))
    TopicWriter(storage, topic, settings.writer).append(make_batch(5))  # another writer: a gap in our tail
    w.append(make_batch(5))
    res = r.fetch(0, 0, max_records=100)
    assert res.records.column("offset").to_pylist() == list(range(15))


def test_a_tail_that_another_writer_went_past_answers_no_fetch_short(storage, settings, topic_factory):
    """This process appended the start of a partition, then another gateway appended on (its
    partitions moved). A fetch from memory must not stop at this process's tail while the log goes
    on: the fetch reads on from the segments, as far as the limits allow (a cluster test once read
    a partition's first records only, for as long as it asked)."""
    topic = topic_factory()
    r = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=0))
    TopicWriter(storage, topic, settings.writer, on_commit=r.on_commit).append(make_batch(5))
    TopicWriter(storage, topic, settings.writer).append(make_batch(5))  # another gateway, past our tail
    r.refresh()
    assert r.high_watermark(0) == 10
    assert r.fetch_cached(0, 0, max_records=100) is None  # memory alone cannot answer it whole
    assert r.fetch(0, 0, max_records=100).records.column("offset").to_pylist() == list(range(10))
    # what the tail holds still answers from memory when the limits end inside it
    assert r.fetch_cached(0, 0, max_records=3).records.column("offset").to_pylist() == [0, 1, 2]
    assert r.fetch_cached(0, 0, max_records=100, max_bytes=1).records.num_rows == 1


def test_offset_for_timestamp(storage, settings, topic_factory):
    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    w.append(make_batch(3))
    time.sleep(0.01)
    mid = int(time.time() * 1000)
    time.sleep(0.01)
    w.append(make_batch(3))
    r = TopicReader(storage, topic)
    assert r.offset_for_timestamp(0, 0) == 0
    assert r.offset_for_timestamp(0, mid) == 3
    assert r.offset_for_timestamp(0, mid + 10**9) is None


def test_high_watermarks_from_new_commits_equal_the_tables(storage, settings, topic_factory, catalog):
    """A refresh applies the hw txns of the commits since its snapshot; what it gets must be what
    the table says partition by partition, across writers, added partitions and log cleanup."""
    from delta_log.table.app_transactions import read_high_watermarks

    topic = topic_factory(partitions=6)
    r = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=0))
    writers = [TopicWriter(storage, topic, settings.writer) for _ in range(2)]
    for i in range(12):
        writers[i % 2].append(make_batch(3 + i, partitions=1, partition_of=lambda j, i=i: (i + j) % (1 + i % 6)))
        if i == 6:
            catalog.add_partitions(topic, 9)
        v = r.refresh()
        dt = DeltaTable(storage.topic_uri(topic), version=v)
        assert r._snap.high_watermarks == read_high_watermarks(dt, r.config.partitions), i
    assert r.partition_offsets()[0].high_watermark > 0


def test_sequential_fetches_decode_each_row_group_once(storage, settings, topic_factory, decoded_groups):
    """A consumer's fetches end and start inside row groups: each group is decoded once and kept on
    its own, so the next fetch, which spans it and the following one, decodes only the new one."""

    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer.model_copy(update={"max_row_group_rows": 10}))
    w.append(make_batch(100, partitions=1, value_size=10))  # one file of 10 row groups
    decoded = decoded_groups
    r = TopicReader(storage, topic)
    offsets = []
    offset = 0
    while offset < 100:
        res = r.fetch(0, offset, max_records=15)  # 15 rows: every fetch ends inside a group
        offsets += res.records.column("offset").to_pylist()
        offset = res.next_offset
    assert offsets == list(range(100))
    assert sorted(decoded) == list(range(10))  # each of the 10 groups once


def test_following_the_log_builds_the_index_the_table_gives(storage, settings, topic_factory, catalog):
    """On local disk a refresh applies the new commit entries to the index instead of reading the
    table object. After appends from two writers, roll-ups (removes), a delete that rewrites files,
    added partitions (a metaData entry: the table is read) and retention, the index must be the one
    built from the table at that version, and the table object is left behind until asked for."""
    from delta_log.log.index import build_snapshot
    from delta_log.maintenance.topic_maintenance import TopicMaintenance

    topic = topic_factory(partitions=3)
    r = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=3600))
    writers = [TopicWriter(storage, topic, settings.writer) for _ in range(2)]
    roller = TopicMaintenance(storage, topic, settings.maintenance, settings.writer)
    followed = 0

    def check(step):
        nonlocal followed
        before = r._dt.version()
        v = r.refresh()
        followed += r._dt.version() == before < v
        expected = build_snapshot(
            DeltaTable(storage.topic_uri(topic), version=v), topic=topic, stats_fallback=r._footers.stats, now=0
        )
        got = {p: ix.segments for p, ix in r._snap.partitions.items() if ix.segments}
        assert got == {p: ix.segments for p, ix in expected.partitions.items()}, step
        assert {p: h for p, h in r._snap.high_watermarks.items() if h} == {
            p: h for p, h in expected.high_watermarks.items() if h
        }, step
        assert r._snap.config == expected.config, step

    try:
        for i in range(24):
            writers[i % 2].append(make_batch(6, partitions=3))
            if i % 5 == 0:
                check(f"append {i}")
        check("appends")
        assert roller.run_once()["rollup"].files_removed > 0
        check("roll-up")
        DeltaTable(storage.topic_uri(topic)).delete('"offset" < 5 AND partition = 1')
        check("delete")
        catalog.add_partitions(topic, 4)
        writers[0].append(make_batch(8, partitions=4))
        check("added partitions")
        writers[1].append(make_batch(8, partitions=4))
        check("after the metaData entry")
    finally:
        roller.close()
    assert followed >= 5  # most refreshes followed the entries, not the table object
    assert r.table.version() == r.table_version  # asked for, the table object catches up
    assert r.fetch(3, 0, max_records=100).records.column("offset").to_pylist() == [0, 1, 2, 3]


def test_a_fetch_decodes_the_row_groups_its_byte_budget_needs(storage, settings, topic_factory, decoded_groups):
    """Well-compressed records: a file of 20 row groups of ~10 KB each (uncompressed) stores a small
    fraction of that. A 25 KB fetch decodes the 3-4 groups its budget covers by their uncompressed
    size, not the ~20 the file's stored size per record would suggest."""

    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer.model_copy(update={"max_row_group_rows": 10}))
    w.append(make_batch(200, partitions=1, value_size=1000))  # "k1:xxx...": compresses ~50x
    decoded = decoded_groups
    r = TopicReader(storage, topic)
    seg = r._snap.partitions[0].segments[0]
    assert seg.size_bytes < 200 * 1000 // 5  # the premise: stored well compressed
    res = r.fetch(0, 0, max_records=10_000, max_bytes=25_000)
    assert res.records.column("offset").to_pylist() == list(range(res.next_offset))
    assert 20 <= res.next_offset <= 25
    assert 3 <= len(decoded) <= 4, decoded


def test_read_ahead_serves_the_next_fetch_as_it_would_have_been_read(storage, settings, topic_factory):
    """After a fetch from stored segments the next one (same limits) is read ahead, and the door's
    encoder runs on it there; taken, it is the fetch a reader without read-ahead gives, with the
    high watermark known now; a fetch with another encoder (or none) reads for itself. One whose
    records retention removed meanwhile is not served."""
    from delta_log.log.read_ahead import ReadAhead

    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(6):
        w.append(make_batch(50, partitions=1, value_size=200))
    ra = ReadAhead(64 << 20, size=lambda result: result.held_bytes())
    r = TopicReader(storage, topic, read_ahead=ra)
    plain = TopicReader(storage, topic)
    encoded = []

    class Ipc:
        """Records in the Arrow IPC stream format (a wire form that reads back as the table)."""

        def table(self, records):
            encoded.append(records.num_rows)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, records.schema) as out:
                out.write_table(records)
            return sink.getvalue().to_pybytes()

        def stored(self, path, row_groups, **limits):
            return "the general read, please"

    def read_streams(data):  # one stream per piece the fetch put together
        source, tables = pa.BufferReader(data), []
        while source.tell() < len(data):
            tables.append(pa.ipc.open_stream(source).read_all())
        return pa.concat_tables(tables)

    ipc = Ipc()
    try:
        offset = 0
        while offset < 300:
            got = r.fetch(0, offset, max_records=40, max_bytes=5000, encoder=ipc)
            want = plain.fetch(0, offset, max_records=40, max_bytes=5000)
            assert read_streams(got.encoded).equals(want.records)
            assert got.count == want.count == want.records.num_rows and got.next_offset == want.next_offset
            assert (got.high_watermark, got.log_start_offset) == (want.high_watermark, want.log_start_offset)
            offset = got.next_offset
            assert ra.wait_for_reads(30)  # the consumer takes its time (a read not started is not waited for)
        assert ra.hits >= 6 and len(encoded) > ra.hits  # fetches after the first were read (and encoded) ahead
        first = r.fetch(0, 0, max_records=40, max_bytes=5000, encoder=ipc)  # the next one is read ahead for ipc
        assert ra.wait_for_reads(30)
        hits = ra.hits
        other = r.fetch(0, first.next_offset, max_records=40, max_bytes=5000)  # no encoder: reads for itself
        assert ra.hits == hits and other.encoded is None
        assert other.records.equals(plain.fetch(0, first.next_offset, max_records=40, max_bytes=5000).records)
        first = r.fetch(0, 0, max_records=40, max_bytes=5000)  # the next one is read ahead now
        assert ra.wait_for_reads(30)
        w.append(make_batch(5, partitions=1))
        r.refresh()
        hits = ra.hits
        second = r.fetch(0, first.next_offset, max_records=40, max_bytes=5000)
        assert ra.hits == hits + 1 and second.high_watermark == 305  # read before the append, told now
        assert ra.wait_for_reads(30)  # the one after `second` is read ahead; then retention removes its records
        DeltaTable(storage.topic_uri(topic)).delete('"offset" < 200')
        r.refresh()
        hits = ra.hits
        with pytest.raises(OffsetOutOfRangeError):
            r.fetch(0, second.next_offset, max_records=40, max_bytes=5000)
        assert ra.hits == hits + 1  # taken, and refused for the log start offset
    finally:
        ra.close()


def test_segment_files_stay_open_within_a_bound_and_read_after_deletion(storage, settings, topic_factory):
    """A reader keeps the segment files it reads open (a consumer reads a file's row groups fetch
    after fetch), at most OPEN_FILES of them; one deleted meanwhile (vacuum) still reads, since
    its records were in the snapshot the fetch planned on."""
    import os

    from delta_log.log import reader as reader_module

    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(reader_module.OPEN_FILES + 4):
        w.append(make_batch(3, partitions=1))
    r = TopicReader(storage, topic)
    got = r.fetch(0, 0, max_records=10_000).records.column("offset").to_pylist()
    assert got == list(range(3 * (reader_module.OPEN_FILES + 4)))
    assert len(r._files._open) == reader_module.OPEN_FILES
    newest = r._snap.partitions[0].segments[-1]
    r._row_groups = reader_module.RowGroupCache(r.settings.row_group_cache_bytes)  # decode again
    os.remove(storage.file_path(r.uri, newest.path))
    assert r.fetch(0, newest.first_offset).records.num_rows == 3


def test_a_file_out_of_order_reads_in_offset_order(storage, settings, topic_factory):
    """Another engine's rewrite (Spark's bin-packing OPTIMIZE) may keep rows out of offset order,
    inside row groups and across them: fetches still return offsets in order, from any offset."""
    import pyarrow.parquet as pq

    from delta_log.table.segment_files import segments_of

    topic = topic_factory()
    TopicWriter(storage, topic, settings.writer).append(make_batch(30))
    (victim,) = segments_of(storage.open_topic(topic))[0]
    # shuffled, in row groups of 10 whose offset ranges overlap
    path = rewrite_segment(storage, topic, victim, [(i * 7) % 30 for i in range(30)], row_group_rows=10)
    assert pq.read_metadata(storage.file_path(storage.topic_uri(topic), path)).num_row_groups == 3
    r = TopicReader(storage, topic)
    assert r.fetch(0, 0, max_records=100).records.column("offset").to_pylist() == list(range(30))
    assert r.fetch(0, 17, max_records=5).records.column("offset").to_pylist() == list(range(17, 22))
    res = r.fetch(0, 25, max_records=100, max_bytes=1)  # at least one record, the right one
    assert res.records.column("offset").to_pylist() == [25] and res.next_offset == 26


def test_a_reader_far_behind_catches_up_in_one_refresh(storage, settings, topic_factory):
    """More new versions than a refresh follows entry by entry: the table object catches up at once,
    so the high watermark is never one from part of the way."""
    from delta_log.table.app_transactions import MAX_INCREMENTAL_VERSIONS

    topic = topic_factory(partitions=1)
    r = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=3600, end_refresh_interval_s=3600))
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(MAX_INCREMENTAL_VERSIONS + 6):
        w.append(make_batch(1))
    r.refresh()
    assert r.high_watermark(0) == MAX_INCREMENTAL_VERSIONS + 6
    assert r.fetch(0, MAX_INCREMENTAL_VERSIONS + 5).records.num_rows == 1


@pytest.mark.parametrize("new_versions", [2, 12], ids=["behind-the-reader", "past-the-reader"])
def test_a_topic_deleted_and_made_again_is_read_as_the_new_table(
    storage, settings, topic_factory, catalog, new_versions
):
    """Another gateway deletes the topic and creates it again under the same name: a reader that
    followed the old table must read the new one at its next refresh, whether the new table's log
    is still behind the version the reader held or already past it (its entries then continue the
    old numbering, and following them would mix the two tables)."""
    topic = topic_factory(partitions=1)
    r = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=3600, end_refresh_interval_s=3600))
    old = TopicWriter(storage, topic, settings.writer)
    for _ in range(6):
        old.append(make_batch(3, key_prefix="old"))
    assert r.refresh() == 6 and r.high_watermark(0) == 18
    catalog.delete_topic(topic)
    catalog.create_topic(topic, partitions=1)
    new = TopicWriter(storage, topic, settings.writer)
    for _ in range(new_versions):
        new.append(make_batch(2, key_prefix="new"))
    r.refresh()
    assert r.high_watermark(0) == 2 * new_versions
    keys = r.fetch(0, 0, max_records=100).records.column("key").to_pylist()
    assert len(keys) == 2 * new_versions and all(k.startswith(b"new") for k in keys)
