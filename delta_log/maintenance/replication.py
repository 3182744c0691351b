"""Replication: mirror topics, their configs and committed group offsets to another root.

Offsets are preserved: the replica of partition p holds the same records at the same offsets, and
its `hw-<p>` transaction is the source's high watermark as of the replicated snapshot, so after a
promote a server on the replica root assigns the next offsets exactly where the source stopped.

Incremental by offset, not by file: the replica's `hw-<p>` says how far p was copied; the next run
copies the source segments holding offsets at or above it. (Files are the wrong unit: the
source's roll-up and compaction rewrite files whose records were already copied.) A segment
entirely above the replica's high watermark is copied byte for byte; one straddling it (the
source merged it after a previous run) is read and only its newer records are written. Segments
the source's retention removed are removed from the replica too (a prefix, as at the source).

The replica root carries `_system/replica.json` (source root, last run, promoted or not). The
server refuses to serve a root that is an unpromoted replica, and replication refuses to write
into a root that is not a replica (so a primary is never overwritten), or one that was promoted.

Concurrency contract: one replication run per replica root at a time; a second concurrent run
fails its commit (both commit the same `hw-<p>` ids) and changes nothing. The source is only read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, PostCommitHookProperties
from deltalake.transaction import AddAction, RemoveAction

from conf import WriterSettings
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.core.replication_plan import PartitionCopy, plan_replication
from delta_log.errors import ReplicaStateError, SourcesGoneError, TopicNotFoundError
from delta_log.log.catalog import Catalog
from delta_log.system.offsets import DELETED, OffsetStore
from delta_log.table.app_transactions import high_watermark_transactions, read_high_watermarks
from delta_log.table.file_commit import commit_file_changes
from delta_log.table.segment_files import ParquetOptions, segment_stats, segments_of, write_segments
from delta_log.table.storage import SYSTEM_DIR, StorageRoot, translate_storage_errors

MARKER = "replica.json"


@dataclass(slots=True, kw_only=True)
class TopicReplication:
    topic: str
    records_copied: int = 0
    bytes_copied: int = 0
    files_copied: int = 0
    records_skipped: int = 0
    segments_removed: int = 0
    created: bool = False
    config_updated: bool = False
    high_watermarks: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ensure_topic(source: Catalog, replica: Catalog, topic: str, report: TopicReplication) -> int:
    desc = source.describe_topic(topic)
    try:
        have = replica.describe_topic(topic)
    except TopicNotFoundError:
        replica.create_topic(topic, partitions=desc.partitions, config=dict(desc.config.values))
        report.created = True
        return desc.partitions
    if dict(have.config.values) != dict(desc.config.values):
        replica.alter_config(topic, {k: v for k, v in desc.config.values.items() if have.config.values.get(k) != v})
        report.config_updated = True
    if have.partitions < desc.partitions:
        replica.add_partitions(topic, desc.partitions)
        report.config_updated = True
    return desc.partitions


def replicate_topic(
    source: StorageRoot, replica: StorageRoot, topic: str, settings: WriterSettings
) -> TopicReplication:
    """Bring the replica of `topic` up to the source's current snapshot. Raises: SourcesGoneError."""
    started = time.monotonic()
    report = TopicReplication(topic=topic)
    src_cat, rep_cat = Catalog(source, settings), Catalog(replica, settings)
    partitions = _ensure_topic(src_cat, rep_cat, topic, report)
    src_dt, rep_dt = src_cat.open_topic(topic), rep_cat.open_topic(topic)
    src_uri, rep_uri = source.topic_uri(topic), replica.topic_uri(topic)
    with translate_storage_errors():
        src_hw = read_high_watermarks(src_dt, partitions)  # same snapshot as the files: they hold offsets < hw
        src_segs = segments_of(src_dt)
        rep_hw = read_high_watermarks(rep_dt, partitions)
        rep_segs = segments_of(rep_dt)
    plans = plan_replication(partitions, src_segs, src_hw, rep_segs, rep_hw)
    src_fs, _ = source.filesystem()
    rep_fs, _ = replica.filesystem()
    adds: list[AddAction | RemoveAction] = []
    new_hws: dict[int, int] = {}
    for plan in plans:
        report.records_skipped += plan.skipped_records
        for seg in plan.copy_whole:  # one snapshot: its files hold exactly the offsets below its hw
            src_path = source.file_path(src_uri, seg.path)
            rel = f"partition={plan.partition}/{seg.path.rsplit('/', 1)[-1]}"
            dst = replica.file_path(rep_uri, rel)
            with translate_storage_errors():
                rep_fs.create_dir(dst.rsplit("/", 1)[0], recursive=True)
                pafs.copy_files(src_path, dst, source_filesystem=src_fs, destination_filesystem=rep_fs)
                cols = pq.read_table(dst, columns=["offset", "timestamp", "timestampType"], filesystem=rep_fs)
            size = rep_fs.get_file_info(dst).size
            stats = segment_stats(cols, first_offset=seg.first_offset)
            adds.append(AddAction(rel, size, {"partition": str(plan.partition)}, int(time.time() * 1000), True, stats))
            report.records_copied += cols.num_rows
            report.bytes_copied += size
            report.files_copied += 1
        for seg in plan.copy_tail:
            with translate_storage_errors():
                table = pq.read_table(source.file_path(src_uri, seg.path), filesystem=src_fs)
            table = table.filter(pc.greater_equal(table.column("offset"), plan.replica_hw))
            table = table.append_column("partition", pa.array([plan.partition] * table.num_rows, pa.int32()))
            table = table.select(TOPIC_SCHEMA.names).cast(TOPIC_SCHEMA).sort_by("offset")
            for written in write_segments(replica, rep_uri, table, ParquetOptions()):
                adds.append(written.action)
                report.records_copied += written.records
                report.bytes_copied += written.action.size
                report.files_copied += 1
        if plan.source_hw > plan.replica_hw:
            new_hws[plan.partition] = plan.source_hw
        report.high_watermarks[plan.partition] = max(plan.source_hw, plan.replica_hw)
    txns = high_watermark_transactions(new_hws)
    if adds or txns:
        with translate_storage_errors():
            rep_dt.create_write_transaction(
                adds,
                "append",
                TOPIC_SCHEMA,
                partition_by=["partition"],
                commit_properties=CommitProperties(
                    app_transactions=txns, custom_metadata={"topiclake.operation": "REPLICATE"}, max_commit_retries=0
                ),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False),
            )
    removes = [s for plan in plans for s in plan.remove]
    if removes:
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(s.path, True, now, s.size_bytes, {"partition": str(s.partition)}) for s in removes
        ]
        commit_file_changes(rep_dt, [s.path for s in removes], actions, operation="REPLICATE RETENTION", attempts=5)
        report.segments_removed = len(removes)
    report.seconds = time.monotonic() - started
    return report


