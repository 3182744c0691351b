"""The write-ahead tier: `log` topics are acked once durable in the gateway's write-ahead log
(delta_log.log.wal), and flushed into their Delta tables within `topiclake.table.max.lag.ms`.

- One writer thread per process (`WriteAhead`) takes every waiting request of every `log` topic,
  plans each topic's (producer checks, offsets: delta_log.log.writer.stage, against the topic's
  own view of its high watermarks and producers), writes them as ONE frame, fsyncs (or PUTs), then
  feeds readers' tails and answers. Requests that arrive during a write form the next one, so a
  write carries more as load grows. Offsets are assigned here and never change.
- Each `LogTopic` keeps the records it acked but has not flushed, in memory (the readers' tails
  hold them too, pinned until flushed, so fetches and long-polls see them at once). Its table
  flush runs on the process's one write-ahead flush thread (oldest due first) when half the max
  lag passed since its oldest unflushed ack, or when `batch_bytes` (`writer.wal_flush_bytes`)
  wait: one Delta commit per topic per window, however many requests came in
  (TopicWriter.commit_staged, with the high watermark and producers' txns). Beyond the commits a
  second the thread can make, the lag grows.
- A partition is acked only while this gateway holds its lease (renewed by each flush). Claiming
  one (after replaying other gateways' logs of the topic: a Delta commit) runs on two lease
  threads of the process while the partition's requests wait parked, in order; the writer thread
  never waits for a commit, and a claim never queues behind the flushes of many topics.
- A flush that fails is retried (the records stay in the log and in memory); above
  `max_queue_bytes` unflushed a topic answers BackPressureError.
- At start, `replay` writes every write-ahead record that is not yet in its table (the txn high
  watermarks tell which), so a crash between ack and flush loses and duplicates nothing.

Concurrency contract: `submit` is thread-safe; staging and acks run on the writer thread; a topic's
TopicWriter is used under its own lock (the writer thread reads its txns on a topic's first use,
the flush thread and the lease threads commit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from delta_log.core.producer import ProducerSequence
from delta_log.core.records import group_by_partition
from delta_log.errors import (
    BackPressureError,
    OwnerNotAvailableError,
    StorageUnavailableError,
    TopiclakeError,
    TopicNotFoundError,
    WriterClosedError,
)
from delta_log.log.group_commit import FlushPool, FlushStats, resolve
from delta_log.log.wal import (
    ProducerRange,
    WriteAheadLog,
    collect,
    delete_dir,
    encode_frame,
    latest_per_offset,
    sync_filesystem,
)
from delta_log.log.writer import AppendRequest, AppendResult, CommitInfo, Staged, TopicWriter, partitions_of, stage
from delta_log.table.app_transactions import append_transactions, hw_app_id, partition_of
from delta_log.table.storage import StorageRoot

log = logging.getLogger(__name__)


def _by_partition(tables: list[pa.Table]) -> pa.Table:
    """Acked records (each table sorted by partition then offset, and each partition's offsets
    going on from one table to the next) as one table sorted by partition then offset, in one
    chunk. The tables' partition column is read once, over all of them: read per table (its
    column, its runs, its slices), a flush of 250 writes of 10 records took 3.4 ms on one thread
    and 16 ms under load, each call waiting again for the GIL the acks need; now 0.5 ms."""
    if len(tables) == 1:
        return tables[0]
    combined = pa.concat_tables(tables)
    return group_by_partition(combined, combined.column("partition").to_numpy()).combine_chunks()


#: a txn the writer's table does not hold (a producer never seen on a partition)
_ABSENT = -1
#: producer entries kept in a topic's view beyond those not yet flushed
_MAX_VIEW_ENTRIES = 100_000
_HANDLES = itertools.count()  # LogTopic.key
#: the table flushes run this much below the threads that ack (Linux `nice`): a flush's burst of
#: parquet and Delta work otherwise takes a core from the event loop and the log's writer, and the
#: acks of the next tens of ms wait (measured on tmpfs: ack p99 7.0-11.1 ms with it, 13.6-22.5 without)
FLUSH_NICE = 10


@dataclass(frozen=True, slots=True)
class _Acked:
    records: pa.Table
    producers: list[tuple[ProducerSequence, int, int]]
    txns: dict[str, int]
    at: float
    nbytes: int
    codecs: dict[int, str]  # partition -> its producers' codec (Staged.codecs)

    def high_watermarks(self) -> dict[int, int]:
        """The partitions' high watermarks once these records are in (their `hw-<p>` txns)."""
        out = {}
        for app_id, version in self.txns.items():
            p = partition_of(app_id)
            if p is not None and app_id == hw_app_id(p):
                out[p] = version
        return out


