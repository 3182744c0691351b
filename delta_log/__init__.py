"""The log: topics as Delta tables, written and read through delta-rs and pyarrow."""

from delta_log.core.records import BATCH_SCHEMA, TOPIC_SCHEMA, PartitionRange, normalize_batch
from delta_log.core.topic_config import TopicConfig
from delta_log.errors import TopiclakeError
from delta_log.log.catalog import Catalog, TopicDescription
from delta_log.log.reader import FetchResult, PartitionOffsets, TopicReader
from delta_log.log.writer import AppendRequest, AppendResult, CommitInfo, ProducerSequence, TopicWriter
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
