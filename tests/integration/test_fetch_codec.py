"""compression.type=producer: the codec a partition's Kafka producers compressed their batches with
is kept as metadata of the segment files (delta_log.core.records.CODEC_KEY), through the writer,
the write-ahead flush and the roll-up, and Fetch encodes the files' records in it, whether the
compiled codec reads the file itself or the general path reads it with pyarrow."""

import pyarrow.parquet as pq

from delta_log import AppendRequest, TopicReader, TopicWriter
from delta_log.core.records import CODEC_KEY
from delta_log.maintenance.topic_maintenance import TopicMaintenance
from delta_log.table.segment_files import segments_of
from kafka_gateway.records import StoredBatches, decode_batches
from tests.integration.conftest import make_batch

PRODUCER = StoredBatches().compressed("producer")


def codecs_fetched(reader: TopicReader, *, native: bool) -> set[str]:
    """The codecs of the batches a fetch of partition 0 from offset 0 returns."""
    if native:
        got = reader.fetch(0, 0, max_records=10_000, max_bytes=1 << 30, encoder=PRODUCER)
        assert got.encoded is not None
        data = got.encoded
    else:  # the general path: the rows read by pyarrow, then encoded
        data = PRODUCER.table(reader.fetch(0, 0, max_records=10_000, max_bytes=1 << 30).records)
    return {b.compression for b in decode_batches(data, max_records=10**6, max_bytes=1 << 30).batches}


def file_codecs(storage, topic: str) -> list[str | None]:
    uri = storage.topic_uri(topic)
    out = []
    for seg in sorted(segments_of(storage.open_topic(topic))[0], key=lambda s: s.first_offset):
        meta = pq.read_metadata(storage.file_path(uri, seg.path)).metadata or {}
        out.append(meta.get(CODEC_KEY.encode(), b"").decode() or None)
    return out


def test_the_producers_codec_is_kept_with_the_files_and_fetched_in_it(storage, settings, topic_factory):
    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(20):
        w.append_many([AppendRequest(batch=make_batch(5), codec="zstd")])
    assert file_codecs(storage, topic) == ["zstd"] * 20
    reader = TopicReader(storage, topic)  # a new reader: no tail, every record from the files
    assert codecs_fetched(reader, native=True) == {"zstd"}
    assert codecs_fetched(reader, native=False) == {"zstd"}
    # the roll-up's merged files keep it (decoded and written again: their row groups are small)
    TopicMaintenance(storage, topic, settings.maintenance, settings.writer, background=False).run_task("rollup")
    merged = file_codecs(storage, topic)
    assert len(merged) < 20 and set(merged) == {"zstd"}
    reader.refresh()
    assert codecs_fetched(reader, native=True) == {"zstd"}
    # a later producer's codec: the files it wrote carry its own; HTTP's records carry none
    w.append_many([AppendRequest(batch=make_batch(5), codec="lz4")])
    w.append_many([AppendRequest(batch=make_batch(5))])
    assert file_codecs(storage, topic) == [*merged, "lz4", None]
    assert codecs_fetched(TopicReader(storage, topic), native=True) == {"zstd", "lz4", "none"}


def test_the_write_ahead_flush_keeps_the_codec(storage, settings, topic_factory):
    """Records staged and acked elsewhere (a `log` topic's write-ahead log), committed later."""
    from delta_log.log.writer import stage

    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer)
    staged = stage([AppendRequest(batch=make_batch(5), codec="gzip")], w.transactions, topic)
    assert staged.codecs == {0: "gzip"}
    assert w.commit_staged(staged.records, codecs=staged.codecs) == 5
    assert file_codecs(storage, topic) == ["gzip"]
    assert codecs_fetched(TopicReader(storage, topic), native=True) == {"gzip"}
