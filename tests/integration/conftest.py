from __future__ import annotations

import itertools
import time

import pyarrow as pa
import pytest

from conf import load_settings
from delta_log import Catalog, StorageRoot, normalize_batch

_ids = itertools.count()


@pytest.fixture
def settings(tmp_path):
    return load_settings(root=str(tmp_path / "root"))


@pytest.fixture
def storage(settings):
    return StorageRoot(settings.root)


@pytest.fixture
def catalog(storage, settings):
    return Catalog(storage, settings.writer)


@pytest.fixture
def topic_factory(catalog):
    def make(partitions: int = 1, **config: object) -> str:
        name = f"t{next(_ids)}-{time.monotonic_ns() % 10**6}"
        catalog.create_topic(name, partitions=partitions, config={k.replace("_", "."): v for k, v in config.items()})
        return name

    return make


def make_batch(
    n: int,
    *,
    partitions: int = 1,
    partition_of=None,
    value_size: int = 10,
    topic: str = "t",
    key_prefix: str = "k",
) -> pa.Table:
    parts = [partition_of(i) if partition_of else i % partitions for i in range(n)]
    return normalize_batch(
        pa.table(
            {
                "key": [f"{key_prefix}{i}".encode() for i in range(n)],
                "value": [(f"{key_prefix}{i}:".encode() + b"x" * value_size)[: max(value_size, 1)] for i in range(n)],
                "partition": pa.array(parts, pa.int32()),
            }
        ),
        partitions=max(parts) + 1 if parts else 1,
        topic=topic,
        max_message_bytes=10**7,
        now_us=int(time.time() * 1e6),
        log_append_time=False,
    )


@pytest.fixture
def decoded_groups(monkeypatch) -> list[int]:
    """The row groups read from parquet files from now on, in order (the reader decodes through
    `ParquetFile.read_row_group`)."""
    import pyarrow.parquet as pq

    decoded: list[int] = []
    real = pq.ParquetFile.read_row_group

    def counting(self, i, *args, **kwargs):
        decoded.append(i)
        return real(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    return decoded


def rewrite_segment(storage, topic: str, victim, order: list[int], **options) -> str:
    """Replace the segment `victim` (partition 0) of `topic` by one holding its rows in `order`, as
    another engine's rewrite may leave them (`options`: ParquetOptions); returns its path."""
    import pyarrow.parquet as pq
    from deltalake.transaction import RemoveAction

    from delta_log.core.records import TOPIC_SCHEMA
    from delta_log.table.file_commit import commit_file_changes
    from delta_log.table.segment_files import ParquetOptions, write_segments

    uri = storage.topic_uri(topic)
    rows = pq.read_table(storage.file_path(uri, victim.path))
    rows = rows.append_column("partition", pa.array([0] * rows.num_rows, pa.int32())).select(TOPIC_SCHEMA.names)
    (new,) = write_segments(storage, uri, rows.take(order).cast(TOPIC_SCHEMA), ParquetOptions(**options))
    now = int(time.time() * 1000)
    commit_file_changes(
        storage.open_topic(topic),
        [victim.path],
        [new.action, RemoveAction(victim.path, False, now, victim.size_bytes, {"partition": "0"})],
        operation="test",
        attempts=3,
    )
    return new.relative_path
