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
        acked = _run_worker(settings, topic, tmp_path, 20, env=QUICK_LEASE)
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
