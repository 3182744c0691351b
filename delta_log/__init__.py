"""The log: topics as Delta tables, written and read through delta-rs and pyarrow.

The rooms (core, table, log, system, maintenance, registry, spark) are described in docs/DESIGN.md;
this module re-exports what most callers need.
"""

from delta_log.core.producer import ProducerSequence
from delta_log.core.records import BATCH_SCHEMA, TOPIC_SCHEMA, PartitionRange, normalize_batch
from delta_log.core.topic_config import TopicConfig
from delta_log.errors import TopiclakeError
from delta_log.log.catalog import Catalog, TopicDescription
from delta_log.log.reader import FetchResult, PartitionOffsets, TopicReader
from delta_log.log.writer import AppendRequest, AppendResult, CommitInfo, TopicWriter
from delta_log.system.offsets import OffsetCommit, OffsetStore
from delta_log.table.storage import StorageRoot

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
