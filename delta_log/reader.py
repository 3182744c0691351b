"""Topic reader: segment index, tail cache, fetch by offset, offsets for timestamps.

Concurrency contract
- Thread-safe: the index is an immutable snapshot swapped atomically under a lock; parquet reads
  need no lock. Many fetch threads may share one reader.
- The index is built from the Delta snapshot's add actions and their stats (min/max offset, max
  timestamp), so it sees every writer and every job rewrite (compaction, retention). It is
  refreshed when older than `refresh_interval_s`, when a fetch asks past what it knows, or on
  `refresh()`.
- The tail cache holds the most recent committed records per partition, contiguous by offset,
  fed by this process's writer (`on_commit`). A gap (another writer appended in between) clears it.
  Only committed data ever enters it.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from delta_log.errors import (
    InvalidOffsetError,
    OffsetOutOfRangeError,
    PartitionNotFoundError,
    StorageUnavailableError,
    TopicNotFoundError,
)
from delta_log.records import TOPIC_SCHEMA, record_sizes
from delta_log.segments import SegmentInfo, epoch_ms, segments_of
from delta_log.storage import StorageRoot
from delta_log.topic_config import TopicConfig
from delta_log.writer import CommitInfo, hw_app_id

MAX_FETCH_RECORDS = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionIndex:
    segments: tuple[SegmentInfo, ...]
    lasts: tuple[int, ...]  # last offsets, ascending, for bisect

    @classmethod
    def of(cls, segments: list[SegmentInfo]) -> PartitionIndex:
        segments.sort(key=lambda s: s.first_offset)
        return cls(segments=tuple(segments), lasts=tuple(s.last_offset for s in segments))

    def find(self, offset: int) -> int:
        """Index of the first segment whose last offset >= `offset` (len if none)."""
        return bisect.bisect_left(self.lasts, offset)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Snapshot:
    table_version: int
    config: TopicConfig
    partitions: dict[int, PartitionIndex]
    high_watermarks: dict[int, int]
    loaded_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionOffsets:
    partition: int
    log_start_offset: int
    high_watermark: int
    segments: int
    size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResult:
    records: pa.Table  # TOPIC_SCHEMA, ascending offsets
    next_offset: int
    high_watermark: int
    log_start_offset: int


@dataclass(slots=True)
class _Tail:
    first_offset: int = 0
    end_offset: int = 0  # exclusive
    tables: deque[tuple[int, pa.Table]] = field(default_factory=deque)
    nbytes: int = 0


class TopicReader:
    """Reads one topic's partitions by offset."""

    def __init__(
        self,
        storage: StorageRoot,
        topic: str,
        *,
        refresh_interval_s: float = 0.5,
        end_refresh_interval_s: float = 0.05,
        tail_cache_bytes: int = 32 * 1024 * 1024,
        footer_cache_entries: int = 4096,
    ) -> None:
        self.storage = storage
        self.topic = topic
        self.uri = storage.topic_uri(topic)
        self.refresh_interval_s = refresh_interval_s
        self.end_refresh_interval_s = end_refresh_interval_s
        self.tail_cache_bytes = tail_cache_bytes
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._tails: dict[int, _Tail] = {}
        self._footers: OrderedDict[str, pq.FileMetaData] = OrderedDict()
        self._footer_cache_entries = footer_cache_entries
        self._fs, _ = storage.filesystem()
        try:
            self._dt = storage.open_table(self.uri)
        except TableNotFoundError as exc:
            raise TopicNotFoundError(topic) from exc
        self._snap = self._build_snapshot()

    # -- index -------------------------------------------------------------------------------
    def _build_snapshot(self) -> _Snapshot:
        dt = self._dt
        try:
            by_partition = segments_of(dt, stats_fallback=self._stats_from_footer)
            props = dt.metadata().configuration
            version = dt.version()
        except TableNotFoundError as exc:
            raise TopicNotFoundError(self.topic) from exc
        except (DeltaError, OSError) as exc:
            raise StorageUnavailableError(f"Storage is unavailable: {exc}") from exc
        config = TopicConfig.from_properties(props)
        partitions = {p: PartitionIndex.of(segs) for p, segs in by_partition.items()}
        hws = {}
        for p in range(config.partitions):
            txn = dt.transaction_version(hw_app_id(p))
            hws[p] = int(txn) if txn is not None else 0
        return _Snapshot(
            table_version=version,
            config=config,
            partitions=partitions,
            high_watermarks=hws,
            loaded_at=time.monotonic(),
        )

    def _stats_from_footer(self, rel_path: str) -> tuple[int, int, int | None]:
        """(first offset, last offset, newest timestamp ms) from a file's parquet statistics."""
        meta = self._footer(rel_path)
        idx = meta.schema.to_arrow_schema().get_field_index("offset")
        ts_idx = meta.schema.to_arrow_schema().get_field_index("timestamp")
        lo, hi, ts = None, None, None
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(idx).statistics
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
            tst = meta.row_group(rg).column(ts_idx).statistics
            if tst is not None and tst.has_min_max:
                ts = tst.max if ts is None else max(ts, tst.max)
        return int(lo or 0), int(hi or -1), epoch_ms(ts)

    def refresh(self) -> int:
        """Load new Delta versions and rebuild the index if the table changed; return its version."""
        with self._lock:
            try:
                self._dt.update_incremental()
            except TableNotFoundError as exc:
                raise TopicNotFoundError(self.topic) from exc
            except (DeltaError, OSError):
                # An idle reader's version may predate the retained log (short log retention):
                # start again from the latest checkpoint.
                try:
                    self._dt = self.storage.open_table(self.uri)
                except TableNotFoundError as exc:
                    raise TopicNotFoundError(self.topic) from exc
                except (DeltaError, OSError) as exc:
                    raise StorageUnavailableError(f"Storage is unavailable: {exc}") from exc
            if self._dt.version() != self._snap.table_version:
                self._snap = self._build_snapshot()
            else:
                self._snap = _Snapshot(
                    table_version=self._snap.table_version,
                    config=self._snap.config,
                    partitions=self._snap.partitions,
                    high_watermarks=self._snap.high_watermarks,
                    loaded_at=time.monotonic(),
                )
            return self._snap.table_version

    def _fresh(self) -> _Snapshot:
        """The snapshot, refreshed when older than `refresh_interval_s` by ONE caller; the others go
        on with the current one (measured: under load every request thread queued on the lock to
        rebuild the index in turn)."""
        if time.monotonic() - self._snap.loaded_at > self.refresh_interval_s and self._refreshing.acquire(
            blocking=False
        ):
            try:
                self.refresh()
            finally:
                self._refreshing.release()
        return self._snap

    @property
    def config(self) -> TopicConfig:
        return self._fresh().config

    @property
    def table_version(self) -> int:
        return self._snap.table_version

    def _check_partition(self, snap: _Snapshot, partition: int) -> None:
        if not 0 <= partition < snap.config.partitions:
            snap = self._snapshot_after_refresh()
            if not 0 <= partition < snap.config.partitions:
                raise PartitionNotFoundError(self.topic, partition, snap.config.partitions)

    def _snapshot_after_refresh(self) -> _Snapshot:
        self.refresh()
        return self._snap

    # -- tail cache ----------------------------------------------------------------------------
    def on_commit(self, info: CommitInfo) -> None:
        """Feed the tail cache with records this process just committed."""
        parts = info.records.column("partition").to_numpy()
        if not len(parts):
            return
        starts = np.flatnonzero(np.concatenate([[True], parts[1:] != parts[:-1]]))
        ends = np.concatenate([starts[1:], [len(parts)]])
        with self._lock:
            for s, e in zip(starts, ends, strict=True):
                p = int(parts[s])
                piece = info.records.slice(int(s), int(e - s))
                base = int(piece.column("offset")[0].as_py())
                tail = self._tails.get(p)
                if tail is None or tail.end_offset != base:
                    tail = self._tails[p] = _Tail(first_offset=base, end_offset=base)
                tail.tables.append((base, piece))
                tail.end_offset = base + piece.num_rows
                tail.nbytes += piece.nbytes
                while tail.nbytes > self.tail_cache_bytes and len(tail.tables) > 1:
                    _, old = tail.tables.popleft()
                    tail.nbytes -= old.nbytes
                    tail.first_offset = tail.tables[0][0]

    def _tail_hw(self, partition: int) -> int:
        tail = self._tails.get(partition)
        return tail.end_offset if tail else 0

    # -- offsets -------------------------------------------------------------------------------
    def high_watermark(self, partition: int) -> int:
        snap = self._fresh()
        self._check_partition(snap, partition)
        return max(self._snap.high_watermarks.get(partition, 0), self._tail_hw(partition))

    def log_start_offset(self, partition: int) -> int:
        snap = self._fresh()
        self._check_partition(snap, partition)
        return self._lso(self._snap, partition)

    def _lso(self, snap: _Snapshot, partition: int) -> int:
        """First offset still stored. With no segment in the snapshot, everything below the
        snapshot's own high watermark is gone (retention); records the tail cache holds beyond it
        are newer than the snapshot, so they do not move the log start offset."""
        index = snap.partitions.get(partition)
        snap_hw = snap.high_watermarks.get(partition, 0)
        if index is None or not index.segments:
            return snap_hw
        return min(index.segments[0].first_offset, snap_hw)

    def partition_offsets(self) -> list[PartitionOffsets]:
        """Log start offset, high watermark, segment count and bytes for every partition."""
        snap = self._fresh()
        out = []
        for p in range(snap.config.partitions):
            index = snap.partitions.get(p)
            segs = index.segments if index else ()
            out.append(
                PartitionOffsets(
                    partition=p,
                    log_start_offset=self._lso(snap, p),
                    high_watermark=max(snap.high_watermarks.get(p, 0), self._tail_hw(p)),
                    segments=len(segs),
                    size_bytes=sum(s.size_bytes for s in segs),
                )
            )
        return out

    # -- fetch ---------------------------------------------------------------------------------
    def fetch(
        self, partition: int, offset: int, *, max_records: int = 500, max_bytes: int = 1024 * 1024
    ) -> FetchResult:
        """Records of `partition` from `offset`, at most `max_records` and about `max_bytes`.

        At least one record is returned when any is available, even if larger than max_bytes
        (as Kafka does). Compacted partitions may skip offsets; `next_offset` says where to go on.

        Raises:
            InvalidOffsetError: negative offset or limits out of range.
            PartitionNotFoundError: no such partition.
            OffsetOutOfRangeError: offset below the log start offset or above the high watermark.
        """
        if offset < 0:
            raise InvalidOffsetError(f"Offset must be >= 0; got {offset}.", offset=offset)
        if not 1 <= max_records <= MAX_FETCH_RECORDS:
            raise InvalidOffsetError(
                f"max_records must be between 1 and {MAX_FETCH_RECORDS}; got {max_records}.",
                max_records=max_records,
            )
        if max_bytes < 1:
            raise InvalidOffsetError(f"max_bytes must be >= 1; got {max_bytes}.", max_bytes=max_bytes)
        snap = self._fresh()
        self._check_partition(snap, partition)
        snap = self._snap
        hw = max(snap.high_watermarks.get(partition, 0), self._tail_hw(partition))
        lso = self._lso(snap, partition)
        at_end = offset == hw and time.monotonic() - snap.loaded_at > self.end_refresh_interval_s
        if offset > hw or offset < lso or at_end:
            # Past what we know, or at the end of a snapshot that may be stale: re-read the log.
            snap = self._snapshot_after_refresh()
            hw = max(snap.high_watermarks.get(partition, 0), self._tail_hw(partition))
            lso = self._lso(snap, partition)
            if offset > hw or offset < lso:
                raise OffsetOutOfRangeError(
                    topic=self.topic,
                    partition=partition,
                    offset=offset,
                    log_start_offset=lso,
                    high_watermark=hw,
                )
        pieces: list[pa.Table] = []
        cur, remaining, budget = offset, max_records, max_bytes
        refreshed = False
        while remaining > 0 and budget > 0 and cur < hw:
            piece = self._from_tail(partition, cur, remaining)
            if piece is None:
                index = snap.partitions.get(partition)
                pos = index.find(cur) if index else 0
                if index is None or pos >= len(index.segments):
                    if refreshed:
                        break
                    snap, refreshed = self._snapshot_after_refresh(), True
                    continue
                piece = self._read_segment(index.segments[pos], partition, cur, remaining)
                if piece.num_rows == 0:
                    cur = index.segments[pos].last_offset + 1
                    continue
            sizes = record_sizes(piece)
            fits = int(np.searchsorted(np.cumsum(sizes), budget, side="right"))
            if fits == 0 and not pieces:
                fits = 1
            if fits < piece.num_rows:
                piece = piece.slice(0, fits)
                pieces.append(piece)
                cur = int(piece.column("offset")[-1].as_py()) + 1 if fits else cur
                break
            pieces.append(piece)
            budget -= int(sizes.sum())
            remaining -= piece.num_rows
            cur = int(piece.column("offset")[-1].as_py()) + 1
        records = pa.concat_tables(pieces) if pieces else TOPIC_SCHEMA.empty_table()
        return FetchResult(records=records, next_offset=cur, high_watermark=hw, log_start_offset=lso)

    def _from_tail(self, partition: int, offset: int, limit: int) -> pa.Table | None:
        tail = self._tails.get(partition)
        if tail is None or not tail.first_offset <= offset < tail.end_offset:
            return None
        out: list[pa.Table] = []
        for base, table in list(tail.tables):
            end = base + table.num_rows
            if end <= offset:
                continue
            start = max(offset - base, 0)
            take = min(table.num_rows - start, limit)
            out.append(table.slice(start, take))
            limit -= take
            offset = base + start + take
            if limit <= 0:
                break
        return pa.concat_tables(out) if out else None

    def _footer(self, rel_path: str) -> pq.FileMetaData:
        meta = self._footers.get(rel_path)
        if meta is None:
            path = self.storage.file_path(self.uri, rel_path)
            try:
                meta = pq.read_metadata(path, filesystem=self._fs)
            except OSError as exc:
                raise StorageUnavailableError(f"Cannot read segment {rel_path}: {exc}") from exc
            self._footers[rel_path] = meta
            if len(self._footers) > self._footer_cache_entries:
                self._footers.popitem(last=False)
        return meta

    def _read_segment(self, seg: SegmentInfo, partition: int, offset: int, limit: int) -> pa.Table:
        """Rows of `seg` with offset >= `offset`, at most `limit`, reading only needed row groups."""
        meta = self._footer(seg.path)
        groups = _row_groups_for(meta, offset, limit)
        if not groups:
            return TOPIC_SCHEMA.empty_table()
        path = self.storage.file_path(self.uri, seg.path)
        try:
            with self._fs.open_input_file(path) as f:
                table = pq.ParquetFile(f, metadata=meta).read_row_groups(groups)
        except (OSError, FileNotFoundError) as exc:
            # A job removed the file after our snapshot: re-index and let the caller retry.
            self.refresh()
            raise StorageUnavailableError(
                f"Segment {seg.path} of {self.topic}-{partition} vanished; retry the fetch."
            ) from exc
        offsets = table.column("offset")
        if pc.min(offsets).as_py() < offset:
            table = table.filter(pc.greater_equal(offsets, offset))
        # Our writers and compaction keep files sorted by offset; other engines (a plain Spark
        # OPTIMIZE) may not, so check and sort rather than trust.
        offs = table.column("offset").to_numpy()
        if len(offs) > 1 and not (np.diff(offs) > 0).all():
            table = table.take(pa.array(np.argsort(offs, kind="stable")))
        table = table.slice(0, limit)
        n = table.num_rows
        return pa.table(
            {
                "key": table.column("key"),
                "value": table.column("value"),
                "topic": table.column("topic") if "topic" in table.column_names else pa.array([self.topic] * n),
                "partition": pa.array(np.full(n, partition, dtype=np.int32)),
                "offset": table.column("offset"),
                "timestamp": table.column("timestamp").cast(TOPIC_SCHEMA.field("timestamp").type),
                "timestampType": table.column("timestampType"),
                "headers": table.column("headers"),
            },
            schema=TOPIC_SCHEMA,
        )

    def offset_for_timestamp(self, partition: int, timestamp_ms: int) -> int | None:
        """First offset whose timestamp >= `timestamp_ms`, or None if every record is older.

        Raises: PartitionNotFoundError.
        """
        snap = self._snapshot_after_refresh()
        self._check_partition(snap, partition)
        target_us = timestamp_ms * 1000
        index = snap.partitions.get(partition)
        if index is None:
            return None
        for seg in index.segments:
            if seg.max_timestamp_ms < timestamp_ms:  # stats are ms, floored: never skips a match
                continue
            table = self._read_segment(seg, partition, seg.first_offset, seg.records or MAX_FETCH_RECORDS)
            ts = table.column("timestamp").cast(pa.int64()).to_numpy()
            hits = np.flatnonzero(ts >= target_us)
            if len(hits):
                return int(table.column("offset")[int(hits[0])].as_py())
        return None

    @property
    def table(self) -> DeltaTable:
        return self._dt


def _row_groups_for(meta: pq.FileMetaData, offset: int, limit: int) -> list[int]:
    """Row groups that can hold offsets >= `offset`, enough for `limit` rows if the file is sorted.

    When row groups are not in ascending, disjoint offset order, every group with offsets >= `offset`
    is returned (correct for any file layout, only slower).
    """
    col = meta.schema.to_arrow_schema().get_field_index("offset")
    stats = []
    for rg in range(meta.num_row_groups):
        st = meta.row_group(rg).column(col).statistics
        if st is None or not st.has_min_max:
            return list(range(meta.num_row_groups))
        stats.append((int(st.min), int(st.max), meta.row_group(rg).num_rows))
    ordered = all(stats[i][0] > stats[i - 1][1] for i in range(1, len(stats)))
    groups, rows = [], 0
    for rg, (lo, hi, n) in enumerate(stats):
        if hi < offset:
            continue
        groups.append(rg)
        rows += n - max(0, offset - lo)
        if ordered and rows >= limit:
            break
    return groups
