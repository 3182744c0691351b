"""The Kafka fetch path straight from stored parquet (kafka_gateway.records.StoredBatches: the codec
decodes a segment's row groups and encodes the batches in one call): a fetch returns the records
the general path (pyarrow decode, then encode) returns, whatever the limits, where the fetch
starts in a row group, the file's layout or the records' shape."""

import os
import random
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from delta_log import TopicReader, TopicWriter
from delta_log.core.records import HEADERS_TYPE, normalize_batch, record_sizes
from delta_log.log.read_ahead import ReadAhead
from delta_log.log.reader import Encoded, FetchResult
from kafka_gateway.records import StoredBatches, decode_batches
from tests.integration.conftest import rewrite_segment


class Counting(StoredBatches):
    """StoredBatches that remembers whether each stored read was its own (True) or handed back,
    and the files it read itself."""

    def __init__(self, max_footer_bytes: int = 20_000) -> None:  # a few files' worth: parsed again too
        super().__init__(max_footer_bytes=max_footer_bytes)
        self.native: list[bool] = []
        self.read: set[str] = set()

    def stored(self, path, row_groups, **limits):
        got = super().stored(path, row_groups, **limits)
        self.native.append(isinstance(got, Encoded))
        if isinstance(got, Encoded):
            self.read.add(path)
        return got


def varied(n: int, start: int) -> pa.Table:
    """Null keys and values (tombstones), headers on some records, producer timestamps that are
    no whole millisecond on some and the server's (LogAppendTime, not all the same) on others,
    sizes that vary."""
    now = int(time.time() * 1e6)
    table = pa.table(
        {
            "key": pa.array([None if i % 5 == 0 else f"k{start + i}".encode() for i in range(n)], pa.binary()),
            "value": pa.array(
                [
                    None if i % 7 == 0 else bytes([65 + (start + i) % 26]) * (40 + (start + i) * 37 % 300)
                    for i in range(n)
                ],
                pa.binary(),
            ),
            "partition": pa.array([0] * n, pa.int32()),
            "timestamp": pa.array(
                [None if (i // 3) % 4 == 0 else now - 1000 * (start + i) - 123 for i in range(n)],
                pa.timestamp("us", tz="UTC"),
            ),
            "headers": pa.array(
                [
                    [{"key": f"h{j}", "value": b"v" * (i % 9)} for j in range(i % 3)] if i % 4 else None
                    for i in range(n)
                ],
                HEADERS_TYPE,
            ),
        }
    )
    out = normalize_batch(table, partitions=1, topic="t", max_message_bytes=10**7, now_us=now, log_append_time=False)
    # the server's times differ from one append to the next: some within this batch too
    types = out.column("timestampType").to_pylist()
    times = [
        now - 1000 * (i // 6) - 7 if t == 1 else ts
        for i, (t, ts) in enumerate(zip(types, out.column("timestamp").cast(pa.int64()).to_pylist(), strict=True))
    ]
    return out.set_column(
        out.schema.get_field_index("timestamp"),
        "timestamp",
        pa.array(times, pa.int64()).cast(out.schema.field("timestamp").type),
    )


def records(data: bytes) -> dict[str, list]:
    """Every record of `data` (concatenated batches), field by field, with its timestamp type."""
    d = decode_batches(data, max_records=10**6, max_bytes=1 << 30, strict_offsets=False)
    types = [b.timestamp_type for b in d.batches for _ in range(b.record_count)]
    return {
        "offset": d.offset.to_pylist(),
        "key": d.key.to_pylist(),
        "value": d.value.to_pylist(),
        "timestamp_ms": d.timestamp_ms.to_pylist(),
        "headers": d.headers.to_pylist(),
        "timestamp_type": types,
    }


LIMITS = [(1, 10**6), (7, 10**6), (10**4, 1), (10**4, 700), (10**4, 5000), (40, 3000), (10**4, 10**6)]


def fetch_everywhere(reader: TopicReader, encoder: StoredBatches, step: int) -> int:
    """Fetches from every `step`-th offset with each of LIMITS, both ways; the records compared."""
    hw = reader.high_watermark(0)
    lso = reader.log_start_offset(0)
    fetches = 0
    for offset in range(lso, hw, step):
        for max_records, max_bytes in LIMITS:
            got = reader.fetch(0, offset, max_records=max_records, max_bytes=max_bytes, encoder=encoder)
            want = reader.fetch(0, offset, max_records=max_records, max_bytes=max_bytes)
            assert (got.next_offset, got.count) == (want.next_offset, want.records.num_rows), (offset, max_bytes)
            assert got.encoded_size == int(record_sizes(want.records).sum())
            assert got.encoded is not None and records(got.encoded) == records(encoder.table(want.records))
            stored_ms = [int(us / 1000) for us in want.records.column("timestamp").cast(pa.int64()).to_pylist()]
            assert records(got.encoded)["timestamp_ms"] == stored_ms  # each record's own time, both types
            fetches += 1
    return fetches


@pytest.fixture
def small_groups(settings):
    return settings.writer.model_copy(update={"max_row_group_rows": 37})


def test_a_fetch_from_dense_segments_reads_them_itself_and_returns_what_the_general_path_does(
    storage, small_groups, topic_factory
):
    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, small_groups)
    for i in range(5):
        w.append(varied(120, 120 * i))
    encoder = Counting()
    assert fetch_everywhere(TopicReader(storage, topic), encoder, step=13) > 200
    assert encoder.native and all(encoder.native)  # every stored read was the codec's own
    files, held = encoder._files.footers()
    assert 1 <= files < 5 and (held <= 20_000 or files == 1)  # bounded by bytes (the last one read stays)


def test_compacted_segments_with_gaps_are_read_by_offset_not_by_row(storage, small_groups, topic_factory):
    """Rows removed (as compaction and DeleteRecords leave them): a group's rows no longer follow
    its lowest offset one by one, so the read finds the fetch's first record by offset."""
    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, small_groups)
    for i in range(4):
        w.append(varied(150, 150 * i))
    reader = TopicReader(storage, topic)
    for seg in list(reader._snap.partitions[0].segments):
        kept = [i for i in range(seg.records) if (o := seg.first_offset + i) % 3 != 1 and not 200 < o < 260]
        rewrite_segment(storage, topic, seg, kept, row_group_rows=37)
    reader.refresh()
    encoder = Counting()
    assert fetch_everywhere(reader, encoder, step=11) > 200
    assert encoder.native and all(encoder.native)


@pytest.mark.parametrize("rewrite", ["shuffled", "delta-rs delete", "groups out of order"])
def test_a_segment_out_of_offset_order_is_handed_back_to_the_general_read(
    rewrite, storage, small_groups, topic_factory
):
    """Another engine's rewrite may leave a file's rows out of order (a delta-rs DELETE does): the
    codec finds it out by the group's offsets and hands it back, and the reader sorts it as
    before; the answer is the same."""
    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, small_groups)
    for i in range(3):
        w.append(varied(100, 100 * i))
    reader = TopicReader(storage, topic)
    victim = None
    if rewrite == "shuffled":
        order = list(range(100))
        random.Random(7).shuffle(order)
        victim = rewrite_segment(storage, topic, reader._snap.partitions[0].segments[1], order)
    elif rewrite == "groups out of order":  # each group sorted, the second before the first
        order = [*range(37, 74), *range(37), *range(74, 100)]
        victim = rewrite_segment(storage, topic, reader._snap.partitions[0].segments[1], order, row_group_rows=37)
    else:
        DeltaTable(storage.topic_uri(topic)).delete('"offset" % 3 = 1 AND "offset" < 200')
    reader.refresh()
    encoder = Counting()
    fetch_everywhere(reader, encoder, step=9)
    if rewrite == "groups out of order":  # told by the footer: the codec is not even asked
        assert not any(path.endswith(victim) for path in encoder.read) and encoder.read
    else:
        assert False in encoder.native
    if rewrite == "shuffled":
        assert True in encoder.native  # the other files were still its own