def replicate_offsets(source: StorageRoot, replica: StorageRoot) -> int:
    """Copy committed group offsets (and deletes of them) that differ from the replica's. Returns
    how many were copied."""
    src, rep = OffsetStore(source), OffsetStore(replica)
    have = {c.key: c.offset for c in rep.all_committed(deleted=True)}
    changed = [c for c in src.all_committed(deleted=True) if have.get(c.key) != c.offset]
    live = [c for c in changed if c.offset != DELETED]
    if live:
        rep.commit(live)
    for group in sorted({c.group for c in changed if c.offset == DELETED}):
        rep.delete(group, [(c.topic, c.partition) for c in changed if c.group == group and c.offset == DELETED])
    return len(changed)


# -- the replica marker ---------------------------------------------------------------------------
def read_marker(storage: StorageRoot) -> dict[str, Any] | None:
    fs, base = storage.filesystem()
    path = f"{base}/{SYSTEM_DIR}/{MARKER}"
    with translate_storage_errors():
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as f:
            return dict(json.loads(f.read()))


def write_marker(storage: StorageRoot, marker: Mapping[str, Any]) -> None:
    fs, base = storage.filesystem()
    with translate_storage_errors():
        fs.create_dir(f"{base}/{SYSTEM_DIR}", recursive=True)
        tmp = f"{base}/{SYSTEM_DIR}/.{MARKER}.tmp"
        with fs.open_output_stream(tmp) as f:
            f.write(json.dumps(dict(marker), indent=2).encode())
        fs.move(tmp, f"{base}/{SYSTEM_DIR}/{MARKER}")


