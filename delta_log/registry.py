"""Process-wide access to topics: per topic one group committer, one reader and one maintenance
loop, created on first use; the shared offsets store; topic administration that keeps them in step.

Concurrency contract: thread-safe; topic handles are created lazily under a lock, dropped on delete,
and released when a topic has been idle (`release_idle`), so an idle topic costs nothing but its
name. No topic owns a thread: flushes run on one `FlushPool` (`writer.flush_threads`) and
maintenance on one `MaintenanceScheduler` (`maintenance.threads`). Commit listeners run on the
committing thread and must be quick (they wake waiters).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence

from conf import Settings
from delta_log.core.histogram import Histogram
from delta_log.core.lag import lowest_committed
from delta_log.core.topic_config import validate_topic_name
from delta_log.errors import TopicNotFoundError, WriterClosedError
from delta_log.log.catalog import Catalog, TopicDescription
from delta_log.log.group_commit import FlushPool, FlushStats, GroupCommitter
from delta_log.log.read_ahead import ReadAhead
from delta_log.log.reader import FetchResult, OpenFiles, TopicReader
from delta_log.log.write_ahead import LogTopic, WriteAhead, replay
from delta_log.log.writer import CommitInfo, TopicWriter
from delta_log.maintenance.delete_records import delete_records
from delta_log.maintenance.topic_maintenance import MaintenanceClock, MaintenanceScheduler, TopicMaintenance
from delta_log.maintenance.upsert import UPSERT_GROUP
from delta_log.system.offsets import OffsetStore
from delta_log.system.schemas import SchemaStore
from delta_log.table.app_transactions import holder_number
from delta_log.table.segment_files import ParquetOptions
from delta_log.table.storage import StorageRoot

log = logging.getLogger(__name__)

_holder_number = functools.lru_cache(maxsize=1024)(holder_number)

#: what produce hands requests to: a `table` topic's group committer, or a `log` topic's
Committer = GroupCommitter | LogTopic


class TopicRegistry:
    """Topics of one storage root, as a server process uses them."""

    def __init__(self, settings: Settings, *, on_flush: Callable[[FlushStats], None] | None = None) -> None:
        self.settings = settings
        self.storage = StorageRoot(settings.root, settings.storage_options)
        self.catalog = Catalog(self.storage, settings.writer)
        self._on_flush = on_flush
        self._lock = threading.Lock()
        self._committers: dict[str, Committer] = {}
        self._maintenance: dict[str, TopicMaintenance] = {}
        self._readers: dict[str, TopicReader] = {}
        self._read_ahead: ReadAhead[FetchResult] = ReadAhead(
            settings.reader.read_ahead_bytes, size=FetchResult.held_bytes, threads=settings.reader.read_ahead_threads
        )
        self._open_files = OpenFiles(settings.reader.open_files)
        self._listeners: list[Callable[[CommitInfo], None]] = []
        self._offsets: OffsetStore | None = None
        self._schemas: SchemaStore | None = None
        self._sticky: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
        self._clocks: dict[str, MaintenanceClock] = {}  # of released topics: their cleanup and vacuum stay due
        self._closed = False
        self._deleting: set[str] = set()  # topics being deleted: no writer of theirs opens
        self._flush_pool = FlushPool(settings.writer.flush_threads)
        self._maintenance_scheduler = MaintenanceScheduler(settings.maintenance.threads)
        self._rollup_scope: Callable[[str, int], Collection[int]] | None = None
        self._write_ahead: WriteAhead | None = None
        #: this process's write-ahead directory name (the gateway id, when it serves one)
        self.wal_owner = f"{socket.gethostname()[:30]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        #: the write-ahead owners (gateway ids) known to have died, whose leases bind no one: the
        #: cluster's view, when this process serves in one
        self.gone_wal_owners: Callable[[], Collection[str]] = tuple
        #: per topic, the partitions with acked records of a dead gateway's log not yet in their
        #: table (its lease has not ended): their readers answer a retriable error meanwhile
        self._recovering: dict[str, frozenset[int]] = {}

    @property
    def offsets(self) -> OffsetStore:
        with self._lock:
            if self._offsets is None:
                self._offsets = OffsetStore(self.storage)
            return self._offsets

    @property
    def schemas(self) -> SchemaStore:
        """The schema registry (opened, or created, on first use)."""
        with self._lock:
            if self._schemas is None:
                self._schemas = SchemaStore(self.storage, max_age_s=self.settings.server.schema_refresh_s)
            return self._schemas

    def lowest_committed(self, topic: str) -> dict[int, int]:
        """Per partition, the lowest offset any consumer group committed (for consumer-aware retention)."""
        offsets = self.offsets
        offsets.load()
        return lowest_committed(offsets.all_committed(), topic)

    def set_rollup_scope(self, scope: Callable[[str, int], Collection[int]] | None) -> None:
        """Which partitions of a topic (name, partition count) this process rolls up; None: all.
        In a cluster that routes produce, the partitions this gateway owns."""
        self._rollup_scope = scope

    def _rolled_up_here(self, topic: str) -> Collection[int] | None:
        scope = self._rollup_scope
        return None if scope is None else scope(topic, self.partitions(topic))

    def add_commit_listener(self, listener: Callable[[CommitInfo], None]) -> None:
        self._listeners.append(listener)

    def reader(self, topic: str) -> TopicReader:
        """Raises: InvalidTopicError, TopicNotFoundError."""
        validate_topic_name(topic)
        with self._lock:
            r = self._readers.get(topic)
            if r is not None:
                self._last_used[topic] = time.monotonic()
                return r
        fresh = TopicReader(  # raises for a missing topic
            self.storage, topic, self.settings.reader, read_ahead=self._read_ahead, open_files=self._open_files
        )
        with self._lock:
            self._last_used[topic] = time.monotonic()
            r = self._readers.setdefault(topic, fresh)
            r.set_recovering(self._recovering.get(topic, frozenset()))
            return r

    def open_reader(self, topic: str) -> TopicReader | None:
        """The topic's reader if it is open (no I/O), else None: call `reader` off the event loop."""
        with self._lock:
            r = self._readers.get(topic)
            if r is not None:
                self._last_used[topic] = time.monotonic()
            return r

    def partitions(self, topic: str) -> int:
        """The topic's partition count. Raises: InvalidTopicError, TopicNotFoundError."""
        return self.reader(topic).config.partitions

    def recent_partitions(self, topic: str, max_age_s: float = 5.0) -> int | None:
        """The partition count of an open topic as read within `max_age_s`, without I/O (None:
        not open, or older: call `partitions` off the event loop)."""
        with self._lock:
            r = self._readers.get(topic)
        config = None if r is None else r.recent_config(max_age_s)
        return None if config is None else config.partitions

    def committer(self, topic: str) -> Committer:
        """Raises: InvalidTopicError, TopicNotFoundError, WriterClosedError (the process is closing)."""
        with self._lock:
            if topic in self._deleting:
                raise TopicNotFoundError(topic)
        reader = self.reader(topic)
        with self._lock:
            if self._closed:
                raise WriterClosedError("This gateway is shutting down; retry through another.")
            c = self._committers.get(topic)
            if c is not None:
                return c
            carried = self._clocks.pop(topic, None)
        maintenance = TopicMaintenance(
            self.storage,
            topic,
            self.settings.maintenance,
            self.settings.writer,
            lowest_committed=self.lowest_committed,
            scheduler=self._maintenance_scheduler,
            carried=carried,
            rollup_scope=lambda: self._rolled_up_here(topic),
        )
        w = self.settings.writer
        committer: Committer
        config = reader.config
        if config.ack_mode == "log":
            # acked in the write-ahead log: readers learn of records at the ack, maintenance at
            # the table commit
            writer = TopicWriter(
                self.storage,
                topic,
                w,
                on_commit=lambda info: maintenance.notify_commit(),
                gone_holders=self._gone_holders,
            )
            reader.hold_tail()

            committer = LogTopic(
                writer,
                self.write_ahead(),
                max_lag_s=config.table_max_lag_ms / 1000,
                batch_bytes=min(w.wal_flush_bytes, w.max_queue_bytes // 2),  # flushed before back-pressure
                max_queue_bytes=w.max_queue_bytes,
                on_ack=self._fanout(reader, None),
                on_flushed=reader.flushed,
                on_flush=self._on_flush,
                holder=holder_number(self.wal_owner),
                lease_s=w.wal_lease_ms / 1000,
                margin_s=w.wal_lease_margin_ms / 1000,
                owned=lambda: self._rolled_up_here(topic),
                replay_others=lambda writer: writer.replay_write_ahead(skip=self._own_log),
            )
        else:
            writer = TopicWriter(
                self.storage, topic, w, on_commit=self._fanout(reader, maintenance), gone_holders=self._gone_holders
            )
            committer = GroupCommitter(
                writer,
                linger_s=w.linger_ms / 1000,
                batch_bytes=w.batch_bytes,
                max_queue_bytes=w.max_queue_bytes,
                on_flush=self._on_flush,
                pool=self._flush_pool,
                max_gap_s=w.max_flush_gap_ms / 1000,
            )
        with self._lock:
            deleted = topic in self._deleting
            existing = self._committers.get(topic)
            if existing is None and not deleted:
                self._committers[topic] = committer
                self._maintenance[topic] = maintenance
                return committer
        committer.close()
        maintenance.close()
        if existing is None:  # deleted while it opened
            raise TopicNotFoundError(topic)
        return existing

    def write_ahead(self) -> WriteAhead:
        """The process's write-ahead writer (started on first use by a `log` topic)."""
        with self._lock:
            if self._write_ahead is None:
                w = self.settings.writer
                self._write_ahead = WriteAhead(
                    self.storage,
                    self.wal_owner,
                    segment_bytes=w.wal_segment_bytes,
                    linger_s=w.wal_linger_ms / 1000,
                )
            return self._write_ahead

    def write_ahead_syncs(self) -> Histogram | None:
        """This gateway's write-ahead durable writes (`WriteAheadLog.sync_histogram`); None before
        a `log` topic opened the log."""
        with self._lock:
            write_ahead = self._write_ahead
        return None if write_ahead is None else write_ahead.wal.sync_histogram()

    def replay_write_ahead(self, *, live: Callable[[str], bool] = lambda owner: False) -> tuple[dict[str, int], bool]:
        """Write into their tables the write-ahead records of gateways that died before flushing
        them (at start, and when a gateway leaves); returns the records written per topic, and
        whether all are in (False: some partitions' leases have not ended yet; replay again then:
        until then those partitions' readers answer PartitionRecoveringError, never a high
        watermark below what was acked). `live`: whether a gateway id still runs (its log is its own
        to flush: not read, not deleted).

        Raises: StorageUnavailableError."""
        writers: dict[str, TopicWriter] = {}

        def writer_of(topic: str) -> TopicWriter:
            if topic not in writers:
                writers[topic] = TopicWriter(self.storage, topic, self.settings.writer, gone_holders=self._gone_holders)
            return writers[topic]

        written, pending = replay(self.storage, writer_of, skip=lambda name: self._own_log(name) or live(name))
        self._set_recovering({t: frozenset(ps) for t, ps in pending.items()})
        return written, not pending

    def _set_recovering(self, recovering: dict[str, frozenset[int]]) -> None:
        with self._lock:
            before, self._recovering = self._recovering, recovering
            readers = {t: self._readers[t] for t in before.keys() | recovering.keys() if t in self._readers}
        for topic, r in readers.items():
            now = recovering.get(topic, frozenset())
            if before.get(topic, frozenset()) - now:
                r.refresh()  # the replay's commit first: a partition served again is served whole
            r.set_recovering(now)
        if recovering:
            log.warning(
                "write-ahead recovery: partitions wait for a dead gateway's lease to end: %s",
                {t: sorted(ps) for t, ps in recovering.items()},
            )

    @property
    def recovering(self) -> dict[str, frozenset[int]]:
        """Per topic, the partitions whose acked records are not all readable yet (see
        `replay_write_ahead`)."""
        return dict(self._recovering)

    def _gone_holders(self) -> frozenset[int]:
        return frozenset(_holder_number(o) for o in self.gone_wal_owners())

    def _own_log(self, name: str) -> bool:
        return name == self.wal_owner

    def _fanout(self, reader: TopicReader, maintenance: TopicMaintenance | None) -> Callable[[CommitInfo], None]:
        def on_commit(info: CommitInfo) -> None:
            reader.on_commit(info)
            if maintenance is not None:
                maintenance.notify_commit()
            for listener in self._listeners:
                try:
                    listener(info)
                except Exception:
                    log.exception("commit listener failed")

        return on_commit

    def sticky_partition(self, topic: str, partitions: int, *, advance: bool, among: Sequence[int] = ()) -> int:
        """Kafka's sticky partitioner for null keys: one partition per batch, moving on per batch;
        only through `among` when given (in a cluster: the partitions this gateway owns)."""
        with self._lock:
            current = self._sticky.get(topic, hash(topic) % partitions)
            if advance:
                self._sticky[topic] = current + 1
            return among[current % len(among)] if among else current % partitions

    def table_lag_s(self, topic: str) -> float | None:
        """A `log` topic's: how long its oldest acked record has waited for the table here (None:
        a `table` topic, or no writer open here)."""
        with self._lock:
            c = self._committers.get(topic)
        return c.table_lag_s if isinstance(c, LogTopic) else None

    def upsert_lags(self) -> dict[str, int]:
        """Records the upsert job has not merged yet, per upsert topic this process has open (its
        processed offsets are the group `topiclake-upsert`'s commits)."""
        with self._lock:
            readers = dict(self._readers)
        out: dict[str, int] = {}
        loaded = False
        for topic, reader in readers.items():
            if reader.config.table_mode != "upsert":
                continue
            if not loaded:
                self.offsets.load()
                loaded = True
            done = {p: c.offset for (_, p), c in self.offsets.committed(UPSERT_GROUP, topic).items()}
            out[topic] = sum(
                max(0, p.high_watermark - max(done.get(p.partition, 0), p.log_start_offset))
                for p in reader.partition_offsets()
            )
        return out

    def committers(self) -> dict[str, Committer]:
        with self._lock:
            return dict(self._committers)

    def maintenance(self, topic: str) -> TopicMaintenance | None:
        """The topic's maintenance loop, if the topic was written to by this process."""
        with self._lock:
            return self._maintenance.get(topic)

    # -- topic administration: the catalog change and this process's handles, in step ----------------
    def describe_topic(self, topic: str) -> tuple[TopicDescription, TopicReader]:
        """The topic's config and a freshly refreshed reader. Raises: TopicNotFoundError."""
        reader = self.reader(topic)
        reader.refresh()
        return self.catalog.describe_topic(topic, reader.table), reader

    def alter_config(
        self, topic: str, updates: Mapping[str, object], *, validate_only: bool = False
    ) -> TopicDescription:
        """Raises: TopicNotFoundError, InvalidConfigError."""
        if validate_only:
            return self.catalog.alter_config(topic, updates, validate_only=True)
        before = self.reader(topic).config
        desc = self.catalog.alter_config(topic, updates)
        self.reader(topic).refresh()  # the next produce validates against the new config
        config = self.reader(topic).config
        if (config.ack_mode, config.table_max_lag_ms) != (before.ack_mode, before.table_max_lag_ms):
            with self._lock:  # the next produce opens the committer of the new mode
                c = self._committers.pop(topic, None)
            if c is not None:
                c.close()  # a `log` topic's acked records reach the table first
        return desc

    def add_partitions(self, topic: str, total: int, *, validate_only: bool = False) -> TopicDescription:
        """Raises: TopicNotFoundError, InvalidPartitionsError."""
        if validate_only:
            return self.catalog.add_partitions(topic, total, validate_only=True)
        desc = self.catalog.add_partitions(topic, total)
        self.reader(topic).refresh()
        return desc

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Kafka's DeleteRecords: the partition's records below `offset` (-1: the high watermark)
        are deleted; returns the new log start offset.

        Raises: TopicNotFoundError, PartitionNotFoundError, InvalidOffsetError, StorageUnavailableError."""
        w = self.settings.writer
        parquet = ParquetOptions.of(w)
        low = delete_records(self.storage, topic, partition, offset, parquet=parquet, attempts=w.max_commit_attempts)
        self.reader(topic).refresh()
        return low

    def delete_topic(self, topic: str) -> None:
        """Flush and stop this process's writer of the topic, then remove its table.

        Raises: InvalidTopicError, TopicNotFoundError."""
        self.catalog.describe_topic(topic)  # 404 before touching writers
        with self._lock:  # appends that come meanwhile (a transaction landing) find it gone
            self._deleting.add(topic)
        try:
            self.drop(topic)
            self.catalog.delete_topic(topic)
        finally:
            with self._lock:
                self._deleting.discard(topic)

    def drop(self, topic: str) -> None:
        """Forget a topic's handles; flushes what its committer holds, and lets no checkpoint of
        its writer run after."""
        with self._lock:
            c = self._committers.pop(topic, None)
            m = self._maintenance.pop(topic, None)
            self._readers.pop(topic, None)
            self._sticky.pop(topic, None)
            self._last_used.pop(topic, None)
            self._clocks.pop(topic, None)
        if c is not None:
            c.close()
            c.writer.stop_checkpoints()
        if m is not None:
            m.close()

    def release_idle(self, idle_s: float, max_open: int) -> list[str]:
        """Release the handles (writer, reader, caches, maintenance) of topics unused for `idle_s`,
        and of the least recently used beyond `max_open` open topics; a topic with requests
        waiting or a maintenance pass running is kept. They are opened again on next use.
        Returns the released topics."""
        now = time.monotonic()
        with self._lock:
            for topic, c in self._committers.items():
                self._last_used[topic] = max(self._last_used.get(topic, 0.0), c.last_used)
            by_age = sorted(self._last_used.items(), key=lambda kv: kv[1])
            over = max(0, len(by_age) - max_open)
            candidates = [t for i, (t, used) in enumerate(by_age) if i < over or now - used >= idle_s]
            released: list[tuple[str, Committer | None, TopicMaintenance | None]] = []
            for topic in candidates:
                committer, loop = self._committers.get(topic), self._maintenance.get(topic)
                if (committer is not None and committer.busy) or (loop is not None and loop.busy):
                    continue
                released.append((topic, self._committers.pop(topic, None), self._maintenance.pop(topic, None)))
                self._readers.pop(topic, None)
                self._last_used.pop(topic, None)
        for topic, committer, loop in released:
            if committer is not None:
                committer.close()
            if loop is not None:
                loop.close()
                with self._lock:
                    self._clocks[topic] = loop.clock()
        if released:
            log.debug("released %d idle topics", len(released))
        return [t for t, _, _ in released]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            committers = list(self._committers.values())
            loops = list(self._maintenance.values())
            self._committers.clear()
            self._maintenance.clear()
            self._readers.clear()
        for m in loops:
            m.stop()  # all at once: then each close waits only for its running pass
        if self._write_ahead is not None:
            self._write_ahead.close()  # what waits is written and acked; the topics then flush
        for c in committers:
            c.close()
        for m in loops:
            m.close()
        self._flush_pool.close()
        self._maintenance_scheduler.close()
        self._read_ahead.close()
