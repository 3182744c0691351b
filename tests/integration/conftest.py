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
