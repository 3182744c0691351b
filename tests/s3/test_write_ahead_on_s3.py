"""`log` topics on an S3 root (a real MinIO server): every write-ahead write is one object (one
PUT); a producer process killed with kill -9 between its acks and its table flushes loses and
duplicates nothing once another process replays its objects."""

from __future__ import annotations

import pyarrow.fs as pafs
from deltalake import DeltaTable

from delta_log.log.wal import WAL_DIR
from delta_log.registry import TopicRegistry
from tests.integration.test_write_ahead import _replay_until_complete, _run_worker, log_topic

QUICK_LEASE = {"TOPICLAKE_WRITER__WAL_LEASE_MS": "1000", "TOPICLAKE_WRITER__WAL_LEASE_MARGIN_MS": "300"}


def wal_objects(storage) -> list[str]:
    fs, base = storage.filesystem()
    infos = fs.get_file_info(pafs.FileSelector(f"{base}/{WAL_DIR}", recursive=True, allow_not_found=True))
    return [i.path for i in infos if i.path.endswith(".wal")]


def test_a_kill_between_ack_and_flush_on_s3_loses_and_duplicates_nothing(settings, storage, tmp_path):
    registry = TopicRegistry(settings)
    try:
        topic = log_topic(registry, partitions=2, lag_ms=60_000)
        acked = _run_worker(settings, topic, tmp_path, 20, env=QUICK_LEASE, table_down=True)
        objects = wal_objects(storage)
        assert len(objects) >= 20  # one object per durable write
        assert DeltaTable(storage.topic_uri(topic), storage_options=storage.options()).to_pyarrow_table().num_rows == 0
        _replay_until_complete(registry)
        t = DeltaTable(storage.topic_uri(topic), storage_options=storage.options()).to_pyarrow_table(
            columns=["partition", "offset"]
        )
        stored: dict[int, list[int]] = {}
        for p, o in zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True):
            stored.setdefault(p, []).append(o)
        for p, offsets in stored.items():
            assert sorted(offsets) == list(range(len(offsets)))  # unique, contiguous
            assert acked.get(p, set()) <= set(offsets)  # every ack
        assert wal_objects(storage) == []  # replayed objects are deleted
    finally:
        registry.close()


def test_a_release_during_a_put_keeps_the_object_being_written(storage):
    """The flusher releases segments while the writer's PUT runs: the object being written (its
    records' offsets not booked yet) is not among them. Before, it was deleted as it was written,
    and its acked records were in no object."""
    from delta_log.log.wal import WriteAheadLog, encode_frame, read_dir
    from tests.integration.test_write_ahead import _wal_records

    wal = WriteAheadLog(storage, "put-race")
    put = wal.fs.open_output_stream

    def open_then_release(path: str, *args: object, **kw: object) -> object:
        stream = put(path, *args, **kw)
        assert wal.release({}) == 0  # (the flush thread's, with nothing of this write flushed)
        return stream

    wal.fs = _Hooked(wal.fs, open_output_stream=open_then_release)
    wal.append(encode_frame(_wal_records("t#1", 50), []), {("t#1", 0): 50})
    assert [f.records.num_rows for _, f in read_dir(storage, wal.dir)] == [50]
    assert len(wal_objects(storage)) == 1
    wal.close()


class _Hooked:
    """A filesystem with some methods replaced (pyarrow's are not assignable)."""

    def __init__(self, fs: object, **methods: object) -> None:
        self._fs, self._methods = fs, methods

    def __getattr__(self, name: str) -> object:
        return self._methods.get(name) or getattr(self._fs, name)