class LogTopic:
    """A `log` topic's committer (the interface of GroupCommitter): acked through the write-ahead
    log, flushed into the topic table within `max_lag_s`."""

    def __init__(
        self,
        writer: TopicWriter,
        write_ahead: WriteAhead,
        *,
        max_lag_s: float,
        batch_bytes: int,
        max_queue_bytes: int,
        on_ack: Callable[[CommitInfo], None],
        on_flushed: Callable[[dict[int, int]], None],
        on_flush: Callable[[FlushStats], None] | None = None,
        holder: int = 0,
        lease_s: float = 10.0,
        margin_s: float = 2.0,
        owned: Callable[[], Collection[int] | None] = lambda: None,
        replay_others: Callable[[TopicWriter], int] = lambda writer: 0,
    ) -> None:
        self.writer = writer
        self.topic = writer.topic
        #: this handle's name in the log's bookkeeping: a topic deleted and made again under its
        #: name starts its offsets again, and must not be taken for flushed up to the old ones
        self.key = f"{self.topic}#{next(_HANDLES)}"
        self.table_id = writer.table_id()  # in each frame: a replay skips what a deleted table acked
        self.write_ahead = write_ahead
        self.max_lag_s = max_lag_s
        self.batch_bytes = batch_bytes
        self.max_queue_bytes = max_queue_bytes
        self.on_ack = on_ack
        self.on_flushed = on_flushed
        self.on_flush = on_flush
        self.holder = holder
        self.lease_s = lease_s
        self.margin_s = margin_s
        self.owned = owned
        self.replay_others = replay_others
        #: partition -> until when (monotonic) this gateway may ack its records: its lease's end,
        #: less the margin that covers other gateways' clocks being ahead of this one's
        self._leases: dict[int, float] = {}
        #: requests (in arrival order) waiting for a claim of their partitions, which runs on the
        #: lease threads: the writer thread never waits for a Delta commit
        self._parked: list[_Item] = []
        self._claiming = False
        self._renewing = False
        self._refused: dict[int, TopiclakeError] = {}  # by the latest claim
        self._writer_lock = threading.Lock()
        self._lock = threading.Condition()
        self._view: dict[str, int] = {}  # txn app id -> version: the table's, then what was acked
        self._unflushed: deque[_Acked] = deque()
        self._unflushed_bytes = 0
        self._waiting = 0  # submitted, not yet written
        #: the unflushed acks the running flush holds (the first so many; 0: no flush runs)
        self._flushing = 0
        self._flushing_bytes = 0
        self._flush_due: float | None = None
        self._flush_queued = False  # a flush task waits on the flush thread (WriteAhead._flush_soon)
        self._closed = False
        self.last_used = time.monotonic()
        self.flushes = 0
        self.flush_failures = 0
        #: seconds from a record's ack to its table commit, of the latest flush (its oldest record)
        self.last_lag_s = 0.0

    # -- the committer interface ------------------------------------------------------------------
    def submit(self, request: AppendRequest) -> Future[AppendResult]:
        """Raises: BackPressureError, WriterClosedError."""
        with self._lock:
            if self._closed:
                raise WriterClosedError(f"The writer of topic {self.topic!r} is closed.")
            if self._unflushed_bytes > self.max_queue_bytes:
                raise BackPressureError(
                    f"Topic {self.topic!r} has {self._unflushed_bytes} bytes acked but not yet in its table.",
                    topic=self.topic,
                    queued_bytes=self._unflushed_bytes,
                )
            self._waiting += 1
            self.last_used = time.monotonic()
        return self.write_ahead.submit(self, request)

    @property
    def queue_depth(self) -> int:
        return len(self._unflushed) + self._waiting

    @property
    def queued_bytes(self) -> int:
        return self._unflushed_bytes

    @property
    def busy(self) -> bool:
        return bool(self._unflushed or self._waiting or self._flushing)

    @property
    def table_lag_s(self) -> float:
        """How long the oldest acked record has waited for the table (0: none waits)."""
        with self._lock:
            return time.monotonic() - self._unflushed[0].at if self._unflushed else 0.0

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new requests; flush what was acked into the table."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            while self._waiting > 0 and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)
        while self._unflushed and time.monotonic() < deadline:
            if not self.flush_table():
                time.sleep(0.1)
        if self._unflushed:
            log.error(
                "topic %s: closed with acked records not yet in its table; the next start replays them", self.topic
            )
        elif self._leases:  # all flushed: end the leases, so whoever writes next need not wait them out
            try:
                with self._writer_lock:
                    self.writer.claim(sorted(self._leases), self.holder, 0)
            except TopiclakeError as exc:
                log.info("topic %s: leases left to expire (%s)", self.topic, exc)
            self._leases.clear()

    # -- the writer thread -------------------------------------------------------------------------
    def transaction_version(self, app_id: str) -> int | None:
        """The topic's view of a txn: what was acked, else the table's (read once)."""
        v = self._view.get(app_id)
        if v is None:
            with self._writer_lock:
                got = self.writer.transactions.transaction_version(app_id)
            v = self._view[app_id] = _ABSENT if got is None else got
        return None if v == _ABSENT else v

    def park(self, items: list[_Item], now: float) -> bool:
        """On the writer thread, before staging: park `items` (True) while a claim of their
        partitions runs on a lease thread, started here when one is needed; requests parked before
        go first, so a partition's requests keep their order. A lease inside its margin is renewed
        in the background meanwhile (the requests are staged now)."""
        parts = set().union(*(it.request.partition_set() for it in items))
        with self._lock:
            if not self._claiming and all(self._leases.get(p, 0.0) > now for p in parts):
                if not self._renewing and any(self._leases[p] - now < self.margin_s for p in parts):
                    self._renewing = True
                    self._in_pool(self._renew, parts)
                return False
            for it in items:
                it.parked = True
            self._parked.extend(items)
            if self._claiming:
                return True
            self._claiming = True
        self._in_pool(self._claim_parked, parts)
        return True

    def _in_pool(self, task: Callable[[set[int]], None], parts: set[int]) -> None:
        try:
            self.write_ahead.leases.submit(lambda: task(parts))
        except RuntimeError:  # the pool is shut down: this process is closing
            task(parts)

    def _renew(self, parts: set[int]) -> None:
        try:
            self._lease(parts)
        except Exception:  # the lease is claimed again when it ends; say why it was not renewed
            log.exception("topic %s: renewing the write-ahead lease of partitions %s failed", self.topic, sorted(parts))
        finally:
            with self._lock:
                self._renewing = False

    def _claim_parked(self, parts: set[int]) -> None:
        """Claim the parked requests' partitions (after replaying other gateways' logs of this
        topic), then hand the requests back to the writer thread: those whose partitions were
        refused (or whose claim failed) are answered with why."""
        refused: dict[int, TopiclakeError] = {}
        try:
            refused = self._lease(parts)
        except Exception as exc:  # not a refusal: answer the requests rather than claim again forever
            log.exception("topic %s: claiming partitions %s failed", self.topic, sorted(parts))
            failed = StorageUnavailableError(f"Claiming the partitions of topic {self.topic!r} failed: {exc}")
            refused = dict.fromkeys(parts, failed)
        finally:
            with self._lock:
                self._refused = refused
            self.write_ahead.ready(self)

    def unpark(self) -> tuple[list[_Item], list[tuple[_Item, TopiclakeError]]]:
        """On the writer thread, once a claim ended: the parked requests to stage now (their
        partitions claimed, or claimed since by a claim they started) and the ones refused."""
        with self._lock:
            items, self._parked, self._claiming = self._parked, [], False
            refused, self._refused = self._refused, {}
        for it in items:
            it.parked = False
        ok: list[_Item] = []
        failed: list[tuple[_Item, TopiclakeError]] = []
        for it in items:
            hit = it.request.partition_set() & refused.keys()
            if hit:
                failed.append((it, refused[min(hit)]))
            else:
                ok.append(it)
        return ok, failed

    def stage(self, requests: list[AppendRequest]) -> Staged:
        """Plan the requests against this topic's view; a request for a partition whose lease this
        gateway does not hold now (it ended since `park` looked) is answered with an error instead."""
        parts = [r.partition_set() for r in requests]
        now = time.monotonic()
        refused: dict[int, TopiclakeError] = {
            p: OwnerNotAvailableError(
                f"This gateway's write-ahead lease of partition {p} of topic {self.topic!r} ended; retry.",
                topic=self.topic,
                partition=p,
            )
            for p in set().union(*parts)
            if self._leases.get(p, 0.0) <= now
        }
        if not refused:
            return stage(requests, self, self.topic)
        ok = [i for i, ps in enumerate(parts) if not ps & set(refused)]
        inner = stage([requests[i] for i in ok], self, self.topic) if ok else None
        results = [AppendResult(error=refused[min(ps & set(refused))]) for ps in parts]
        for j, i in enumerate(ok):
            assert inner is not None
            results[i] = inner.results[j]
        if inner is None:
            return Staged(results=results, records=None, high_watermarks={}, producer_ranges=[])
        return dataclasses.replace(inner, results=results)

    def _lease(self, partitions: set[int]) -> dict[int, TopiclakeError]:
        """Make sure this gateway holds the write-ahead lease of `partitions` for at least the
        margin, claiming (after replaying the other gateways' logs of this topic) where it does
        not; the partitions it cannot hold, with why."""
        now = time.monotonic()
        wanted = sorted(p for p in partitions if self._leases.get(p, 0.0) - now < self.margin_s)
        if not wanted:
            return {}
        refused: dict[int, TopiclakeError] = {}
        owned = self.owned()
        if owned is not None:
            for p in [p for p in wanted if p not in owned]:
                refused[p] = OwnerNotAvailableError(
                    f"Partition {p} of topic {self.topic!r} is owned by another gateway; produce through it.",
                    topic=self.topic,
                    partition=p,
                )
            wanted = [p for p in wanted if p not in refused]
        if not wanted:
            return refused
        start = time.monotonic()
        try:
            with self._writer_lock:
                # Who holds what is read BEFORE the replay, and a partition another gateway holds
                # now is not claimed this time. The replay leaves such a partition to its holder;
                # a claim a moment later, after that lease ended, would take the partition without
                # the holder's last acks (which it forgets once refused): seen as 599 acked records
                # lost in a kill test on a loaded machine. A lease that has ended stays ended
                # (a new claim of it makes this one's commit fail), and its holder stopped acking a
                # margin before its end, so the replay below reads all it acked.
                held = self.writer.leased_by_others(wanted, self.holder)
                for p in held:
                    refused[p] = OwnerNotAvailableError(
                        f"Partition {p} of topic {self.topic!r} is written through another gateway's write-ahead "
                        "log until its lease ends; retry.",
                        topic=self.topic,
                        partition=p,
                    )
                wanted = [p for p in wanted if p not in held]
                if not wanted:
                    return refused
                self.replay_others(self.writer)  # a gateway that died holding some: its acks first
                hws = self.writer.claim(wanted, self.holder, int(time.time() * 1000 + self.lease_s * 1000))
        except TopiclakeError as exc:
            return refused | dict.fromkeys(wanted, exc)
        with self._lock:
            for p in wanted:
                self._leases[p] = start + self.lease_s - self.margin_s
                acked = self._view.get(hw_app_id(p), _ABSENT)
                if hws.get(p, 0) > acked:  # another gateway appended meanwhile: read p from the table
                    self._forget_locked(p)
                # (else what this gateway acked and has not flushed yet stays its view of p)
        return refused

    def _forget_locked(self, partition: int) -> None:
        # a copy first: the writer thread adds entries without the lock (dict() copies atomically)
        self._view = {k: v for k, v in dict(self._view).items() if partition_of(k) != partition}

    def leased(self, staged: Staged, now: float) -> bool:
        """Whether this gateway still held the lease of every partition `staged` writes when its
        write became durable (a gateway paused past its lease must not ack: another may have
        taken the partition over)."""
        if all(self._leases.get(p, 0.0) > now for p in staged.high_watermarks):
            return True
        with self._lock:
            for p in staged.high_watermarks:
                self._leases.pop(p, None)
        return False

    def acked(self, staged: Staged, now: float) -> float | None:
        """The staged requests are durable: they count from now on. Returns when the table flush is
        due (None: nothing to flush)."""
        with self._lock:
            self._waiting -= len(staged.results)
            if staged.records is not None:
                txns = {
                    t.app_id: t.version for t in append_transactions(staged.high_watermarks, staged.producer_ranges)
                }
                self._view.update(txns)
                # the buffers' size, not `nbytes`: 0.5 against 14 us, and no GIL released and waited
                # for again on this thread (the records are built for this write: the same figure)
                nbytes = staged.records.get_total_buffer_size()
                self._unflushed.append(_Acked(staged.records, staged.producer_ranges, txns, now, nbytes, staged.codecs))
                self._unflushed_bytes += nbytes
            self._lock.notify_all()
            return self._due_locked()

    def abandoned(self, count: int) -> None:
        """`count` submitted requests were answered with an error instead."""
        with self._lock:
            self._waiting -= count
            self._lock.notify_all()

    def _due_locked(self) -> float | None:
        """When the acks no flush holds yet are due to be flushed (None: there are none). Those the
        running flush holds do not count: their deadline has passed, and counted they made every
        ack during a flush ask for another at once (two Delta commits a window, the second of the
        few requests a flush takes to run)."""
        if len(self._unflushed) <= self._flushing:
            return None
        if self._unflushed_bytes - self._flushing_bytes >= self.batch_bytes:
            return time.monotonic()
        # within half the lag; and often enough that the flushes renew the partitions' leases
        return self._unflushed[self._flushing].at + min(self.max_lag_s, self.lease_s - self.margin_s) / 2

    # -- the flush pool ------------------------------------------------------------------------------
    def flush_table(self) -> bool:
        """Commit every acked record not yet in the table, in one Delta commit. Returns False when
        it failed (the records stay; the caller retries)."""
        with self._lock:
            if self._flushing or not self._unflushed:
                return True
            batch = list(self._unflushed)
            self._flushing, self._flushing_bytes = len(batch), sum(a.nbytes for a in batch)
        try:
            records = _by_partition([a.records for a in batch])
            producers = [r for a in batch for r in a.producers]
            codecs = {p: c for a in batch for p, c in a.codecs.items()}  # (the last one acked)
            start, mono = time.perf_counter(), time.monotonic()
            lease = (self.holder, int(time.time() * 1000 + self.lease_s * 1000))
            with self._writer_lock:
                renewed = self.writer.commit_staged(records, producers, lease=lease, codecs=codecs) > 0
            seconds = time.perf_counter() - start
        except OwnerNotAvailableError as exc:
            # another gateway took partitions over after this one's lease ended: it replayed this
            # gateway's log first, so the table holds these acks; forget them, flush the rest
            log.warning("topic %s: %s; the new holder replayed its acked records", self.topic, exc)
            with self._writer_lock:
                taken = self.writer.leased_by_others(partitions_of(records), self.holder)
            self._handed_over(taken)
            return not taken
        except BaseException as exc:
            if not isinstance(exc, TopiclakeError):  # a bug, or an interrupt: the next flush retries
                with self._lock:
                    self._flushing = self._flushing_bytes = 0
                raise
            self.flush_failures += 1
            log.warning(
                "topic %s: flushing %d acked records into the table failed (%s); retrying",
                self.topic,
                records.num_rows if batch else 0,
                exc,
            )
            with self._lock:
                self._flushing = self._flushing_bytes = 0
            return False
        done = time.monotonic()
        flushed: dict[int, int] = {}
        with self._lock:
            for p in partitions_of(records) if renewed else []:  # (a commit of nothing renews nothing)
                if p in self._leases:
                    self._leases[p] = max(self._leases[p], mono + self.lease_s - self.margin_s)
            for a in batch:
                self._unflushed.popleft()
                self._unflushed_bytes -= a.nbytes
            for a in batch:
                for q, hw in a.high_watermarks().items():
                    flushed[q] = max(flushed.get(q, 0), hw)
            self._trim_view_locked()
            self._flushing = self._flushing_bytes = 0
            self.flushes += 1
            self.last_lag_s = done - batch[0].at
            self._lock.notify_all()
        self.on_flushed(flushed)
        self.write_ahead.flushed(self.key, flushed)
        if self.on_flush is not None:
            with contextlib.suppress(Exception):
                self.on_flush(
                    FlushStats(
                        topic=self.topic,
                        requests=len(batch),
                        records=records.num_rows,
                        bytes=sum(a.nbytes for a in batch),
                        seconds=seconds,
                        ok=True,
                    )
                )
        return True

    def _handed_over(self, taken: set[int]) -> None:
        """Forget what this gateway acked of the partitions another gateway took over."""
        unpinned: dict[int, int] = {}
        with self._lock:
            kept: deque[_Acked] = deque()
            for a in self._unflushed:
                parts = a.records.column("partition")
                mine = pc.invert(pc.is_in(parts, pa.array(sorted(taken), pa.int32())))
                for q, hw in a.high_watermarks().items():
                    if q in taken:
                        unpinned[q] = max(unpinned.get(q, 0), hw)
                rest = a.records.filter(mine)
                if rest.num_rows:
                    txns = {k: v for k, v in a.txns.items() if partition_of(k) not in taken}
                    producers = [r for r in a.producers if r[1] not in taken]
                    codecs = {q: c for q, c in a.codecs.items() if q not in taken}
                    kept.append(_Acked(rest, producers, txns, a.at, rest.nbytes, codecs))
            self._unflushed = kept
            self._unflushed_bytes = sum(a.nbytes for a in kept)
            for gone in taken:
                self._leases.pop(gone, None)
                self._forget_locked(gone)
            self._flushing = self._flushing_bytes = 0
            self._lock.notify_all()
        self.on_flushed(unpinned)  # the readers' tails need not hold them any longer
        self.write_ahead.flushed(self.key, unpinned)  # (the new holder's commit)

    def _trim_view_locked(self) -> None:
        """Forget producer entries the table holds, beyond a bound (high watermarks stay)."""
        if len(self._view) <= _MAX_VIEW_ENTRIES:
            return
        dirty = {k for a in self._unflushed for k in a.txns}
        self._view = {k: v for k, v in self._view.items() if k.startswith("hw-") or k in dirty}

    def next_due(self) -> float | None:
        with self._lock:
            return self._due_locked()


