"""The log: topics as Delta tables, written and read through delta-rs and pyarrow.

The rooms (core, table, log, system, maintenance, registry, spark) are described in docs/DESIGN.md;
this module re-exports what most callers need, each imported on first use: a client that needs one
pure function (the Python producer's key partitioner) does not load the whole log (0.5 s).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delta_log.core.producer import ProducerSequence
    from delta_log.core.records import BATCH_SCHEMA, TOPIC_SCHEMA, PartitionRange, normalize_batch
    from delta_log.core.topic_config import TopicConfig
    from delta_log.errors import TopiclakeError
    from delta_log.log.catalog import Catalog, TopicDescription
    from delta_log.log.reader import FetchResult, PartitionOffsets, TopicReader
    from delta_log.log.writer import AppendRequest, AppendResult, CommitInfo, TopicWriter
    from delta_log.system.offsets import OffsetCommit, OffsetStore
    from delta_log.table.storage import StorageRoot

#: each re-exported name -> the module it comes from
_EXPORTS = {
    "ProducerSequence": "delta_log.core.producer",
    "BATCH_SCHEMA": "delta_log.core.records",
    "TOPIC_SCHEMA": "delta_log.core.records",
    "PartitionRange": "delta_log.core.records",
    "normalize_batch": "delta_log.core.records",
    "TopicConfig": "delta_log.core.topic_config",
    "TopiclakeError": "delta_log.errors",
    "Catalog": "delta_log.log.catalog",
    "TopicDescription": "delta_log.log.catalog",
    "FetchResult": "delta_log.log.reader",
    "PartitionOffsets": "delta_log.log.reader",
    "TopicReader": "delta_log.log.reader",
    "AppendRequest": "delta_log.log.writer",
    "AppendResult": "delta_log.log.writer",
    "CommitInfo": "delta_log.log.writer",
    "TopicWriter": "delta_log.log.writer",
    "OffsetCommit": "delta_log.system.offsets",
    "OffsetStore": "delta_log.system.offsets",
    "StorageRoot": "delta_log.table.storage",
}

__all__ = [
    "BATCH_SCHEMA",
    "TOPIC_SCHEMA",
    "AppendRequest",
    "AppendResult",
    "Catalog",
    "CommitInfo",
    "FetchResult",
    "OffsetCommit",
    "OffsetStore",
    "PartitionOffsets",
    "PartitionRange",
    "ProducerSequence",
    "StorageRoot",
    "TopicConfig",
    "TopicDescription",
    "TopicReader",
    "TopicWriter",
    "TopiclakeError",
    "normalize_batch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:  # (a submodule, `from delta_log import errors`, is then imported as one)
        raise AttributeError(f"module 'delta_log' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