def refuse_unpromoted_replica(storage: StorageRoot) -> None:
    """A server must not write to a replica the replication job still owns. Raises: ReplicaStateError."""
    marker = read_marker(storage)
    if marker is not None and not marker.get("promoted"):
        raise ReplicaStateError(
            f"{storage.root} is a replica of {marker.get('source')}; serve the primary, or make this root "
            f"the primary with `topiclake replica promote --root {storage.root}`."
        )


def check_replica_target(source: StorageRoot, replica: StorageRoot, settings: WriterSettings) -> None:
    """Refuse to replicate into a primary or a promoted replica. Raises: ReplicaStateError."""
    if source.root == replica.root:
        raise ReplicaStateError("The replica root is the source root; give another folder or bucket.")
    marker = read_marker(replica)
    if marker is None:
        if Catalog(replica, settings).list_topics():
            raise ReplicaStateError(
                f"{replica.root} holds topics but is not a replica of {source.root}; "
                "replicate into an empty root (refusing to overwrite a primary)."
            )
        return
    if marker.get("promoted"):
        raise ReplicaStateError(
            f"{replica.root} was promoted to primary at {marker.get('promoted_at')}; "
            "replicate from it, or into a new empty root."
        )
    if marker.get("source") != source.root:
        raise ReplicaStateError(f"{replica.root} is a replica of {marker.get('source')}, not of {source.root}.")


def promote(replica: StorageRoot, settings: WriterSettings) -> dict[str, Any]:
    """Make a replica the primary: check every topic's offsets against its files, mark it promoted.

    Raises: ReplicaStateError (not a replica, already promoted, or a topic whose files hold offsets
    at or above its high watermark).
    """
    marker = read_marker(replica)
    if marker is None:
        raise ReplicaStateError(f"{replica.root} is not a replica (no _system/{MARKER}); nothing to promote.")
    if marker.get("promoted"):
        raise ReplicaStateError(f"{replica.root} was already promoted at {marker.get('promoted_at')}.")
    catalog = Catalog(replica, settings)
    topics: dict[str, dict[int, int]] = {}
    for topic in catalog.list_topics():
        dt = catalog.open_topic(topic)
        n = catalog.describe_topic(topic, dt).partitions
        hw = read_high_watermarks(dt, n)
        for p, segs in segments_of(dt).items():
            top = max((s.last_offset for s in segs), default=-1)
            if top >= hw.get(p, 0):
                raise ReplicaStateError(
                    f"Topic {topic!r} partition {p} holds offset {top} at or above its high watermark "
                    f"{hw.get(p, 0)}; run the replication job again before promoting."
                )
        topics[topic] = hw
    marker = {
        **marker,
        "promoted": True,
        "promoted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "high_watermarks": {t: {str(p): v for p, v in hw.items()} for t, hw in topics.items()},
    }
    write_marker(replica, marker)
    return marker


__all__ = [
    "PartitionCopy",
    "ReplicaStateError",
    "SourcesGoneError",
    "TopicReplication",
    "check_replica_target",
    "plan_replication",
    "promote",
    "read_marker",
    "refuse_unpromoted_replica",
    "replicate_offsets",
    "replicate_topic",
    "write_marker",
]
