"""Topic reader: fetch by offset, offsets for timestamps, offset resolution, over the segment index.

Concurrency contract
- Thread-safe: the index (delta_log.log.index.TopicSnapshot) is immutable and swapped atomically
  under a lock; parquet reads need no lock. Many fetch threads may share one reader.
- The index is refreshed when older than `refresh_interval_s` (by ONE caller; the others go on
  with the current one), when a fetch asks past what it knows, or on `refresh()`.
- The tail cache (delta_log.log.tail_cache) is fed by this process's writer (`on_commit`) with
  committed records only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from conf import ReaderSettings
from delta_log.core.records import CODEC_KEY, TIMESTAMP_TYPE, TOPIC_SCHEMA, check_offset, record_sizes
from delta_log.core.segments import SegmentInfo
from delta_log.core.topic_config import TopicConfig
from delta_log.errors import (
    InvalidOffsetError,
    OffsetOutOfRangeError,
    PartitionNotFoundError,
    PartitionRecoveringError,
    StorageUnavailableError,
    TopicNotFoundError,
)
from delta_log.log.index import FooterCache, TopicSnapshot, build_snapshot, follow_entries, row_groups_for
from delta_log.log.read_ahead import ReadAhead
from delta_log.log.tail_cache import TailCache
from delta_log.log.writer import CommitInfo
from delta_log.table.app_transactions import MAX_INCREMENTAL_VERSIONS
from delta_log.table.log_entries import entries_from, local_log_dir, plain_protocol, version_path
from delta_log.table.storage import StorageRoot

#: segment files a reader of its own keeps open (OpenFiles); a server's readers share the registry's
OPEN_FILES = 32

#: Where an offset lookup or reset points (see TopicReader.resolve_offsets).
OffsetSpec = Literal["earliest", "latest", "timestamp", "offset"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionOffsets:
    partition: int
    log_start_offset: int
    high_watermark: int
    segments: int
    size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResult:
    records: pa.Table  # TOPIC_SCHEMA, ascending offsets; empty when `encoded` holds them instead
    next_offset: int
    high_watermark: int
    log_start_offset: int
    #: the records in the wire form of the `Encoder` the fetch was asked with (the Kafka face: record
    #: batches), made by the read itself; None when no encoder was given
    encoded: bytes | None = None
    #: the records `encoded` holds, and their bytes (key + value + headers, as `record_sizes` counts)
    encoded_count: int = 0
    encoded_size: int = 0

    @property
    def count(self) -> int:
        """Records returned, in whichever form."""
        return self.encoded_count if self.encoded is not None else self.records.num_rows

    def held_bytes(self) -> int:
        """The memory this result keeps: its records' buffers (slices keep their whole row groups)
        or their wire form."""
        return self.records.get_total_buffer_size() + len(self.encoded or b"")


@dataclass(frozen=True, slots=True)
class Encoded:
    """Stored records read straight into a door's wire form: how many, the last one's offset,
    their bytes (key + value + headers, as `record_sizes` counts them), and whether the read
    stopped because the next record did not fit the byte budget."""

    data: bytes
    count: int
    last_offset: int
    size: int
    full: bool


class Encoder(Protocol):
    """A door's wire form of fetched records (the Kafka face: record batches), made by the read
    itself, on the read-ahead's thread when it reads ahead. Fetches asked with one encoder are
    read ahead for it alone (it is part of the read-ahead's key: keep one instance per form).

    - `table`: records the reader holds as Arrow (the tail cache, a decoded row group).
    - `stored`: straight from row groups of a local segment file, skipping the Arrow table:
      records with offset >= `start`, within `max_records` and `max_bytes` by their sizes (the
      first one even when larger if `take_one`); `skip_rows` rows of the first group lie before
      `start`; `batch_rows` is about the rows the limits take. A str back says why it cannot (a
      layout it does not know); the reader then decodes the file and calls `table`.
      Raises: OSError (the file cannot be opened: the reader then reads it the general way).
    """

    def table(self, records: pa.Table) -> bytes: ...

    def stored(
        self,
        path: str,
        row_groups: list[int],
        *,
        skip_rows: int,
        start: int,
        max_records: int,
        max_bytes: int,
        take_one: bool,
        batch_rows: int,
    ) -> Encoded | str: ...


@dataclass(frozen=True, slots=True)
class RowGroup:
    """One decoded row group as fetches use it: TOPIC_SCHEMA rows, its offsets and record sizes
    (key + value + headers), made once when it is decoded instead of at every fetch inside it."""

    table: pa.Table
    offsets: np.ndarray
    sizes: np.ndarray
    ascending: bool  # offsets strictly ascend (ours always do; another engine's rewrite may not)
    nbytes: int

    @classmethod
    def of(cls, table: pa.Table) -> RowGroup:
        offsets = table.column("offset").to_numpy()
        return cls(
            table=table,
            offsets=offsets,
            sizes=record_sizes(table),
            ascending=bool(len(offsets) < 2 or (np.diff(offsets) > 0).all()),
            nbytes=table.nbytes + offsets.nbytes * 2,
        )


class RowGroupCache:
    """Decoded row groups, each on its own (a fetch spanning groups 3-4 and the next one 4-5 share
    group 4), least recently used first out, within a byte budget. A consumer's fetch usually starts
    inside the row group its last fetch ended in; without this, each fetch would decode that row
    group again (measured with 1 MB fetches over ~0.9 MB groups: groups cached as one key per
    fetch's set were decoded twice, 4.75 ms per fetch's read). Thread-safe; groups are immutable,
    so they are shared."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._groups: OrderedDict[tuple[str, int], RowGroup] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> RowGroup | None:
        with self._lock:
            group = self._groups.get(key)
            if group is not None:
                self._groups.move_to_end(key)
            return group

    def put(self, key: tuple[str, int], group: RowGroup) -> None:
        if group.nbytes > self.max_bytes:
            return
        with self._lock:
            if key in self._groups:
                return
            self._groups[key] = group
            self._bytes += group.nbytes
            while self._bytes > self.max_bytes:
                _, old = self._groups.popitem(last=False)
                self._bytes -= old.nbytes


class OpenFiles:
    """Segment files kept open for reading, least recently used first out: one set per process,
    whatever topic they belong to (so the file descriptors held are `entries`, not a number per
    topic). Opening one costs more than decoding its row group (measured, 0.55 MB row groups: 1.17
    ms per MB opening the file and its `ParquetFile` for each group, 0.53 kept open); a consumer
    reads a file's groups one fetch after another. Local files are memory-mapped. A file deleted
    while open stays readable (its inode lives on) until it leaves the set. Thread-safe: one reader
    of a file at a time."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._lock = threading.Lock()
        self._open: OrderedDict[str, tuple[pq.ParquetFile, threading.Lock]] = OrderedDict()

    @contextlib.contextmanager
    def open(self, path: str, meta: pq.FileMetaData, fs: pafs.FileSystem | None) -> Iterator[pq.ParquetFile]:
        """The file at `path` (memory-mapped when `fs` is None: local disk).
        Raises: OSError (the file is gone, or unreadable)."""
        with self._lock:
            entry = self._open.get(path)
            if entry is not None:
                self._open.move_to_end(path)
        if entry is None:
            if fs is None:
                pf = pq.ParquetFile(path, metadata=meta, memory_map=True)
            else:
                pf = pq.ParquetFile(fs.open_input_file(path), metadata=meta)
            with self._lock:
                entry = self._open.setdefault(path, (pf, threading.Lock()))
                while len(self._open) > self._entries:
                    self._open.popitem(last=False)  # closed when its last reader lets go
        with entry[1]:
            yield entry[0]


@dataclass(frozen=True, slots=True)
class FollowedLog:
    """A reader's index as of one version of a table whose log it follows (local disk, a plain
    protocol): the version, its `_delta_log` folder and every live segment by partition."""

    version: int
    log_dir: str
    segments: dict[int, tuple[SegmentInfo, ...]]


class TopicReader:
    """Reads one topic's partitions by offset."""

    def __init__(
        self,
        storage: StorageRoot,
        topic: str,
        settings: ReaderSettings | None = None,
        *,
        read_ahead: ReadAhead[FetchResult] | None = None,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.storage = storage
        self._ahead = read_ahead
        self.topic = topic
        self.settings = settings or ReaderSettings()
        self.uri = storage.topic_uri(topic)
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._tail = TailCache(self.settings.tail_cache_bytes)
        self._fs, _ = storage.filesystem()
        self._footers = FooterCache(
            self._fs, lambda rel: storage.file_path(self.uri, rel), self.settings.footer_cache_entries
        )
        self._row_groups = RowGroupCache(self.settings.row_group_cache_bytes)
        self._files = open_files or OpenFiles(OPEN_FILES)
        self._local_log = local_log_dir(self.uri) if storage.is_local else None
        self._dt = storage.open_topic(topic)
        self._dt_file = self._version_file(self._dt.version())
        self._snap = self._build()
        self._snap_file = self._version_file(self._snap.table_version)
        self._full_at = time.monotonic()
        self._log_dir = self._followable_log()
        #: partitions whose acked records are not all here yet (a dead gateway's write-ahead log
        #: holds some until its lease ends): every answer built on their high watermark refuses
        self._recovering: frozenset[int] = frozenset()

    # -- index -------------------------------------------------------------------------------
    def _build(self, previous: TopicSnapshot | None = None) -> TopicSnapshot:
        return build_snapshot(
            self._dt,
            topic=self.topic,
            stats_fallback=self._footers.stats,
            now=time.monotonic(),
            previous=previous,
            log_entries=lambda versions: self.storage.read_log_entries(self.uri, versions),
        )

    def refresh(self) -> int:
        """Load new Delta versions and rebuild the index if the table changed; return its version.

        On local disk the new versions' commit entries are applied to the index (`follow_entries`),
        and the table object is read again only when they ask for it (a metaData or protocol
        change), every `full_refresh_interval_s`, or when the table's protocol is not a plain one."""
        with self._lock:
            snap = self._follow_log()
            if snap is not None:
                if snap.table_version != self._snap.table_version:
                    self._snap_file = self._version_file(snap.table_version)
                self._snap = snap
                return snap.table_version
            self._full_at = time.monotonic()
            same_table = self._catch_up_table() and self._snap_file == self._version_file(self._snap.table_version)
            self._log_dir = self._followable_log()
            if not same_table:
                self._snap = self._build()  # nothing of the old table's index carries over
            elif self._dt.version() != self._snap.table_version:
                self._snap = self._build(previous=self._snap)
            else:
                self._snap = dataclasses.replace(self._snap, loaded_at=time.monotonic())
            self._snap_file = self._version_file(self._snap.table_version)
            return self._snap.table_version

    def followed_log(self) -> FollowedLog | None:
        """The index refreshed now, when the reader follows the table's log (None: it reads the
        table object instead: an object store, or not a plain protocol). For one caller that
        plans file changes on it (the roll-up), which owns this reader."""
        self.refresh()
        snap, log_dir = self._snap, self._log_dir
        if log_dir is None:
            return None
        return FollowedLog(
            version=snap.table_version,
            log_dir=log_dir,
            segments={p: ix.segments for p, ix in snap.partitions.items() if ix.segments},
        )

    def _catch_up_table(self) -> bool:
        """Bring the table object to the latest version; False when it had to be opened again
        because the table is another one now (or its version left the log). Under `_lock`.
        Raises: TopicNotFoundError."""
        try:
            if self._dt_file is not None and self._version_file(self._dt.version()) != self._dt_file:
                # Deleted and made again (by another gateway): the new log starts over, and
                # delta-rs would apply its versions past ours on top of the old table's state.
                self._dt = self.storage.open_topic(self.topic)
                self._dt_file = self._version_file(self._dt.version())
                return False
            self._dt.update_incremental()
        except TableNotFoundError as exc:
            raise TopicNotFoundError(self.topic) from exc
        except (DeltaError, OSError):
            # An idle reader's version may predate the retained log (short log retention):
            # start again from the latest checkpoint.
            self._dt = self.storage.open_topic(self.topic)
        self._dt_file = self._version_file(self._dt.version())
        return True

    def _version_file(self, version: int) -> tuple[int, int, int] | None:
        """Which file holds commit `version` on local disk (inode, size, modification time); None:
        no such file, or an object store. A topic deleted and created again starts its log over, so
        a version the reader holds may then be another table's: the reader compares this before it
        reads on from that version."""
        if self._local_log is None:
            return None
        try:
            st = os.stat(version_path(self._local_log, version))
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _followable_log(self) -> str | None:
        """The table's `_delta_log` folder when refreshes can follow its commit entries (local disk,
        a plain protocol); None: they read the table object."""
        return self._local_log if self._local_log is not None and plain_protocol(self._dt) else None

    def _follow_log(self) -> TopicSnapshot | None:
        """The index moved to the latest version by the commit entries since it (None: read the
        table instead). Under `_lock`."""
        snap = self._snap
        if self._log_dir is None or time.monotonic() - self._full_at > self.settings.full_refresh_interval_s:
            return None
        if self._snap_file is None or self._version_file(snap.table_version) != self._snap_file:
            return None  # our version left the log (cleaned up), or the table was made again
        try:
            entries = entries_from(self._log_dir, snap.table_version + 1, limit=MAX_INCREMENTAL_VERSIONS + 1)
        except (OSError, UnicodeDecodeError):
            return None
        if len(entries) > MAX_INCREMENTAL_VERSIONS:
            # far behind: the table object catches up at once (an index part of the way would tell
            # fetches a stale high watermark: OFFSET_OUT_OF_RANGE for offsets that exist)
            return None
        if not entries:
            return dataclasses.replace(snap, loaded_at=time.monotonic())
        return follow_entries(snap, entries, stats_fallback=self._footers.stats, now=time.monotonic())

    def _fresh(self) -> TopicSnapshot:
        """The snapshot, refreshed when older than `refresh_interval_s` by ONE caller; the others go
        on with the current one (measured: under load every request thread queued on the lock to
        rebuild the index in turn)."""
        if time.monotonic() - self._snap.loaded_at > self.settings.refresh_interval_s and self._refreshing.acquire(
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
    def topic_id(self) -> uuid.UUID:
        """Kafka's topic id: the topic table's Delta id (one per creation of the name)."""
        return uuid.UUID(self._snap.table_id)

    def recent_config(self, max_age_s: float) -> TopicConfig | None:
        """The config as of the current snapshot if it was loaded within `max_age_s`, without
        reading the table (None: older; read `config`). For the event loop's hot paths."""
        snap = self._snap
        return snap.config if time.monotonic() - snap.loaded_at <= max_age_s else None

    @property
    def table_version(self) -> int:
        return self._snap.table_version

    @property
    def table(self) -> DeltaTable:
        """The table object, as of at least the index's version (refreshes that follow the log
        leave it behind)."""
        with self._lock:
            if self._dt.version() < self._snap.table_version:
                self._catch_up_table()
            return self._dt

    def _check_partition(self, snap: TopicSnapshot, partition: int) -> TopicSnapshot:
        if not 0 <= partition < snap.config.partitions:
            snap = self._snapshot_after_refresh()
            if not 0 <= partition < snap.config.partitions:
                raise PartitionNotFoundError(self.topic, partition, snap.config.partitions)
        return snap

    def _snapshot_after_refresh(self) -> TopicSnapshot:
        self.refresh()
        return self._snap

    def on_commit(self, info: CommitInfo) -> None:
        """Feed the tail cache with records this process just committed (of a `log` topic: acked
        in the write-ahead log)."""
        self._tail.add(info.records, info.codecs)

    def hold_tail(self) -> None:
        """A `log` topic: keep acked records in the tail until `flushed` (fetches see them at once)."""
        self._tail.hold()

    def flushed(self, high_watermarks: dict[int, int]) -> None:
        self._tail.flushed(high_watermarks)

    def set_recovering(self, partitions: frozenset[int]) -> None:
        """The partitions whose acked records are still being recovered into the table."""
        self._recovering = partitions

    # -- offsets -------------------------------------------------------------------------------
    def _hw(self, snap: TopicSnapshot, partition: int) -> int:
        """The partition's high watermark: what the table holds, or this process acked beyond it.
        The one place every fetch, offset lookup and lag figure reads it, so none is answered from
        a partition still recovering (it would be below an acked offset).

        Raises: PartitionRecoveringError."""
        if partition in self._recovering:
            raise PartitionRecoveringError(
                f"Partition {partition} of topic {self.topic!r} is recovering records a gateway acked before it died.",
                topic=self.topic,
                partition=partition,
            )
        return max(snap.high_watermark(partition), self._tail.end_offset(partition))

    def high_watermark(self, partition: int) -> int:
        """Raises: PartitionNotFoundError."""
        snap = self._check_partition(self._fresh(), partition)
        return self._hw(snap, partition)

    def log_start_offset(self, partition: int) -> int:
        """Raises: PartitionNotFoundError."""
        snap = self._check_partition(self._fresh(), partition)
        return snap.log_start_offset(partition)

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
                    log_start_offset=snap.log_start_offset(p),
                    high_watermark=self._hw(snap, p),
                    segments=len(segs),
                    size_bytes=sum(s.size_bytes for s in segs),
                )
            )
        return out

    def resolve_offsets(
        self,
        to: OffsetSpec,
        *,
        timestamp: int | None = None,
        offset: int | None = None,
        partitions: list[int] | None = None,
    ) -> dict[int, int]:
        """Per partition (default: all), where `to` points, as Kafka's ListOffsets and offset resets:
        "earliest" (the log start offset), "latest" (the high watermark), "timestamp" (the first
        offset at or after `timestamp` epoch ms, else the high watermark) or "offset" (`offset`
        itself, which must lie within [log start offset, high watermark]).

        Raises: PartitionNotFoundError, InvalidOffsetError.
        """
        if to == "timestamp" and timestamp is None:
            raise InvalidOffsetError("to=timestamp needs a timestamp (epoch ms).")
        if to == "offset" and offset is None:
            raise InvalidOffsetError("to=offset needs an offset.")
        snap = self._fresh()
        wanted = list(range(snap.config.partitions)) if partitions is None else partitions
        out: dict[int, int] = {}
        for p in wanted:
            snap = self._check_partition(snap, p)
            lso, hw = snap.log_start_offset(p), self._hw(snap, p)
            if to == "earliest":
                out[p] = lso
            elif to == "latest":
                out[p] = hw
            elif to == "timestamp":
                assert timestamp is not None
                found = self.offset_for_timestamp(p, timestamp)
                out[p] = hw if found is None else found
            else:
                assert offset is not None
                if not lso <= offset <= hw:
                    raise InvalidOffsetError(
                        f"Offset {offset} is outside [{lso}, {hw}] for partition {p}; pick one within it.",
                        partition=p,
                    )
                out[p] = offset
        return out

    # -- fetch ---------------------------------------------------------------------------------
    def fetch(
        self,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1024 * 1024,
        encoder: Encoder | None = None,
    ) -> FetchResult:
        """Records of `partition` from `offset`, at most `max_records` and `max_bytes` (capped by the
        reader's `max_fetch_bytes`), ending at a record boundary.

        At least one record is returned when any is available, even if larger than max_bytes
        (as Kafka does). Compacted partitions may skip offsets; `next_offset` says where to go on.

        With an `encoder`, the result holds the records in its wire form (`encoded`), read from
        local segment files straight into it where the encoder can. With a read-ahead
        (delta_log.log.read_ahead), a fetch from the stored segments starts reading the one that
        follows it (same limits, same encoder).

        Raises:
            InvalidOffsetError: negative offset or limits out of range.
            PartitionNotFoundError: no such partition.
            OffsetOutOfRangeError: offset below the log start offset or above the high watermark.
        """
        check_offset(offset)
        if not 1 <= max_records <= self.settings.max_fetch_records:
            raise InvalidOffsetError(
                f"max_records must be between 1 and {self.settings.max_fetch_records}; got {max_records}.",
                max_records=max_records,
            )
        if max_bytes < 1:
            raise InvalidOffsetError(f"max_bytes must be >= 1; got {max_bytes}.", max_bytes=max_bytes)
        max_bytes = min(max_bytes, self.settings.max_fetch_bytes)  # Kafka's fetch.max.bytes: a cap, not an error
        ahead = self._read_ahead_result(partition, offset, max_records, max_bytes, encoder, ready_only=False)
        if ahead is not None:
            return ahead
        result, stored = self._fetch(partition, offset, max_records, max_bytes, encoder)
        if stored:
            self._read_on(partition, result, max_records, max_bytes, encoder)
        return result

    def _fetch(
        self, partition: int, offset: int, max_records: int, max_bytes: int, encoder: Encoder | None = None
    ) -> tuple[FetchResult, bool]:
        """`fetch` with checked limits; and whether any record came from the stored segments (not
        the tail cache)."""
        snap = self._check_partition(self._fresh(), partition)
        hw = self._hw(snap, partition)
        lso = snap.log_start_offset(partition)
        at_end = offset == hw and time.monotonic() - snap.loaded_at > self.settings.end_refresh_interval_s
        if offset > hw or offset < lso or at_end:
            # Past what we know, or at the end of a snapshot that may be stale: re-read the log.
            snap = self._snapshot_after_refresh()
            hw = self._hw(snap, partition)
            lso = snap.log_start_offset(partition)
            if offset > hw or offset < lso:
                raise OffsetOutOfRangeError(
                    topic=self.topic,
                    partition=partition,
                    offset=offset,
                    log_start_offset=lso,
                    high_watermark=hw,
                )
        pieces: list[pa.Table | Encoded] = []
        cur, remaining, budget = offset, max_records, max_bytes
        taken = 0  # the record bytes of the pieces
        refreshed = stored = False
        while remaining > 0 and budget > 0 and cur < hw:
            piece = self._tail.read(partition, cur, remaining)
            if piece is None:
                stored = True
                index = snap.partitions.get(partition)
                pos = index.find(cur) if index else 0
                if index is None or pos >= len(index.segments):
                    if refreshed:
                        break
                    snap, refreshed = self._snapshot_after_refresh(), True
                    continue
                seg = index.segments[pos]
                # at most the rows the byte budget allows by the segment's average stored (compressed)
                # record size, not the `max_records` it may also allow; the row groups read stop at
                # the budget by their uncompressed size
                per_row = max(1, seg.size_bytes // max(seg.records, 1))
                rows = min(remaining, budget // per_row + 1) if seg.records else remaining
                encoded = None
                if encoder is not None and self.storage.is_local:
                    encoded = self._encode_segment(encoder, seg, cur, rows, remaining, budget, take_one=not pieces)
                if encoded is not None:
                    if encoded.full and not encoded.count:
                        break  # the budget is spent
                    if not encoded.count:
                        cur = seg.last_offset + 1
                        continue
                    pieces.append(encoded)
                    taken += encoded.size
                    budget -= encoded.size
                    remaining -= encoded.count
                    cur = encoded.last_offset + 1
                    if encoded.full:
                        break
                    continue
                piece, sizes = self._read_segment(seg, partition, cur, rows, budget)
                if piece.num_rows == 0:
                    cur = index.segments[pos].last_offset + 1
                    continue
            else:
                sizes = record_sizes(piece)
            fits = int(np.searchsorted(np.cumsum(sizes), budget, side="right"))
            if fits == 0 and not pieces:
                fits = 1
            if fits < piece.num_rows:
                piece = piece.slice(0, fits)
                pieces.append(piece)
                taken += int(sizes[:fits].sum())
                cur = int(piece.column("offset")[-1].as_py()) + 1 if fits else cur
                break
            pieces.append(piece)
            used = int(sizes.sum())
            taken += used
            budget -= used
            remaining -= piece.num_rows
            cur = int(piece.column("offset")[-1].as_py()) + 1
        if encoder is None:
            tables = [p for p in pieces if isinstance(p, pa.Table)]  # every one (no encoder, no Encoded)
            records = pa.concat_tables(tables) if tables else TOPIC_SCHEMA.empty_table()
            return FetchResult(records=records, next_offset=cur, high_watermark=hw, log_start_offset=lso), stored
        wire = [p.data if isinstance(p, Encoded) else encoder.table(p) if p.num_rows else b"" for p in pieces]
        return FetchResult(
            records=TOPIC_SCHEMA.empty_table(),
            encoded=b"".join(wire),
            encoded_count=sum(p.count if isinstance(p, Encoded) else p.num_rows for p in pieces),
            encoded_size=taken,
            next_offset=cur,
            high_watermark=hw,
            log_start_offset=lso,
        ), stored

    def _encode_segment(
        self,
        encoder: Encoder,
        seg: SegmentInfo,
        offset: int,
        rows: int,
        max_records: int,
        budget: int,
        *,
        take_one: bool,
    ) -> Encoded | None:
        """`seg`'s records from `offset` in the encoder's wire form, straight from the local file;
        None when the encoder cannot (the file's layout, groups whose offset ranges are not known
        to ascend from one to the next, or it cannot be opened: the general read then decodes it
        and sorts it, or meets the error and says what it is)."""
        _, described = self._footers.row_groups(seg.path)
        if not (described.lows and described.ordered):
            return None  # groups that overlap or lack statistics: the general read sorts what it reads
        wanted = row_groups_for(described, offset, rows, budget)
        if not wanted:
            return Encoded(data=b"", count=0, last_offset=offset - 1, size=0, full=False)
        skip = 0
        first = wanted[0]
        if described.highs[first] - described.lows[first] + 1 == described.rows[first]:
            skip = max(0, offset - described.lows[first])  # a dense group: row i holds offset low + i
        try:
            got = encoder.stored(
                self.storage.file_path(self.uri, seg.path),
                wanted,
                skip_rows=skip,
                start=offset,
                max_records=max_records,
                max_bytes=budget,
                take_one=take_one,
                batch_rows=rows,
            )
        except OSError:
            return None
        return got if isinstance(got, Encoded) else None

    def _read_on(
        self, partition: int, result: FetchResult, max_records: int, max_bytes: int, encoder: Encoder | None
    ) -> None:
        """Hand the fetch that follows `result` (same limits, same encoder) to the read-ahead, when
        stored records follow it."""
        nxt = result.next_offset
        if self._ahead is None or nxt >= result.high_watermark or not result.count:
            return
        if self._tail.read(partition, nxt, 1) is not None:
            return  # in memory already

        def read() -> FetchResult:
            return self._fetch(partition, nxt, max_records, max_bytes, encoder)[0]

        self._ahead.offer((self, partition, nxt, max_records, max_bytes, encoder), max_bytes, read)

    def _read_ahead_result(
        self,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        encoder: Encoder | None,
        *,
        ready_only: bool,
    ) -> FetchResult | None:
        """The fetch read ahead for exactly these arguments, with the high watermark and log start
        offset known now (None: none; or retention passed its records meanwhile, and the usual
        path answers OFFSET_OUT_OF_RANGE); the one after it is handed on."""
        if self._ahead is None:
            return None
        got = self._ahead.take((self, partition, offset, max_records, max_bytes, encoder), ready_only=ready_only)
        if got is None:
            return None
        snap = self._snap
        lso = snap.log_start_offset(partition)
        if offset < lso:
            return None
        hw = max(got.high_watermark, self._hw(snap, partition))
        result = dataclasses.replace(got, high_watermark=hw, log_start_offset=lso)
        self._read_on(partition, result, max_records, max_bytes, encoder)
        return result

    def fetch_cached(
        self,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1024 * 1024,
        encoder: Encoder | None = None,
    ) -> FetchResult | None:
        """The fetch answered from memory alone (records this process committed recently, or read
        ahead, as `fetch` would return them), or None when that needs the log or the storage: also
        when the limits want records past this process's tail that another writer appended.
        Never blocks on I/O: callers on an event loop try this before handing `fetch` to a thread."""
        snap = self._snap
        if not (0 <= partition < snap.config.partitions and 1 <= max_records <= self.settings.max_fetch_records):
            return None
        if partition in self._recovering:  # `fetch` says why
            return None
        if max_bytes < 1 or offset < snap.log_start_offset(partition):
            return None
        capped = min(max_bytes, self.settings.max_fetch_bytes)
        ahead = self._read_ahead_result(partition, offset, max_records, capped, encoder, ready_only=True)
        if ahead is not None:
            return ahead
        piece = self._tail.read(partition, offset, max_records)
        if piece is None or piece.num_rows == 0:
            return None
        budget = min(max_bytes, self.settings.max_fetch_bytes)
        sizes = record_sizes(piece)
        fits = max(1, int(np.searchsorted(np.cumsum(sizes), budget, side="right")))
        if fits == piece.num_rows < max_records and self._tail.end_offset(partition) < snap.high_watermark(partition):
            # the limits want more and the log goes on past this process's tail (another gateway
            # appended after it): `fetch` reads on from the segments instead of answering short
            return None
        piece = piece.slice(0, fits)
        result = FetchResult(
            records=piece,
            next_offset=int(piece.column("offset")[-1].as_py()) + 1,
            high_watermark=self._hw(snap, partition),
            log_start_offset=snap.log_start_offset(partition),
        )
        if encoder is None:
            return result
        return dataclasses.replace(
            result,
            records=TOPIC_SCHEMA.empty_table(),
            encoded=encoder.table(piece),
            encoded_count=piece.num_rows,
            encoded_size=int(sizes[:fits].sum()),
        )

    def _read_segment(
        self, seg: SegmentInfo, partition: int, offset: int, limit: int, max_bytes: int | None = None
    ) -> tuple[pa.Table, np.ndarray]:
        """Rows of `seg` with offset >= `offset`, at most `limit`, reading only the row groups
        they and `max_bytes` (uncompressed, by the footer) need; and their record sizes."""
        meta, described = self._footers.row_groups(seg.path)
        wanted = row_groups_for(described, offset, limit, max_bytes)
        if not wanted:
            return TOPIC_SCHEMA.empty_table(), np.zeros(0, dtype=np.int64)
        found = {g: self._row_groups.get((seg.path, g)) for g in wanted}
        missing = [g for g, group in found.items() if group is None]
        if missing:
            try:
                path = self.storage.file_path(self.uri, seg.path)
                with self._files.open(path, meta, None if self.storage.is_local else self._fs) as pf:
                    for g in missing:
                        # one row group of ~1 MB: decoding its columns on threads cost more than it
                        # saved here (0.53 against 0.39 ms per MB)
                        raw = pf.read_row_group(g, use_threads=False)
                        found[g] = decoded = RowGroup.of(self._as_topic_rows(raw, partition))
                        self._row_groups.put((seg.path, g), decoded)
            except (OSError, FileNotFoundError) as exc:
                # A job removed the file after our snapshot: re-index and let the caller retry.
                self.refresh()
                raise StorageUnavailableError(
                    f"Segment {seg.path} of {self.topic}-{partition} vanished; retry the fetch."
                ) from exc
        groups = [group for g in wanted if (group := found[g]) is not None]  # every one, read above
        if all(gr.ascending for gr in groups) and all(
            b.offsets[0] > a.offsets[-1] for a, b in itertools.pairwise(groups) if len(a.offsets) and len(b.offsets)
        ):
            # sorted (ours always are): the records at or after `offset` are slices, no copy
            tables, sizes = [], []
            for gr in groups:
                start = int(np.searchsorted(gr.offsets, offset, side="left"))
                take = min(limit, len(gr.offsets) - start)
                if take <= 0:
                    continue
                tables.append(gr.table.slice(start, take))
                sizes.append(gr.sizes[start : start + take])
                limit -= take
                if limit == 0:
                    break
            if not tables:
                return TOPIC_SCHEMA.empty_table(), np.zeros(0, dtype=np.int64)
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            return table, sizes[0] if len(sizes) == 1 else np.concatenate(sizes)
        # Our writers and compaction keep files sorted by offset; other engines (a plain Spark
        # OPTIMIZE) may not, so check and sort rather than trust.
        table = pa.concat_tables([gr.table for gr in groups])
        offs = table.column("offset").to_numpy()
        order = np.argsort(offs, kind="stable")
        table = table.take(pa.array(order))
        start = int(np.searchsorted(offs[order], offset, side="left"))
        table = table.slice(start, limit)
        return table, record_sizes(table)

    def _as_topic_rows(self, raw: pa.Table, partition: int) -> pa.Table:
        """A decoded row group in TOPIC_SCHEMA (the partition lives in the file's path), with the
        file's producers' codec (`CODEC_KEY`) as schema metadata when it names one."""
        n = raw.num_rows
        codec = (raw.schema.metadata or {}).get(CODEC_KEY.encode())
        timestamp = raw.column("timestamp")
        if timestamp.type != TIMESTAMP_TYPE:
            timestamp = timestamp.cast(TIMESTAMP_TYPE)
        return pa.Table.from_arrays(
            [
                raw.column("key"),
                raw.column("value"),
                raw.column("topic") if "topic" in raw.column_names else pa.array([self.topic] * n),
                pa.array(np.full(n, partition, dtype=np.int32)),
                raw.column("offset"),
                timestamp,
                raw.column("timestampType"),
                raw.column("headers"),
            ],
            schema=TOPIC_SCHEMA if codec is None else TOPIC_SCHEMA.with_metadata({CODEC_KEY: codec}),
        )

    def offset_for_timestamp(self, partition: int, timestamp_ms: int) -> int | None:
        """First offset whose timestamp >= `timestamp_ms`, or None if every record is older.

        Raises: PartitionNotFoundError.
        """
        snap = self._check_partition(self._snapshot_after_refresh(), partition)
        target_us = timestamp_ms * 1000
        index = snap.partitions.get(partition)
        if index is None:
            return None
        for seg in index.segments:
            if seg.max_timestamp_ms < timestamp_ms:  # stats are ms, floored: never skips a match
                continue
            table, _ = self._read_segment(
                seg, partition, seg.first_offset, seg.records or self.settings.max_fetch_records
            )
            ts = table.column("timestamp").cast(pa.int64()).to_numpy()
            hits = np.flatnonzero(ts >= target_us)
            if len(hits):
                return int(table.column("offset")[int(hits[0])].as_py())
        return None