def test_a_file_removed_after_the_codec_read_it_is_still_served(storage, small_groups, topic_factory):
    """A vacuum may remove a file a reader's snapshot still lists: the codec keeps the files it
    read open, as the general read does, so the consumer reading it goes on."""
    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, small_groups)
    w.append(varied(100, 0))
    reader, encoder = TopicReader(storage, topic), Counting(max_footer_bytes=1 << 20)
    first = reader.fetch(0, 0, max_records=10, encoder=encoder)
    (path,) = encoder.read
    os.remove(path)
    rest = reader.fetch(0, first.next_offset, max_records=1000, encoder=encoder)
    assert rest.count == 90 and encoder.native == [True, True]
    assert records(first.encoded + rest.encoded)["offset"] == list(range(100))


def test_reads_ahead_through_the_codec(storage, small_groups, topic_factory):
    """Read ahead with the Kafka face's encoder: each fetch taken from the read-ahead is the one a
    plain read gives."""
    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, small_groups)
    for i in range(4):
        w.append(varied(100, 100 * i))
    ra = ReadAhead(64 << 20, size=FetchResult.held_bytes)
    reader, plain, encoder = TopicReader(storage, topic, read_ahead=ra), TopicReader(storage, topic), Counting()
    try:
        offset = 0
        while offset < 400:
            got = reader.fetch(0, offset, max_records=30, max_bytes=6000, encoder=encoder)
            want = plain.fetch(0, offset, max_records=30, max_bytes=6000)
            assert got.next_offset == want.next_offset
            assert records(got.encoded) == records(encoder.table(want.records))
            offset = got.next_offset
            assert ra.wait_for_reads(30)
        assert ra.hits >= 10 and encoder.native and all(encoder.native)
    finally:
        ra.close()