@dataclass(slots=True)
class _Item:
    topic: LogTopic
    request: AppendRequest
    future: Future[AppendResult]
    parked: bool = False  # held by its topic until a claim ends (not the writer thread's to answer)


class WriteAhead:
    """The process's write-ahead writer: every `log` topic's requests, one durable write at a time."""

    def __init__(self, storage: StorageRoot, owner: str, *, segment_bytes: int, linger_s: float = 0.0) -> None:
        self.wal = WriteAheadLog(storage, owner, segment_bytes=segment_bytes)
        self.linger_s = linger_s
        #: the table flushes of every `log` topic, one at a time (the process's flush pool is the
        #: table path's). A commit costs ~12 ms of CPU whatever it holds; flushed in
        #: parallel, many topics' flushes took every core and the acks waited (1 record a flush);
        #: one at a time, the oldest due first, they take at most about a core, and under more
        #: topics than commits a second can serve the lag grows instead, each flush carrying more.
        self.pool = FlushPool(1, name="write-ahead-flush", nice=FLUSH_NICE)
        #: claims and renewals of leases, on threads of their own: queued behind the flushes of
        #: many topics (a backlog when commits are short), the leases they renew lapsed meanwhile
        self.leases = FlushPool(2, name="write-ahead-lease")
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._ready: list[LogTopic] = []  # topics whose parked requests may be staged again
        self._due: list[tuple[float, int, LogTopic]] = []
        self._ids = itertools.count()
        self._closed = False
        self.write_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="write-ahead", daemon=True)
        self._thread.start()

    def submit(self, topic: LogTopic, request: AppendRequest) -> Future[AppendResult]:
        fut: Future[AppendResult] = Future()
        with self._cond:
            if self._closed:
                topic.abandoned(1)
                raise WriterClosedError("This gateway is shutting down; retry through another.")
            self._queue.append(_Item(topic, request, fut))
            self._cond.notify()
        return fut

    def ready(self, topic: LogTopic) -> None:
        """`topic`'s claim ended: its parked requests go into the next write (or, closing, are
        answered that this gateway stops)."""
        with self._cond:
            if not self._closed:
                self._ready.append(topic)
                self._cond.notify()
                return
        items, refused = topic.unpark()
        closing = WriterClosedError("This gateway is shutting down; retry through another.")
        for it, error in [(it, closing) for it in items] + refused:
            it.topic.abandoned(1)
            resolve(it.future, error=error)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._ready and not self._closed:
                    timeout = self._due[0][0] - time.monotonic() if self._due else None
                    if timeout is not None and timeout <= 0:
                        break
                    self._cond.wait(timeout)
                if self._closed and not self._queue and not self._ready:
                    return
                if self._queue and self.linger_s > 0:  # gather more into one write (one PUT on S3)
                    until = time.monotonic() + self.linger_s
                    while not self._closed and (left := until - time.monotonic()) > 0:
                        self._cond.wait(left)
                ready, self._ready = self._ready, []
                items = list(self._queue)
                self._queue.clear()
                now = time.monotonic()
                due = []
                while self._due and self._due[0][0] <= now:
                    at, _, topic = heapq.heappop(self._due)
                    if topic._flush_due == at:  # else superseded by an earlier deadline
                        topic._flush_due = None
                        due.append(topic)
            for topic in due:
                self._flush_soon(topic)
            for topic in ready:  # parked before anything in the queue: they go first
                unparked, refused = topic.unpark()
                items[:0] = unparked
                topic.abandoned(len(refused))
                for it, error in refused:
                    resolve(it.future, error=error)
            if items:
                try:
                    self._write(items)
                except Exception:  # the thread must survive: answer what it held
                    log.exception("write-ahead write failed")
                    for it in items:
                        if not it.future.done() and not it.parked:
                            it.topic.abandoned(1)
                            resolve(it.future, error=StorageUnavailableError("The write-ahead log failed; retry."))

    def _flush_soon(self, topic: LogTopic) -> None:
        with self._cond:
            if topic._flush_queued:  # one flush task a topic: a queued one takes what came meanwhile
                return
            topic._flush_queued = True

        def run() -> None:
            with self._cond:
                topic._flush_queued = False
            try:
                ok = topic.flush_table()
            except Exception:  # a bug: say so, and retry as after a failed commit
                log.exception("topic %s: flushing into the table failed", topic.topic)
                ok = False
            if not ok:
                self.schedule(topic, time.monotonic() + min(1.0, topic.max_lag_s / 4))
            elif (again := topic.next_due()) is not None:
                self.schedule(topic, again)

        try:
            self.pool.submit(run)
        except RuntimeError:  # shutting down: close() flushes
            topic._flush_queued = False

    def schedule(self, topic: LogTopic, at: float) -> None:
        """Flush `topic`'s table at `at` (one deadline per topic: the earliest asked for)."""
        with self._cond:
            if topic._flush_due is not None and topic._flush_due <= at:
                return
            topic._flush_due = at
            heapq.heappush(self._due, (at, next(self._ids), topic))
            self._cond.notify()

    def _write(self, items: list[_Item]) -> None:
        by_topic: dict[LogTopic, list[_Item]] = {}
        for it in items:
            by_topic.setdefault(it.topic, []).append(it)
        staged: list[tuple[LogTopic, list[_Item], Staged]] = []
        now = time.monotonic()
        for topic, group in by_topic.items():
            try:
                if topic.park(group, now):
                    continue
                staged.append((topic, group, topic.stage([it.request for it in group])))
            except BaseException as exc:
                topic.abandoned(len(group))
                for it in group:
                    resolve(it.future, error=exc)
        tables = [s.records for _, _, s in staged if s.records is not None]
        if tables:
            producers = [
                ProducerRange(t.topic, p, pr.producer_id, pr.sequence, base)
                for t, _, s in staged
                for pr, p, base in s.producer_ranges
            ]
            ends = {(t.key, p): hw for t, _, s in staged for p, hw in s.high_watermarks.items()}
            ids = {t.topic: t.table_id for t, _, s in staged if s.records is not None}
            start = time.perf_counter()
            try:
                self.wal.append(encode_frame(pa.concat_tables(tables), producers, ids), ends)
            except OSError as exc:
                error = StorageUnavailableError(f"The write-ahead log could not be written: {exc}")
                for topic, group, _ in staged:
                    topic.abandoned(len(group))
                    for it in group:
                        resolve(it.future, error=error)
                return
            self.write_seconds += time.perf_counter() - start
        now = time.monotonic()
        for topic, group, s in staged:
            if s.records is not None and not topic.leased(s, now):
                topic.abandoned(len(group))
                lost = OwnerNotAvailableError(
                    f"This gateway's write-ahead lease of topic {topic.topic!r} ended before the write was durable; retry.",
                    topic=topic.topic,
                )
                for it in group:
                    resolve(it.future, error=lost)
                continue
            due = topic.acked(s, now)
            if s.records is not None:  # readers first: an answered client may fetch at once
                topic.on_ack(
                    CommitInfo(
                        topic=topic.topic,
                        table_version=-1,
                        records=s.records,
                        high_watermarks=s.high_watermarks,
                        codecs=s.codecs,
                    )
                )
            for it, result in zip(group, s.results, strict=True):
                resolve(it.future, result=result)
            if due is not None:
                self.schedule(topic, due)

    def flushed(self, key: str, high_watermarks: dict[int, int]) -> None:
        """A topic's table now holds its records below these offsets (`key`: its LogTopic's):
        the log releases what it no longer needs once that is durable."""
        self.wal.in_tables({(key, p): hw for p, hw in high_watermarks.items()})

    def close(self) -> None:
        """Write what waits, then stop the writer thread (topics flush their tables on close)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(30)
        self.leases.close()
        self.pool.close()
        self.wal.close()


def replay(
    storage: StorageRoot,
    writer_of: Callable[[str], TopicWriter],
    *,
    skip: Callable[[str], bool] = lambda name: False,
) -> tuple[dict[str, int], dict[str, set[int]]]:
    """Write every write-ahead record under the root that its table does not hold yet (a gateway
    died between ack and flush), topic by topic in offset order; returns the rows written per
    topic, and the partitions (per topic) whose acked records are not all in the table yet (still
    leased by the gateway that wrote them, whose lease has not ended: replay again later; none:
    every record read is in its table now).
    `skip(name)`: a directory not to read (this process's own, and live gateways': they flush their
    own); the others are deleted once their tables hold all they held.

    Raises: StorageUnavailableError (the root cannot be read; nothing is deleted)."""

    def table_id(topic: str) -> str | None:
        try:
            return writer_of(topic).table_id()
        except TopicNotFoundError:
            return None  # (its records are dropped below)

    records, producers, dirs = collect(storage, skip=skip, table_id=table_id)
    written: dict[str, int] = {}
    pending: dict[str, set[int]] = {}
    for topic, tables in records.items():
        try:
            writer = writer_of(topic)
        except TopicNotFoundError:
            log.info("write-ahead replay: topic %s is gone; its records are dropped", topic)
            continue
        batch = latest_per_offset(tables)
        n = writer.commit_staged(batch, producers.get(topic, []), skip_leased=True)
        if n:
            written[topic] = n
            log.info("write-ahead replay: %d records of topic %s written", n, topic)
        if missing := writer.missing(batch):
            pending[topic] = missing
    if not pending and dirs:
        if storage.is_local:  # the tables' new files and log entries reach the disk before the logs go
            try:
                sync_filesystem(dirs[0])
            except OSError as exc:
                log.warning("write-ahead replay: syncing the root failed (%s); the logs are kept", exc)
                return written, pending
        for d in dirs:
            delete_dir(storage, d)
    return written, pending
