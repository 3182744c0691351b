"""Kafka's DeleteRecords: move a partition's log start offset up to a given offset.

The segments wholly below it are removed (dataChange=true, as retention does); the segment that
straddles it is rewritten with only its records at or above it (offsets and everything else
unchanged). One commit through `file_commit`, beside live writers: appends are never refused by it
and it never removes a file twice (a concurrent roll-up or retention makes it plan again). Readers
see the new log start offset once they refresh; files are deleted by vacuum later.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from delta_log.core.records import TOPIC_SCHEMA
from delta_log.core.retention_plan import plan_delete_records
from delta_log.core.topic_config import TopicConfig
from delta_log.errors import PartitionNotFoundError, SourcesGoneError, StorageUnavailableError
from delta_log.table.app_transactions import read_high_watermark
from delta_log.table.file_commit import commit_file_changes
from delta_log.table.segment_files import ParquetOptions, codec_of, remove_files, segments_of, write_segments
from delta_log.table.storage import StorageRoot

#: plans made again when a concurrent roll-up or retention removed a planned file first
_REPLANS = 5


def delete_records(
    storage: StorageRoot, topic: str, partition: int, offset: int, *, parquet: ParquetOptions, attempts: int
) -> int:
    """Delete `partition`'s records below `offset` (-1: the high watermark); the new log start offset.

    Raises: TopicNotFoundError, PartitionNotFoundError, InvalidOffsetError, StorageUnavailableError.
    """
    uri = storage.topic_uri(topic)
    for _ in range(_REPLANS):
        dt = storage.open_topic(topic)
        partitions = TopicConfig.from_properties(dt.metadata().configuration).partitions
        if not 0 <= partition < partitions:
            raise PartitionNotFoundError(topic, partition, partitions)
        plan = plan_delete_records(
            segments_of(dt).get(partition, []), offset=offset, high_watermark=read_high_watermark(dt, partition)
        )
        if not plan.remove and plan.straddling is None:
            return plan.log_start_offset
        now_ms = int(time.time() * 1000)
        doomed = [*plan.remove, *([plan.straddling] if plan.straddling else [])]
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(s.path, True, now_ms, s.size_bytes, {"partition": str(partition)}) for s in doomed
        ]
        written = []
        if plan.straddling is not None:
            fs, _ = storage.filesystem()
            with fs.open_input_file(storage.file_path(uri, plan.straddling.path)) as f:
                kept = pq.ParquetFile(f).read()
            codecs = {partition: codec_of([kept])}
            kept = kept.filter(pc.greater_equal(kept.column("offset"), plan.log_start_offset))
            kept = kept.append_column("partition", pa.array([partition] * kept.num_rows, pa.int32()))
            rewritten = kept.select(TOPIC_SCHEMA.names).cast(TOPIC_SCHEMA)
            # the segment starts at the new log start offset, even where compaction left a gap after it
            for w in write_segments(
                storage, uri, rewritten, parquet, first_offset=plan.log_start_offset, codecs=codecs
            ):
                written.append(w.relative_path)
                actions.append(w.action)
        try:
            commit_file_changes(dt, [s.path for s in doomed], actions, operation="delete-records", attempts=attempts)
        except SourcesGoneError:
            remove_files(storage, uri, written)
            continue
        except BaseException:
            remove_files(storage, uri, written)
            raise
        return plan.log_start_offset
    raise StorageUnavailableError(f"DeleteRecords on {topic}-{partition} kept losing to concurrent maintenance; retry.")
