"""Topic writer: many append requests -> one Delta commit -> per-request offset ranges.

Concurrency contract
- One TopicWriter per topic per process, driven by one thread at a time (not thread-safe).
- Offsets: partition p's high watermark is the Delta app transaction `hw-<p>` (version = next
  offset). Every commit that appends to p also writes `hw-<p>`. delta-rs refuses a commit whose
  txn app id changed since this table object's read version (ConcurrentTransaction), so two
  writers (threads, processes, gateways) never hand out the same offset: the loser refreshes,
  re-assigns and retries, up to `max_commit_attempts`.
- The commit is planned on the version the high watermarks were read at; writing by URI would
  read a newer snapshot and silently duplicate offsets. They are read through a TransactionCache
  whose every value is the table's as of this writer's version (an older value would not be
  refused by the txn rule).
- On local disk the writer writes the commit's JSON entry itself (delta_log.table.log_entries:
  the first free version after its own, and only past versions whose commits wrote none of its
  txn app ids nor the table's metadata), and does not re-read the table object after it; on
  object storage, delta-rs's `create_write_transaction` commits, and the object is refreshed.
- Conflicts with concurrent DELETE/OPTIMIZE commits (jobs) are retried the same way.
- Idempotent producers: their state is kept in txns (delta_log.table.app_transactions); which
  requests of a flush to append is planned purely (delta_log.core.producer.plan_flush). A retried
  (producer, sequence) gets its original ranges and writes nothing.
- Table hygiene: a checkpoint every `delta.checkpointInterval` versions (delta-rs's post-commit hook,
  or, for the writer's own commits, the checkpoint thread); log cleanup, segment roll-up, retention
  and vacuum run in the topic's maintenance loop (delta_log.maintenance.topic_maintenance), never
  on the produce path; the table object is re-opened every `reopen_every_commits`.
- A commit is atomic (Delta log put-if-absent): a request is in it entirely or not at all. Data
  files written by a commit that then failed are orphans that vacuum removes later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from conf import WriterSettings
from delta_log.core.producer import ProducerSequence, plan_flush
from delta_log.core.records import (
    BATCH_SCHEMA,
    TOPIC_SCHEMA,
    PartitionRange,
    count_by_partition,
    group_by_partition,
    offsets_for_rows,
    partition_runs,
    plan_offsets,
)
from delta_log.errors import (
    CommitConflictError,
    OutOfOrderSequenceError,
    OwnerNotAvailableError,
    StorageUnavailableError,
    TopiclakeError,
    TopicNotFoundError,
    WriteAheadGapError,
)
from delta_log.log.wal import latest_per_offset, read_topic
from delta_log.table import log_entries
from delta_log.table.app_transactions import (
    Lease,
    TransactionCache,
    TxnSource,
    append_transactions,
    lease_app_id,
    lease_transactions,
    read_high_watermark,
    read_high_watermarks,
    read_lease,
    read_producer_state,
)
from delta_log.table.log_entries import (
    StaleVersionError,
    append_entry,
    checkpoint_interval,
    crosses_checkpoint,
    plain_protocol,
)
from delta_log.table.segment_files import ParquetOptions, remove_files, write_segments
from delta_log.table.storage import StorageRoot
from delta_log.table.time_travel import THROUGHPUT_BYTES, THROUGHPUT_RECORDS

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_NO_HOOK_CLEANUP = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)

_checkpoints: ThreadPoolExecutor | None = None
_checkpoints_lock = threading.Lock()


def _checkpoint_thread() -> ThreadPoolExecutor:
    """One thread checkpoints every topic written by its own commits (checkpoints are periodic,
    a few tens of ms each: they queue rather than take more cores from the writers)."""
    global _checkpoints
    with _checkpoints_lock:
        if _checkpoints is None:
            _checkpoints = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-checkpoint")
        return _checkpoints


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendRequest:
    """One all-or-nothing request: a normalized batch (BATCH_SCHEMA) and its producer, if idempotent.

    `partitions` (the batch's partition column as numpy) may be given by the caller so the single
    flusher thread does not have to compute it: per-request Arrow calls there wait on the GIL.
    """

    batch: pa.Table
    producer: ProducerSequence | None = None
    partitions: np.ndarray | None = None
    #: how the client compressed the records (Kafka's batches: none, gzip, snappy, lz4, zstd),
    #: kept with the segment file (segment_files.CODEC_KEY) for Fetch's compression.type=producer
    codec: str = "none"
    #: flushed without lingering for more requests (a committed transaction's records, which its
    #: producer's next transaction waits for)
    urgent: bool = False
    _partition_set: frozenset[int] | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def partition_array(self) -> np.ndarray:
        if self.partitions is not None:
            return self.partitions
        return np.asarray(self.batch.column("partition").to_numpy(), dtype=np.int32)

    def partition_set(self) -> frozenset[int]:
        """The partitions the request writes (worked out once: a `log` topic's writer thread asks
        before it parks, stages and unparks a request)."""
        if self._partition_set is None:
            object.__setattr__(self, "_partition_set", frozenset(np.unique(self.partition_array()).tolist()))
        assert self._partition_set is not None
        return self._partition_set


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResult:
    """Offsets assigned to one request, or the error that refused it alone."""

    ranges: tuple[PartitionRange, ...] = ()
    duplicate: bool = False
    error: TopiclakeError | None = None
    table_version: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitInfo:
    """What one successful commit appended (for tail caches and waiting fetches)."""

    topic: str
    table_version: int
    records: pa.Table  # TOPIC_SCHEMA, sorted by (partition, offset)
    high_watermarks: dict[int, int]
    codecs: Mapping[int, str] = dataclasses.field(default_factory=dict)  # partition -> its producers' codec


class TopicWriter:
    """Appends record batches to one topic table."""

    def __init__(
        self,
        storage: StorageRoot,
        topic: str,
        settings: WriterSettings,
        *,
        on_commit: Callable[[CommitInfo], None] | None = None,
        gone_holders: Callable[[], Collection[int]] = frozenset,
    ) -> None:
        self.storage = storage
        self.topic = topic
        self.settings = settings
        self.on_commit = on_commit
        #: write-ahead lease holders known to have died (their processes ended): their leases bind
        #: no one, so their partitions are replayed and taken over at once, not when the leases end
        self.gone_holders = gone_holders
        self.uri = storage.topic_uri(topic)
        self._parquet_options = ParquetOptions.of(settings)
        self._commits_since_open = 0
        self.commits = 0
        self.conflicts = 0
        #: seconds spent per phase of a flush (for /metrics: where the time goes)
        self.phase_seconds: dict[str, float] = dict.fromkeys(
            ("check", "assemble", "parquet", "commit", "refresh", "listeners"), 0.0
        )
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_pending = self._checkpoint_again = False
        self._checkpoints_stopped = False
        self._checkpoint_dt: DeltaTable | None = None  # the checkpoint thread's
        self._dt = self._open()
        # The table version this writer has read or committed. Commits it writes itself (on local
        # disk: delta_log.table.log_entries) move it without re-reading the table object, which
        # then trails it until the next refresh: `table` refreshes it for other readers.
        self._version = self._dt.version()
        # High watermarks and producer state as of self._version, kept across this writer's own
        # commits (and, on local disk, other writers' commits, from their log entries).
        self._txns = TransactionCache(
            lambda: self._dt,
            (lambda versions: storage.read_log_entries(self.uri, versions)) if storage.is_local else None,
            version=lambda: self._version,
            sync=self.refresh,
        )

    def _open(self) -> DeltaTable:
        dt = self.storage.open_topic(self.topic)
        self._checkpoint_interval = checkpoint_interval(dt)
        self._version = self._planned = dt.version()
        self._checkpoint_base, self._checkpoint_at = self._version, float("-inf")
        return dt

    @property
    def table(self) -> DeltaTable:
        """The table object, as of at least every commit this writer made."""
        if self._dt.version() < self._version:
            self.refresh()
        return self._dt

    def table_id(self) -> str:
        """The id of the topic's Delta table (another, once the topic is deleted and made again)."""
        return str(self.table.metadata().id)

    def refresh(self) -> None:
        """Bring the table object to the latest version."""
        try:
            self._dt.update_incremental()
        except TableNotFoundError as exc:
            raise TopicNotFoundError(self.topic) from exc
        except (DeltaError, OSError) as exc:
            raise StorageUnavailableError(f"Storage is unavailable: {exc}") from exc
        self._version = self._dt.version()

    def high_watermark(self, partition: int) -> int:
        """Next offset to assign in `partition`, as of this writer's table version."""
        return read_high_watermark(self._txns, partition)

    def append(self, batch: pa.Table, producer: ProducerSequence | None = None) -> AppendResult:
        """Append one request; raise its error instead of returning it."""
        result = self.append_many([AppendRequest(batch=batch, producer=producer)])[0]
        if result.error is not None:
            raise result.error
        return result

    def append_many(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """Append every request in ONE Delta commit, one data file per touched partition.

        Requests refused on their own (a duplicate sequence) carry `error`; the others commit.

        Raises:
            CommitConflictError: other writers won `max_commit_attempts` times in a row.
            StorageUnavailableError: the storage root cannot be read or written.
            TopicNotFoundError: the topic table is gone.
        """
        for req in requests:
            if req.batch.schema != BATCH_SCHEMA:
                raise TypeError("AppendRequest.batch must be normalized (records.normalize_batch)")
        return self._retrying(lambda: self._attempt(requests))

    def _retrying(self, attempt: Callable[[], _T]) -> _T:
        """Run `attempt` (one commit) until no other writer won its version, refreshing between.

        Raises: CommitConflictError (other writers won `max_commit_attempts` times in a row),
        StorageUnavailableError, TopicNotFoundError, and what `attempt` raises."""
        attempts = self.settings.max_commit_attempts
        for n in range(attempts):
            self._t = time.perf_counter()
            self._planned = self._version  # what the attempt plans on (checked by _commit)
            try:
                return attempt()
            except StaleVersionError as exc:  # its version left the log (cleaned up; the table made again)
                self.conflicts += 1
                log.info("table of %s read again: %s", self.topic, exc)
                self._dt = self._open()
            except CommitFailedError as exc:
                self.conflicts += 1
                log.debug("commit conflict on %s (attempt %d): %s", self.topic, n + 1, exc)
                try:
                    self.refresh()
                except TopiclakeError:  # an object that cannot follow the log any more: open it anew
                    self._dt = self._open()
                time.sleep(random.uniform(0, min(0.002 * 2**n, 0.05)))
            except TableNotFoundError as exc:
                raise TopicNotFoundError(self.topic) from exc
            except (DeltaError, OSError) as exc:
                # The commit outcome may be unknown; re-read so the next attempt starts fresh.
                self._dt = self._reopen_quietly()
                raise StorageUnavailableError(f"Storage is unavailable: {exc}") from exc
        raise CommitConflictError(
            f"Gave up after {attempts} conflicting commits on topic {self.topic!r}.", topic=self.topic
        )

    def _reopen_quietly(self) -> DeltaTable:
        try:
            return self._open()
        except TopiclakeError:
            return self._dt

    def _attempt(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        staged = stage(requests, self._txns, self.topic, tick=self._tick)
        if any(isinstance(r.error, OutOfOrderSequenceError) for r in staged.results):
            # a gap may be this object's lag, not the producer's: another gateway may have
            # appended the batches in between (it led the partition before). Appends are checked
            # at commit (the txn rule); a refusal is not, so it is decided on the newest version.
            self.refresh()
            self._planned = self._version
            staged = stage(requests, self._txns, self.topic, tick=self._tick)
        if staged.records is None:
            return staged.results
        # one clock reading for both lease decisions below: a lease that ends between them was
        # neither lapsed (replayed) nor held (refused), and its holder's acks were appended over
        now_ms = int(time.time() * 1000)
        lapsed = self._lapsed_leases(staged.high_watermarks, now_ms)
        if lapsed:  # the dead holder's acks first; then the offsets (and duplicates) are planned again
            self.replay_write_ahead()
            self._planned = self._version
            staged = stage(requests, self._txns, self.topic, tick=self._tick)
            if staged.records is None:
                return staged.results
        self._refuse_leased(staged.high_watermarks, holder=None, now_ms=now_ms)
        txns = append_transactions(staged.high_watermarks, staged.producer_ranges)
        self._commit(staged.records, txns + [Transaction(lease_app_id(p), 0) for p in lapsed], staged.codecs)
        version = self._version
        self._after_commit(
            CommitInfo(
                topic=self.topic,
                table_version=version,
                records=staged.records,
                high_watermarks=staged.high_watermarks,
                codecs=staged.codecs,
            )
        )
        return [dataclasses.replace(r, table_version=version) if r.error is None else r for r in staged.results]

    def _lapsed_leases(self, partitions: Iterable[int], now_ms: int) -> list[int]:
        """Which of `partitions` have a write-ahead lease that lapsed (by `now_ms`) instead of being
        ended: their holder died (or stalled) and its log may hold acked records the table lacks."""
        leases = [(p, read_lease(self._txns, p)) for p in partitions]
        gone = self.gone_holders()
        return [p for p, lease in leases if lease is not None and lease.lapsed(now_ms, gone)]

    def replay_write_ahead(self, *, skip: Callable[[str], bool] = lambda name: False) -> int:
        """Write the records of this topic in the write-ahead logs under the root (but the
        directories `skip` names) that the table does not hold; returns how many. Partitions another
        gateway holds the lease of are left to it. Before the table path appends to a partition of
        a `log` topic whose holder died, so no acked record is overwritten by a new offset."""
        tables, producers = read_topic(self.storage, self.topic, skip=skip, table_id=self.table_id())
        if not tables:
            return 0
        n = self.commit_staged(latest_per_offset(tables), producers, skip_leased=True)
        if n:
            log.info("write-ahead replay: %d records of topic %s written", n, self.topic)
        return n

    def _refuse_leased(self, partitions: Iterable[int], holder: int | None, now_ms: int | None = None) -> None:
        """Raises: OwnerNotAvailableError if another gateway holds a write-ahead lease on one of
        `partitions` (a `log` topic's partition is appended to by its lease holder alone), as of
        `now_ms` (default: now)."""
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        if held := self._leases_of_others(partitions, -1 if holder is None else holder, now_ms):
            p, lease = held[0]
            raise OwnerNotAvailableError(
                f"Partition {p} of topic {self.topic!r} is written through another gateway's write-ahead log "
                f"for {(lease.expires_ms - now_ms) / 1000:.1f} s more; retry through its owner.",
                topic=self.topic,
                partition=p,
            )

    def leased_by_others(self, partitions: Iterable[int], holder: int) -> set[int]:
        """Which of `partitions` another gateway holds the write-ahead lease of (as of a refresh)."""
        self.refresh()
        return {p for p, _ in self._leases_of_others(partitions, holder, int(time.time() * 1000))}

    def _leases_of_others(self, partitions: Iterable[int], holder: int, now_ms: int) -> list[tuple[int, Lease]]:
        """The partitions of `partitions` whose write-ahead lease a holder other than `holder` has
        at `now_ms`, with that lease: the one rule a claim's check and an append's refusal share."""
        gone = self.gone_holders()
        return [
            (p, lease)
            for p in partitions
            if (lease := read_lease(self._txns, p)) and lease.held_by_other(holder, now_ms, gone)
        ]

    def missing(self, records: pa.Table) -> set[int]:
        """The partitions of `records` (sorted by partition then offset) with offsets the table (as
        this writer last read it) does not hold."""
        if not records.num_rows:
            return set()
        parts, offsets = records.column("partition").to_numpy(), records.column("offset").to_numpy()
        hws = read_high_watermarks(self._txns, partitions_of(records))
        return {int(p) for i, p in _last_of_each(parts) if hws[p] <= int(offsets[i])}

    def _without_leased(self, records: pa.Table, partitions: list[int]) -> pa.Table:
        now_ms = int(time.time() * 1000)
        gone = self.gone_holders()
        leased = [p for p in partitions if (lease := read_lease(self._txns, p)) and lease.held(now_ms, gone)]
        if not leased:
            return records
        keep = pc.invert(pc.is_in(records.column("partition"), pa.array(leased, pa.int32())))
        return records.filter(keep)

    def claim(self, partitions: Sequence[int], holder: int, expires_ms: int) -> dict[int, int]:
        """Take (or renew) the write-ahead lease of `partitions` for `holder` until `expires_ms`
        (wall clock): one commit of the leases with the partitions' high watermarks, so it refuses,
        and is refused by, any concurrent append. Returns the high watermarks it holds from.

        Raises: OwnerNotAvailableError (another holder's lease has not ended), CommitConflictError,
        StorageUnavailableError, TopicNotFoundError."""

        def attempt() -> dict[int, int]:
            self._refuse_leased(partitions, holder)
            hws = read_high_watermarks(self._txns, partitions)
            txns = append_transactions(hws) + lease_transactions(partitions, holder, expires_ms)
            self._commit(TOPIC_SCHEMA.empty_table(), txns)
            return hws

        self.refresh()  # a claim decides on the newest leases
        return self._retrying(attempt)

    def commit_staged(
        self,
        records: pa.Table,
        producers: Sequence[tuple[ProducerSequence, int, int]] = (),
        *,
        lease: tuple[int, int] | None = None,
        skip_leased: bool = False,
        codecs: Mapping[int, str] | None = None,
    ) -> int:
        """Commit records whose offsets were assigned before (by a write-ahead log, which acked
        them), in ONE commit with their high watermarks and producers' txns; returns how many rows
        were new. Rows the table already holds (a flush replayed after a crash) are dropped with
        their producers' entries, so each record is written exactly once and no producer's state
        goes back; the rest must continue each partition's high watermark.

        `records`: TOPIC_SCHEMA sorted by (partition, offset); `producers`: (producer, partition,
        base offset) in the order they were acked; `lease`: (holder, expires_ms) renewed with the
        commit (the holder's flush); `skip_leased`: leave out the partitions another gateway holds
        the lease of instead of refusing (a replay: that gateway is alive and flushes them itself);
        `codecs`: partition -> its producers' codec (kept in the file's metadata).

        Raises: OwnerNotAvailableError (another gateway holds a partition's lease), WriteAheadGapError
        (records missing before these), CommitConflictError, StorageUnavailableError,
        TopicNotFoundError.
        """

        def attempt() -> int:
            rows, partitions = records, partitions_of(records)
            if skip_leased:
                rows = self._without_leased(rows, partitions)
                partitions = partitions_of(rows)
            self._refuse_leased(partitions, None if lease is None else lease[0])
            hws = read_high_watermarks(self._txns, partitions)
            fresh = _unflushed(rows, hws, self.topic)
            if fresh.num_rows == 0:
                return 0
            parts, offsets = fresh.column("partition").to_numpy(), fresh.column("offset").to_numpy()
            ends = {int(p): int(offsets[i]) + 1 for i, p in _last_of_each(parts)}
            kept = [(pr, p, base) for pr, p, base in producers if base >= hws.get(p, 0)]
            txns = append_transactions(ends, kept)
            if lease is not None:
                txns += lease_transactions(partitions, *lease)
            self._commit(fresh, txns, codecs)
            self._after_commit(
                CommitInfo(
                    topic=self.topic,
                    table_version=self._version,
                    records=fresh,
                    high_watermarks=ends,
                    codecs=codecs or {},
                )
            )
            return fresh.num_rows

        return self._retrying(attempt)

    @property
    def transactions(self) -> TxnSource:
        """The partitions' high watermarks and producer states as of this writer's table version
        (single-threaded, as the writer)."""
        return self._txns

    def _commit(self, records: pa.Table, txns: list[Transaction], codecs: Mapping[int, str] | None = None) -> None:
        """Write one parquet file per partition, then commit their add actions and `txns` at once;
        `codecs`: partition -> its producers' codec, kept in the file's metadata.

        We write the files with pyarrow and commit their log entry ourselves on local disk
        (delta_log.table.log_entries), elsewhere through `create_write_transaction`: measured against
        `write_deltalake`, commit latency stays flat as the table grows (see bench/log_bench).
        On failure the files just written are deleted (best effort; vacuum catches the rest).
        """
        read_version = self._version
        if read_version != self._planned:
            # the txn cache re-read the table while this attempt planned (it started over): values
            # read before that are of an older version than the one this commit would check after
            raise CommitFailedError(f"Planned on version {self._planned}, now at {read_version}: planning again.")
        own = self.settings.own_log_entries and self.storage.is_local and plain_protocol(self._dt)
        if not own and self._dt.version() != read_version:  # planned on versions it has not read: plan again
            raise CommitFailedError("The table object trails this writer's version.")
        files = write_segments(self.storage, self.uri, records, self._parquet_options, codecs=codecs or {})
        self._tick("parquet")
        # the records and bytes each commit appended, in its commitInfo: a topic's throughput over
        # time is then its Delta history (GET /topics/{t}/throughput)
        custom = {THROUGHPUT_RECORDS: str(records.num_rows), THROUGHPUT_BYTES: str(sum(f.action.size for f in files))}
        adds: list[AddAction | RemoveAction] = [f.action for f in files]
        try:
            if own:  # the JSON entry ourselves (delta_log.table.log_entries): a tenth of delta-rs's time
                entry = append_entry(adds, txns, custom, partition_by=["partition"])
                version = log_entries.commit(
                    f"{self.storage.fs_path(self.uri)}/_delta_log",
                    read_version,
                    entry,
                    frozenset(t.app_id for t in txns),
                )
            else:
                self._dt.create_write_transaction(
                    adds,
                    "append",
                    TOPIC_SCHEMA,
                    partition_by=["partition"],
                    commit_properties=CommitProperties(app_transactions=txns, custom_metadata=custom),
                    post_commithook_properties=_NO_HOOK_CLEANUP,
                )
        except BaseException:
            remove_files(self.storage, self.uri, [f.relative_path for f in files])
            raise
        self._tick("commit")
        if own:
            # The table object is not re-read (measured: 3-6 ms a commit, more as the table grows);
            # the txn cache learns this commit's txns, and any in between from their entries.
            self._version = version
            # every `delta.checkpointInterval` versions, as delta-rs's post-commit hook would, but at
            # most every `checkpoint_min_interval_s`
            now = time.monotonic()
            if (
                crosses_checkpoint(self._checkpoint_base, version, self._checkpoint_interval)
                and now - self._checkpoint_at >= self.settings.checkpoint_min_interval_s
            ):
                self._checkpoint_base, self._checkpoint_at = version, now
                self._request_checkpoint()
        else:
            # create_write_transaction does not advance the table object; the next read of the high
            # watermarks must see this commit, or it would conflict with itself.
            self.refresh()
        self._txns.committed(read_version, self._version, txns)
        self._tick("refresh")

    def _request_checkpoint(self) -> None:
        """A checkpoint, on the checkpoint thread: off the commit path (measured in a gateway: the
        refresh and checkpoint of every 10th commit took ~60 ms, the p99 of every ack behind it).
        One per writer at a time: asked for while one runs, another follows it (of the version
        then latest)."""
        with self._checkpoint_lock:
            if self._checkpoints_stopped:
                return
            if self._checkpoint_pending:
                self._checkpoint_again = True
                return
            self._checkpoint_pending = True
        try:
            _checkpoint_thread().submit(self._checkpoint)
        except RuntimeError:  # the interpreter is shutting down
            self._checkpoint_pending = False

    def _checkpoint(self) -> None:
        """Checkpoint the table's latest version through a table object of the checkpoint thread's
        own (readers then replay the log from it). A failure leaves every commit valid."""
        try:
            if self._checkpoints_stopped:
                return
            if self._checkpoint_dt is None:
                self._checkpoint_dt = self.storage.open_topic(self.topic)
            else:
                self._checkpoint_dt.update_incremental()
            self._checkpoint_dt.create_checkpoint()
        except Exception as exc:  # a thread of its own: nothing may escape into a forgotten future
            self._checkpoint_dt = None
            log.warning("checkpoint of %s failed (the next interval's covers it): %s", self.topic, exc)
        finally:
            with self._checkpoint_lock:
                self._checkpoint_pending = again = self._checkpoint_again and not self._checkpoints_stopped
                self._checkpoint_again = False
            if again:
                try:
                    _checkpoint_thread().submit(self._checkpoint)
                except RuntimeError:
                    self._checkpoint_pending = False

    def stop_checkpoints(self, timeout: float = 30.0) -> None:
        """No more checkpoints of this writer's commits; returns once one queued or running is
        over (the checkpoint thread runs them in order). Before the table is deleted: a checkpoint
        written after it would bring back a `_delta_log` that a topic made again under the name
        would read as its own."""
        with self._checkpoint_lock:
            self._checkpoints_stopped = True
            pending = self._checkpoint_pending
        if pending:
            # RuntimeError: the interpreter is shutting down; TimeoutError: one stuck on storage
            with contextlib.suppress(RuntimeError, TimeoutError):
                _checkpoint_thread().submit(lambda: None).result(timeout)

    def _tick(self, phase: str) -> None:
        now = time.perf_counter()
        self.phase_seconds[phase] += now - self._t
        self._t = now

    def _after_commit(self, info: CommitInfo) -> None:
        self.commits += 1
        self._commits_since_open += 1
        if self.on_commit is not None:
            try:
                self.on_commit(info)
            except Exception:  # a listener must never fail an acked commit
                log.exception("on_commit listener failed for %s", self.topic)
        self._tick("listeners")
        if self._commits_since_open >= self.settings.reopen_every_commits:
            self._commits_since_open = 0
            self._dt = self._reopen_quietly()


@dataclass(frozen=True, slots=True, kw_only=True)
class Staged:
    """Requests planned for one write: each request's answer, and what to write for them."""

    results: list[AppendResult]
    records: pa.Table | None  # TOPIC_SCHEMA, sorted by (partition, offset); None: nothing to write
    high_watermarks: dict[int, int]  # the touched partitions' new high watermarks
    producer_ranges: list[tuple[ProducerSequence, int, int]]  # (producer, partition, base offset)
    #: partition -> the codec of its last request written (its producers' codec; segment_files.CODEC_KEY)
    codecs: dict[int, str] = dataclasses.field(default_factory=dict)


def stage(
    requests: Sequence[AppendRequest],
    txns: TxnSource,
    topic: str,
    *,
    tick: Callable[[str], None] = lambda phase: None,
) -> Staged:
    """Plan the requests of one write against the partitions' high watermarks and producer states
    in `txns`: which are retries or refused (delta_log.core.producer.plan_flush), the offsets of
    the rest, and their records in TOPIC_SCHEMA. Nothing is written."""
    arrays = [req.partition_array() for req in requests]
    counts = [count_by_partition(a) for a in arrays]
    producers = [req.producer for req in requests]
    state = {
        (pr.producer_id, p): st
        for pr, part_counts in zip(producers, counts, strict=True)
        if pr is not None
        for p in part_counts
        if (st := read_producer_state(txns, pr.producer_id, p)) is not None
    }
    plan = plan_flush(producers, counts, state)
    results: dict[int, AppendResult] = {i: AppendResult(error=err) for i, err in plan.refused.items()}
    results.update({i: AppendResult(ranges=r, duplicate=True) for i, r in plan.committed.items()})
    tick("check")
    pending = list(plan.append)
    records = None
    new_hws: dict[int, int] = {}
    producer_ranges: list[tuple[ProducerSequence, int, int]] = []
    if pending:
        touched = sorted({p for i in pending for p in counts[i]})
        hws = read_high_watermarks(txns, touched)
        plans, new_hws = plan_offsets([counts[i] for i in pending], hws)
        records = _assemble([requests[i].batch for i in pending], [arrays[i] for i in pending], hws, topic)
        tick("assemble")
        producer_ranges = [
            (pr, r.partition, r.base_offset)
            for i, ranges in zip(pending, plans, strict=True)
            if (pr := producers[i]) is not None
            for r in ranges
        ]
        for i, ranges in zip(pending, plans, strict=True):
            results[i] = AppendResult(ranges=tuple(ranges))
    codecs = {p: requests[i].codec for i in pending for p in counts[i]}
    for i, first in plan.same_as.items():  # in-flush retries share their first copy's result
        results[i] = AppendResult(ranges=results[first].ranges, duplicate=True)
    return Staged(
        results=[results[i] for i in range(len(requests))],
        records=records,
        high_watermarks=new_hws,
        producer_ranges=producer_ranges,
        codecs=codecs,
    )


def _last_of_each(parts: np.ndarray) -> list[tuple[int, int]]:
    """(index, partition) of the last row of each run of `parts` (sorted)."""
    return [(e - 1, p) for p, _, e in partition_runs(parts)]


def partitions_of(records: pa.Table) -> list[int]:
    """The partitions `records` (TOPIC_SCHEMA) hold rows of, ascending."""
    return sorted(set(np.unique(records.column("partition").to_numpy()).tolist())) if records.num_rows else []


def _unflushed(records: pa.Table, high_watermarks: dict[int, int], topic: str) -> pa.Table:
    """The rows of `records` (sorted by partition, offset) at or past each partition's high
    watermark, which they must continue without a gap. Raises: WriteAheadGapError."""
    if not records.num_rows:
        return records
    parts = records.column("partition").to_numpy()
    offsets = records.column("offset").to_numpy()
    keep = offsets >= np.vectorize(high_watermarks.__getitem__, otypes=[np.int64])(parts)
    fresh = records.filter(pa.array(keep)) if not keep.all() else records
    if fresh.num_rows:
        fp, fo = fresh.column("partition").to_numpy(), fresh.column("offset").to_numpy()
        for p, s, _ in partition_runs(fp):
            first = int(fo[s])
            if first != high_watermarks[p]:
                raise WriteAheadGapError(
                    f"Topic {topic!r} partition {p}: the table ends at offset {high_watermarks[p]} but the "
                    f"write-ahead records to flush start at {first}.",
                    topic=topic,
                    partition=p,
                )
    return fresh


def _assemble(batches: list[pa.Table], partitions: list[np.ndarray], hws: dict[int, int], topic: str) -> pa.Table:
    """All requests' records in TOPIC_SCHEMA, sorted by (partition, offset): offsets from numpy,
    rows grouped by partition as `group_by_partition` finds cheaper (slices of large runs, one
    `take` of many small ones; nothing reordered when the rows are grouped already)."""
    parts = np.concatenate(partitions) if len(partitions) > 1 else partitions[0]
    order, offsets = offsets_for_rows(parts, hws)
    return _to_topic_table(group_by_partition(pa.concat_tables(batches), parts, order), offsets, topic)


def _to_topic_table(batch: pa.Table, offsets: np.ndarray, topic: str) -> pa.Table:
    n = batch.num_rows
    return pa.table(
        [
            batch.column("key"),
            batch.column("value"),
            # (measured: 5 against 38 us for 10 rows, 0.35 against 0.85 ms for 100,000, than a
            # dictionary array cast to strings)
            pa.repeat(pa.scalar(topic, pa.string()), n),
            batch.column("partition"),
            pa.array(offsets, pa.int64()),
            batch.column("timestamp"),
            batch.column("timestampType"),
            batch.column("headers"),
        ],
        schema=TOPIC_SCHEMA,
    )
