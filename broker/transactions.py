"""Transaction coordinator: Kafka's transactions (InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, transactional Produce), one
coordinator per transactional id, for every face.

How a transaction maps onto the lakehouse (docs/DESIGN.md, "Transactions"):
- A transactional producer's records are staged, durably, outside the topic tables
  (delta_log.system.transactions.TransactionStaging) and acked without an offset (-1, as Kafka
  answers acks=0): no table reader, Kafka consumer, Spark or SQL can see them.
- An open transaction is not saved to `_system/transactions`: its producer's staging is its
  durable record (its writes' files, and a small file for each AddPartitionsToTxn and
  AddOffsetsToTxn), so a transaction costs one save, its decision.
- EndTxn(commit) saves the decision (PrepareCommit, with the list of staged files) to
  `_system/transactions`, then lands the records: one append per topic, so all of a topic's
  partitions land in one Delta commit, each topic's append idempotent under the producer's
  transaction number (a roll-forward never writes twice); then the group offsets of
  TxnOffsetCommit, in one commit equally idempotent; then drops the staging and saves
  CompleteCommit. HTTP's commit is answered after that (a committed transaction is readable when
  its producer returns); Kafka's EndTxn once the decision is saved, as Kafka's coordinator answers
  after PrepareCommit.
- Decisions are carried out in order behind the producer, which begins and decides its next
  transactions while the last lands (up to MAX_QUEUED): a decided transaction's staging is set
  apart (sealed under its number, on local disk; under transaction version 2 each has its own
  epoch anyway), and a producer whose next transaction would stage where an unsealed one lies
  (version 1 or HTTP, on an object store) waits for that landing. Decisions queued meanwhile land
  together, one Delta commit a topic under the last one's number; under load an id's next landing
  waits a little after its last (`_gap`: `transactions.max_landing_gap_ms` while a consumer waits
  on this gateway for its topics, `transactions.unwatched_landing_gap_ms` while none does), unless
  a request waits for it, so that more land together. Every save of the id carries the decisions
  not carried out yet, so a takeover finishes them all.
- EndTxn(abort), a timeout, or a new producer of the id fencing an open transaction: PrepareAbort
  is saved, the staging dropped, CompleteAbort saved. Nothing of it ever reached a table.
- A gateway that starts, or takes an id over (a failover), reads the id's last saved state and
  finishes the decision it finds (a PrepareCommit is rolled forward, a PrepareAbort dropped), then
  resumes the open transaction the current producer's staging holds (its producer goes on; its
  timeout runs from its first staged file, and it is aborted when that passes). So memory never
  decides an outcome.
- So offsets are assigned when a transaction commits: its records follow every record committed
  before, the topic's last stable offset is its high watermark, and read_committed and
  read_uncommitted read the same (committed) records.

Coordinator placement and fencing follow the groups' (broker.coordinator): the gateway that owns
`transaction:<id>` (broker.cluster) coordinates it, claims its coordinator epoch on first use, and
every save carries that epoch (delta_log.system.transactions).

Runs on the server's event loop; each id's operations hold its lock; Delta and file I/O go to
worker threads. Open transactions' timeouts are timers on the loop (no polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from broker.coordinator import GroupCoordinator
from broker.groups import owner_of
from conf import TransactionSettings
from delta_log.core import transactions as rules
from delta_log.core.acl import Principal, authorize, authorize_group, authorize_transactional_id, refusal
from delta_log.core.producer import ProducerSequence
from delta_log.core.transactions import Txn
from delta_log.errors import (
    CoordinatorNotAvailableError,
    DuplicateSequenceError,
    InvalidTxnStateError,
    NotCoordinatorError,
    PartitionNotFoundError,
    TopiclakeError,
    TopicNotFoundError,
    TransactionalIdNotFoundError,
)
from delta_log.log.group_commit import GAP_FACTOR
from delta_log.log.writer import AppendRequest, AppendResult
from delta_log.registry import TopicRegistry
from delta_log.system.offsets import OffsetCommit as OffsetCommit
from delta_log.system.transactions import (
    Staged,
    StagedOffsets,
    StagedRecords,
    TransactionStaging,
    TransactionStore,
)

log = logging.getLogger(__name__)

#: saves between two rewrites of `_system/transactions` to its latest row per id
COMPACT_EVERY = 256
#: implicit adds made at other gateways remembered (so each is asked once a transaction)
ADDED_ELSEWHERE_KEPT = 100_000
#: decisions of one id carried out together, at most (one Delta commit a topic). Measured (Java's
#: producer, 100 records a transaction, a server alone): 16 against 8, 17,600-18,300 -> 18,900-19,300
#: records/s and 5.2-5.6 -> 4.8-4.9 ms of CPU a transaction (fewer, larger landings and roll-ups)
MAX_LANDINGS = 16
#: staged bytes carried out together, at most, beyond the first decision (a landing reads its
#: transactions' records into memory at once)
MAX_LANDING_BYTES = 64 * 1024 * 1024
#: decisions of one id saved and not yet carried out, at most: its producer's next transaction
#: goes on while they land, and waits beyond this many. Twice MAX_LANDINGS, so that a producer
#: goes on deciding while a full batch lands: at the batch's size (8 then), every eighth
#: transaction of a busy producer waited for a landing (measured: Produce p90 9.3 ms against a p50
#: of 1.8)
MAX_QUEUED = 2 * MAX_LANDINGS
#: lands one topic's records (ProduceService.append): the Delta commit that holds them, or its error
Land = Callable[[str, AppendRequest], Awaitable[AppendResult]]
#: writes committed transactions' group offsets, every group's in one commit
#: (GroupCoordinator.commit_transactional), naming the last transaction (the Delta app
#: transaction its records landed under), which makes it idempotent
CommitOffsets = Callable[[Mapping[str, list[OffsetCommit]], tuple[str, int]], Awaitable[None]]
#: adds partitions and groups to a transaction at its coordinator, another gateway, for a client
#: this one authenticated: (principal, id, producer id, epoch, partitions, groups); raises the
#: coordinator's refusal
RemoteAdd = Callable[[Principal, str, int, int, Sequence[tuple[str, int]], Sequence[str]], Awaitable[None]]


def landing_producer(producer_id: int) -> str:
    """The producer name a transaction's records land under in the topic tables: the table keeps
    the last transaction number landed per partition, so landing a transaction again writes
    nothing (delta_log.core.producer)."""
    return f"t{producer_id}"


@dataclass(eq=False, slots=True)
class _Landing:
    """A decision saved and being carried out: `txn` (PrepareCommit or PrepareAbort) and what it
    lands (the `decision` saved with it). `done` resolves once it is carried out, or fails with an
    attempt's error (a fresh future then waits for the next attempt). `alone`: found in a saved
    row (a takeover), so landed by itself, since part of it may have landed before.
    `awaited`: a request waits for it, so it lands without a gap (TransactionCoordinator._gap).
    `size`: its staged records' bytes, where known (0: not)."""

    txn: Txn
    decision: Mapping[str, Any]
    done: asyncio.Future[None]
    alone: bool = False
    awaited: bool = False
    size: int = 0

    @property
    def topics(self) -> Iterable[str]:
        """The topics it lands records in."""
        return (str(r[0]) for r in self.decision.get("records", ()))

    @property
    def staged(self) -> tuple[int, int]:
        """The (producer id, epoch) its records and offsets were staged under (epoch -1: none)."""
        return int(self.decision.get("producer_id", self.txn.producer_id)), int(self.decision.get("staged_epoch", -1))

    @property
    def sealed(self) -> int | None:
        """Where its staging was set apart (TransactionStaging.seal): None, still where it was staged."""
        sealed = self.decision.get("sealed")
        return None if sealed is None else int(sealed)

    @property
    def pending_key(self) -> tuple[str, int, int, int | None]:
        return (self.txn.transactional_id, *self.staged, self.sealed)

    def saved(self) -> dict[str, Any]:
        return {"txn": self.txn.snapshot(), "decision": dict(self.decision)}


def _settle(future: asyncio.Future[None], error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
        future.exception()  # retrieved: a landing nobody waits for is not an error to report


@dataclass(frozen=True, slots=True)
class TxnBatch:
    """Who wrote a transactional request, as its face decoded it: the producer id and epoch the
    coordinator gave, the request's sequence (Kafka: its batches' first; HTTP: Producer-Sequence),
    and the lane it belongs to (HTTP: Producer-Id; Kafka: "", one lane a partition)."""

    producer_id: int
    producer_epoch: int
    sequence: int
    lane: str = ""


@dataclass(frozen=True, slots=True)
class TxnProduce:
    """A transactional produce unit: which transaction its records belong to. `implicit`: its
    partitions join the transaction as it writes them (HTTP; Kafka's Produce v12+, transaction
    version 2); else the client added them first (AddPartitionsToTxn) and is checked against them."""

    transactional_id: str
    batch: TxnBatch
    implicit: bool = False
    #: who writes (an implicit add at another gateway's coordinator acts for them)
    principal: Principal | None = None
    #: the producer's epoch bumps at every EndTxn (transaction version 2): its (producer id,
    #: epoch) names one transaction
    epoch_per_transaction: bool = False

    @property
    def producer_id(self) -> int:
        return self.batch.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.batch.producer_epoch


class TransactionCoordinator:
    def __init__(
        self,
        registry: TopicRegistry,
        settings: TransactionSettings,
        *,
        land: Land,
        commit_offsets: CommitOffsets,
        owns: Callable[[str], bool] | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.land = land
        self.commit_offsets = commit_offsets
        self.clock_ms = clock_ms
        #: which ids this gateway coordinates (all on a single gateway)
        self.owns: Callable[[str], bool] = owns or (lambda tid: True)
        #: a cluster's way to the coordinator of an id coordinated elsewhere (set once it joined)
        self.remote_add: RemoteAdd | None = None
        #: whether a consumer waits on this gateway for new records of a topic
        #: (CommitNotifier.watched; without one, as if always: the shorter landing gap)
        self.watched: Callable[[str], bool] = lambda topic: True
        #: (id, producer id, epoch, partition or group) added at another gateway's coordinator
        self._added_elsewhere: set[tuple[str, int, int, tuple[str, int] | str]] = set()
        self._store: TransactionStore | None = None
        self._staging: TransactionStaging | None = None
        #: the state of each id coordinated here, as last saved
        self._txns: dict[str, Txn] = {}
        #: coordinator epoch held per id (loaded and claimed); absent: not taken over yet
        self._epochs: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        #: group -> (id, producer id, epoch, sealed number or None) -> partitions with offsets
        #: staged by transactions coordinated here, until they land or are dropped
        self._pending_offsets: dict[str, dict[tuple[str, int, int, int | None], set[tuple[str, int]]]] = {}
        self._background: set[asyncio.Future[Any]] = set()
        #: each id's saved decisions not carried out yet, in the order they were taken
        self._landings: dict[str, list[_Landing]] = {}
        #: the task carrying out an id's `_landings`
        self._landers: dict[str, asyncio.Future[Any]] = {}
        #: an id's lander waiting out the gap after a landing (`_gap`), woken to look again when a
        #: decision is queued or a consumer begins to wait (`_recheck`), and ended by a request
        #: that waits for a landing (`_hurry`)
        self._gap_waits: dict[str, asyncio.Future[None]] = {}
        self._saves = 0
        #: every id's state as read at start (what ListTransactions lists before an id is used)
        self._listed: dict[str, Txn] = {}

    # -- lifecycle --------------------------------------------------------------------------------
    def _open(self) -> tuple[TransactionStore, TransactionStaging]:
        if self._store is None or self._staging is None:
            self._store = TransactionStore(self.registry.storage)
            self._staging = TransactionStaging(self.registry.storage)
        return self._store, self._staging

    async def _opened(self) -> tuple[TransactionStore, TransactionStaging]:
        """`_open`, on a worker thread the first time (it reads the state table)."""
        if self._store is not None and self._staging is not None:
            return self._store, self._staging
        return await asyncio.to_thread(self._open)

    async def start(self) -> None:
        """Take over every id this gateway coordinates that has a decision to finish or an open
        transaction (kept in its producer's staging: `_add`); its timeout then runs from its start,
        not from now."""
        store, staging = await self._opened()
        saved = await asyncio.to_thread(store.load)
        staged = await asyncio.to_thread(staging.unsealed)  # open transactions' (`_add`)
        self._listed = {tid: s.txn for tid, s in saved.items()}
        for tid, s in saved.items():
            begun = staging.name(tid, s.txn.producer_id, s.txn.producer_epoch) in staged
            if (s.txn.open or begun or (s.decision or {}).get("earlier")) and self.owns(tid):
                try:
                    async with self._settled(tid):
                        await self._take_over(tid)
                except TopiclakeError as exc:
                    log.warning("transactional id %r: not taken over at start (%s)", tid, exc)

    def on_membership_change(self) -> None:
        """The cluster changed: release the ids another gateway owns now, and take over those this
        one gained that a departed gateway left open or half decided."""
        for tid in [t for t in self._epochs if not self.owns(t)]:
            self.release(tid)
        self._spawn(self.start())

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._landings.clear()  # saved: whichever gateway coordinates the ids next carries them out
        for task in self._background:
            task.cancel()

    def _lock(self, tid: str) -> asyncio.Lock:
        lock = self._locks.get(tid)
        if lock is None:
            lock = self._locks[tid] = asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def _settled(self, tid: str, producer: tuple[int, int] | None = None) -> AsyncIterator[None]:
        """The id's lock, once the decisions being carried out that the request depends on are:
        all of them, or (`producer`, the request's producer id and epoch) those whose staging is
        still where the producer stages (not sealed, under the same ones), and the oldest beyond
        MAX_QUEUED. So a producer begins and decides its next transactions while the last ones
        land. Woken when they have (no polling); an attempt's failure is the request's (the client
        retries)."""
        while True:
            if (pending := self._blocking(tid, producer)) is not None:
                self._hurry(pending)
                await asyncio.shield(pending.done)
                continue
            async with self._lock(tid):
                if self._blocking(tid, producer) is not None:  # decided while this request waited for the lock
                    continue
                yield
                return

    def _blocking(self, tid: str, producer: tuple[int, int] | None) -> _Landing | None:
        queue = self._landings.get(tid)
        if not queue:
            return None
        if producer is None:
            return queue[-1]  # landed in order: the last done, all are
        same = [landing for landing in queue if landing.sealed is None and landing.staged == producer]
        return same[-1] if same else queue[0] if len(queue) >= MAX_QUEUED else None

    def release(self, tid: str) -> None:
        """Stop acting for an id (another gateway coordinates it now)."""
        self._txns.pop(tid, None)
        self._epochs.pop(tid, None)
        self._locks.pop(tid, None)
        if (timer := self._timers.pop(tid, None)) is not None:
            timer.cancel()
        for pending in self._pending_offsets.values():
            for key in [k for k in pending if k[0] == tid]:
                del pending[key]
        moved = NotCoordinatorError(
            f"Transactional id {tid!r} is coordinated by another gateway now, which finishes its decisions; "
            "find its coordinator again.",
            transactional_id=tid,
        )
        for landing in self._landings.pop(tid, []):
            _settle(landing.done, moved)
        if (waiter := self._gap_waits.pop(tid, None)) is not None:
            _settle(waiter)

    def _check_owned(self, tid: str) -> None:
        if not self.owns(tid):
            self.release(tid)
            raise NotCoordinatorError(
                f"Transactional id {tid!r} is coordinated by another gateway; find its coordinator again.",
                transactional_id=tid,
            )

    async def _take_over(self, tid: str, *, create: bool = False) -> Txn | None:
        """With the id's lock held: this gateway's state of `tid`, claimed and loaded on first use
        (a decision found half done is finished first). An id never saved is claimed only to
        `create` it (InitProducerId): a write naming an unknown id costs no commit. Raises:
        NotCoordinatorError, CoordinatorNotAvailableError (too many ids), StorageUnavailableError."""
        self._check_owned(tid)
        if tid in self._epochs:
            return self._view(tid)
        if len(self._epochs) >= self.settings.max_transactional_ids:
            raise CoordinatorNotAvailableError(
                f"This gateway coordinates {len(self._epochs)} transactional ids, its limit "
                "(transactions.max_transactional_ids); retry later or add gateways.",
            )
        store, _ = await self._opened()
        if not create and tid not in (await asyncio.to_thread(store.load, tid)):
            return None
        epoch = await asyncio.to_thread(store.claim, tid)
        saved = (await asyncio.to_thread(store.load, tid)).get(tid)
        self._check_owned(tid)
        self._epochs[tid] = epoch
        if saved is None:
            return None
        txn = self._txns[tid] = saved.txn
        log.info("transactional id %r: coordinated here (epoch %d, %s)", tid, epoch, txn.state)
        decision = dict(saved.decision or {})
        found = [self._enqueue(Txn.of(e["txn"]), e["decision"], alone=True) for e in decision.pop("earlier", ())]
        if txn.state in (rules.PREPARE_COMMIT, rules.PREPARE_ABORT):
            found.append(self._enqueue(txn, decision, alone=True))
        elif txn.state == rules.ONGOING:
            self._arm(txn)
        if found:
            await self._landed(found[-1])
        await self._resume(tid)
        return self._view(tid)

    async def _resume(self, tid: str) -> None:
        """With the id's lock held, at its takeover: the producer's open transaction (never saved:
        `_add` keeps it in the staging) taken up again from its staging, with the partitions and
        groups its writes and adds name, its timeout running from the first of them."""
        txn = self._txns.get(tid)
        if txn is None or txn.state not in (rules.EMPTY, rules.COMPLETE_COMMIT, rules.COMPLETE_ABORT):
            return
        _, staging = self._open()

        def read() -> tuple[Staged, list[tuple[str, int]], list[str]]:
            found = staging.staged(tid, txn.producer_id, txn.producer_epoch)
            return found, *staging.read_added(tid, txn.producer_id, txn.producer_epoch, found)

        found, partitions, groups = await asyncio.to_thread(read)
        if not found.records and not found.offsets and not found.added:
            return
        resumed = rules.add(
            txn,
            tid,
            txn.producer_id,
            txn.producer_epoch,
            partitions=[*partitions, *((r.topic, r.partition) for r in found.records)],
            groups=[*groups, *(o.group for o in found.offsets)],
            now_ms=found.oldest_ms,
        )
        self._txns[tid] = resumed
        self._arm(resumed)
        log.info("transactional id %r: transaction %d open (found staged), resumed", tid, resumed.number)

    def _view(self, tid: str) -> Txn | None:
        """The id's state as its producer sees it: a decision saved is as good as carried out
        (it lands in order behind the producer, and whichever gateway takes the id over finishes
        it), so the producer's next transaction may begin."""
        txn = self._txns.get(tid)
        if txn is not None and txn.state in (rules.PREPARE_COMMIT, rules.PREPARE_ABORT):
            return rules.complete(txn, now_ms=txn.updated_ms)
        return txn

    async def _save(
        self,
        txn: Txn,
        decision: Mapping[str, Any] | None = None,
        *,
        deciding: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        """Save the id's state, with the decision being taken (`decision`, or what `deciding`
        returns: blocking work run first on the save's own worker thread, which spares a
        transaction a hop) and those taken before that are still being carried out ("earlier"),
        so that a takeover finishes them all."""
        tid = txn.transactional_id
        store, _ = self._open()
        earlier = [landing.saved() for landing in self._landings.get(tid, ()) if landing.txn is not txn]
        epoch = self._epochs[tid]

        def save() -> None:
            taken = deciding() if deciding is not None else decision
            store.save(txn, epoch, {**(taken or {}), "earlier": earlier} if earlier else taken)

        try:
            await asyncio.to_thread(save)
        except NotCoordinatorError:
            self.release(tid)
            raise
        self._txns[tid] = txn
        self._saves += 1
        if self._saves % COMPACT_EVERY == 0:  # the table to a row per id, idle ids expired
            expire = self.clock_ms() - self.settings.id_expiration_ms
            keep = frozenset(t for t, x in self._txns.items() if x.open)  # open: not saved (`_add`)
            self._spawn(asyncio.to_thread(store.compact, min_rows=COMPACT_EVERY, expire_before_ms=expire, keep=keep))

    # -- timeouts ---------------------------------------------------------------------------------
    def _arm(self, txn: Txn) -> None:
        """Abort `txn` when its timeout passes (a timer on the loop, cancelled when it ends)."""
        tid = txn.transactional_id
        if (old := self._timers.pop(tid, None)) is not None:
            old.cancel()
        deadline = txn.deadline_ms()
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, (deadline - self.clock_ms()) / 1000)
        self._timers[tid] = loop.call_later(delay, lambda: self._spawn(self._expire(tid, txn.number)))

    async def _expire(self, tid: str, number: int) -> None:
        try:
            async with self._settled(tid):
                self._timers.pop(tid, None)
                txn = self._txns.get(tid)
                if txn is None or txn.number != number or not rules.timed_out(txn, self.clock_ms()):
                    if txn is not None and txn.state == rules.ONGOING:
                        self._arm(txn)
                    return
                self._check_owned(tid)
                log.info(
                    "transactional id %r: transaction %d timed out after %d ms; aborting", tid, number, txn.timeout_ms
                )
                await self._decide(
                    rules.fence_and_abort(txn, now_ms=self.clock_ms()), (txn.producer_id, txn.producer_epoch)
                )
        except TopiclakeError as exc:
            log.warning("transactional id %r: timed-out transaction not aborted yet (%s); retrying", tid, exc)
            await asyncio.sleep(1.0)
            if tid in self._txns:
                self._spawn(self._expire(tid, number))

    # -- the protocol -----------------------------------------------------------------------------
    async def init_producer_id(
        self, principal: Principal, tid: str, timeout_ms: int, expected: tuple[int, int] | None = None
    ) -> Txn:
        """InitProducerId with a transactional id: the id's producer id and new epoch. An open
        transaction of the id is aborted first (its producer fenced).

        Raises: TransactionalIdAuthorizationError, InvalidRecordError (the id),
        InvalidTransactionTimeoutError, ConcurrentTransactionsError, ProducerFencedError,
        NotCoordinatorError, StorageUnavailableError."""
        rules.validate_transactional_id(tid)
        authorize_transactional_id(principal, "write", tid)
        async with self._settled(tid):
            current = await self._take_over(tid, create=True)
            for _ in range(3):
                out = rules.init_producer_id(
                    current,
                    tid,
                    timeout_ms,
                    max_timeout_ms=self.settings.max_timeout_ms,
                    expected=expected,
                    new_producer_id=lambda: secrets.randbits(63),
                    now_ms=self.clock_ms(),
                )
                if out.fence:
                    assert current is not None
                    log.info("transactional id %r: a new producer fences the open transaction %d", tid, current.number)
                    staged = (current.producer_id, current.producer_epoch)
                    await self._decide(rules.fence_and_abort(current, now_ms=self.clock_ms()), staged)
                    current = self._txns[tid]
                    continue
                if out.txn != current:
                    await self._save(out.txn)
                return out.txn
        raise AssertionError("InitProducerId fenced the same transaction twice")

    async def add_partitions(
        self, principal: Principal, tid: str, producer_id: int, epoch: int, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], TopiclakeError | None]:
        """AddPartitionsToTxn: each partition's outcome (None: added). A partition refused (no
        produce ACL, unknown) leaves the others unadded (Kafka's OPERATION_NOT_ATTEMPTED, left to
        the face). Raises, for all: TransactionalIdAuthorizationError, InvalidProducerIdMappingError,
        ProducerFencedError, ConcurrentTransactionsError, NotCoordinatorError,
        StorageUnavailableError."""
        authorize_transactional_id(principal, "write", tid)
        refused = await self._refused_partitions(principal, partitions)
        if any(e is not None for e in refused.values()):
            return refused
        await self._add(tid, producer_id, epoch, partitions=partitions)
        return refused

    async def _refused_partitions(
        self, principal: Principal, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], TopiclakeError | None]:
        topics = {t for t, _ in partitions}
        denied = {t: refusal(principal, "produce", t) for t in topics}

        def counts() -> dict[str, int | TopiclakeError]:
            out: dict[str, int | TopiclakeError] = {}
            for t in topics:
                if denied[t] is None:
                    try:
                        out[t] = self.registry.partitions(t)
                    except TopiclakeError as exc:
                        out[t] = exc
            return out

        known = await asyncio.to_thread(counts)
        result: dict[tuple[str, int], TopiclakeError | None] = {}
        for t, p in partitions:
            n = known.get(t)
            if (error := denied[t]) is not None or isinstance(n, TopiclakeError):
                result[(t, p)] = error or n  # type: ignore[assignment]
            elif n is not None and not 0 <= p < n:
                result[(t, p)] = PartitionNotFoundError(t, p, n)
            else:
                result[(t, p)] = None
        return result

    async def add(
        self,
        principal: Principal,
        tid: str,
        producer_id: int,
        epoch: int,
        *,
        partitions: Sequence[tuple[str, int]] = (),
        groups: Sequence[str] = (),
    ) -> None:
        """Add partitions and groups to the producer's transaction, beginning it if none is open
        (what a write of transaction version 2 does where the id is coordinated; HTTP's
        POST /transactions/{id}/partitions, which another gateway calls for such a write).

        Raises: the first refusal of a partition (AuthorizationError, TopicNotFoundError,
        PartitionNotFoundError), AuthorizationError (a group), and as `add_partitions`."""
        authorize_transactional_id(principal, "write", tid)
        for group in groups:
            authorize_group(principal, "read", group)
        refused = await self._refused_partitions(principal, partitions)
        if (first := next((e for e in refused.values() if e is not None), None)) is not None:
            raise first
        await self._add(tid, producer_id, epoch, partitions=partitions, groups=groups)

    async def _join(
        self,
        principal: Principal | None,
        tid: str,
        producer_id: int,
        epoch: int,
        *,
        partitions: Sequence[tuple[str, int]] = (),
        groups: Sequence[str] = (),
        remember: bool = False,
    ) -> None:
        """A write's implicit add of its partitions or groups, beginning the transaction: here
        where this gateway coordinates the id, else at the gateway that does (as a Kafka partition
        leader asks the transaction coordinator); `remember`: the epoch names one transaction, so
        what it added there once need not be asked again. Here the add is not saved: the write's
        staged file records it (`_add`). Raises: as `_add`, or the coordinator's refusal,
        CoordinatorNotAvailableError (it cannot be reached: the client retries)."""
        if self.owns(tid):
            await self._add(tid, producer_id, epoch, partitions=partitions, groups=groups, staged=True)
            return
        if self.remote_add is None or principal is None:
            raise CoordinatorNotAvailableError(
                f"Transactional id {tid!r} is coordinated by another gateway, which this one cannot reach; retry.",
                transactional_id=tid,
            )
        items: list[tuple[str, int] | str] = [*partitions, *groups]
        keys = {(tid, producer_id, epoch, item) for item in items}
        if remember and keys <= self._added_elsewhere:
            return
        await self.remote_add(principal, tid, producer_id, epoch, partitions, groups)
        if not remember:
            return
        if len(self._added_elsewhere) > ADDED_ELSEWHERE_KEPT:
            self._added_elsewhere.clear()
        self._added_elsewhere |= keys

    async def add_offsets(self, principal: Principal, tid: str, producer_id: int, epoch: int, group: str) -> None:
        """AddOffsetsToTxn: the transaction will commit offsets of `group`.

        Raises: TransactionalIdAuthorizationError, AuthorizationError (the group), and as
        `add_partitions`."""
        authorize_transactional_id(principal, "write", tid)
        authorize_group(principal, "read", group)
        await self._add(tid, producer_id, epoch, groups=[group])

    async def _add(
        self,
        tid: str,
        producer_id: int,
        epoch: int,
        *,
        partitions: Iterable[tuple[str, int]] = (),
        groups: Iterable[str] = (),
        staged: bool = False,
    ) -> Txn:
        """Add to the producer's transaction, beginning it if none is open. What is added is kept in
        the producer's staging, not saved to the state table (the decision saves it): a takeover
        finds the transaction open there (`_resume`). `staged`: the add of a write, whose staged
        file keeps it; else (AddPartitionsToTxn, AddOffsetsToTxn) a small file of its own."""
        async with self._settled(tid, (producer_id, epoch)):
            current = await self._take_over(tid)
            nxt = rules.add(
                current, tid, producer_id, epoch, partitions=partitions, groups=groups, now_ms=self.clock_ms()
            )
            if len(nxt.partitions) + len(nxt.groups) > self.settings.max_partitions:
                raise InvalidTxnStateError(
                    f"A transaction may touch at most {self.settings.max_partitions} partitions and groups "
                    "(transactions.max_partitions); commit this one and begin another.",
                    transactional_id=tid,
                )
            if nxt is not current:
                if not staged:
                    before = current if current is not None and current.state == rules.ONGOING else None
                    new_partitions = sorted(nxt.partitions - (before.partitions if before else frozenset()))
                    new_groups = sorted(nxt.groups - (before.groups if before else frozenset()))
                    _, staging = await self._opened()
                    await asyncio.to_thread(staging.record_added, tid, producer_id, epoch, new_partitions, new_groups)
                self._txns[tid] = nxt
                if current is None or current.state != rules.ONGOING:
                    self._arm(nxt)
            return nxt

    async def end_txn(
        self,
        principal: Principal,
        tid: str,
        producer_id: int,
        epoch: int,
        *,
        commit: bool,
        bump: bool = False,
        wait: bool = True,
    ) -> Txn:
        """EndTxn: commit (land every staged record and offset) or abort (drop them), answered with
        the id's state (`bump`, transaction version 2: the producer id and epoch of the producer's
        next transaction). `wait`: answered once it is all visible; else once the decision is
        saved, as Kafka answers after PrepareCommit (the rest is carried out at once, and the
        producer's next requests wait for it). Raises: TransactionalIdAuthorizationError,
        InvalidProducerIdMappingError, ProducerFencedError, InvalidTxnStateError,
        ConcurrentTransactionsError, NotCoordinatorError, StorageUnavailableError (the decision
        stands and is finished later: by a retry, or by whichever gateway takes the id over)."""
        authorize_transactional_id(principal, "write", tid)
        async with self._settled(tid, (producer_id, epoch)):
            current = await self._take_over(tid)
            ending = rules.end(
                current,
                tid,
                producer_id,
                epoch,
                commit=commit,
                now_ms=self.clock_ms(),
                bump=(lambda: secrets.randbits(63)) if bump else None,
            )
            if not ending.retry:
                await self._decide(ending.txn, (producer_id, epoch), wait=wait)
            return self._txns[tid]

    async def _decide(self, txn: Txn, staged: tuple[int, int], *, wait: bool = True) -> None:
        """Save the decision of `txn` (PrepareCommit or PrepareAbort) with what it lands (the
        producer's staged files, under the (producer id, epoch) `staged` wrote them with), then
        carry it out, in order behind the id's earlier decisions: (`wait`) before returning, and
        save it complete; or in the background."""
        tid = txn.transactional_id
        if (timer := self._timers.pop(tid, None)) is not None:
            timer.cancel()
        _, staging = self._open()
        pid, staged_epoch = staged

        taken: dict[str, Any] = {}

        def seal() -> Mapping[str, Any]:  # on the save's thread, before it
            sealed = staging.seal(tid, pid, staged_epoch, txn.number)
            taken["sealed"] = sealed
            found = staging.staged(tid, pid, staged_epoch, sealed=sealed)
            # what its landing reads (an abort's records are dropped unread)
            taken["size"] = sum(s.size for s in found.records) if txn.state == rules.PREPARE_COMMIT else 0
            taken["decision"] = {
                "producer_id": pid,
                "staged_epoch": staged_epoch,
                "records": [[s.topic, s.partition, s.base_sequence, s.path] for s in found.records],
                "offsets": [[o.group, o.path] for o in found.offsets],
                **({} if sealed is None else {"sealed": sealed}),
            }
            return taken["decision"]

        try:
            await self._save(txn, deciding=seal)
        finally:
            if "sealed" in taken:  # its staging moved (saved or not: a retry seals again)
                for pending in self._pending_offsets.values():
                    if (partitions := pending.pop((tid, pid, staged_epoch, None), None)) is not None:
                        pending[(tid, pid, staged_epoch, taken["sealed"])] = partitions
        landing = self._enqueue(txn, taken["decision"], size=taken["size"])
        if wait:
            await self._landed(landing)

    async def _landed(self, landing: _Landing) -> None:
        """With the id's lock held: wait until `landing` (and every decision before it) is
        carried out, then save it complete if it is the id's latest. Raises: an attempt's error."""
        self._hurry(landing)
        await asyncio.shield(landing.done)
        await self._save_complete(landing.txn)

    async def _save_complete(self, txn: Txn) -> None:
        """With the id's lock held: save `txn`, carried out, complete, unless the id moved on since
        (its next save leaves out what landed)."""
        if self._txns.get(txn.transactional_id) is txn:
            await self._save(rules.complete(txn, now_ms=self.clock_ms()))

    def _enqueue(self, txn: Txn, decision: Mapping[str, Any], *, alone: bool = False, size: int = 0) -> _Landing:
        """Queue a saved decision to be carried out behind the id's earlier ones."""
        tid = txn.transactional_id
        landing = _Landing(txn, decision, asyncio.get_running_loop().create_future(), alone, size=size)
        queue = self._landings.setdefault(tid, [])
        queue.append(landing)
        if alone or len(queue) >= MAX_LANDINGS:  # a takeover's; or as many as land together
            self._hurry(landing)
        else:
            self._recheck(tid)
        if tid not in self._landers:
            self._start_landing(tid)
        return landing

    def _start_landing(self, tid: str) -> None:
        self._landers[tid] = self._spawn(self._land_all(tid, self._landings[tid]))

    async def _land_all(self, tid: str, queue: list[_Landing]) -> None:
        """Carry out the id's queued decisions in order, consecutive ones together
        (`_next_batch`), while `queue` is the id's: an attempt that fails is tried again (a
        takeover finishes them otherwise), and its error given to the requests waiting for them.
        Each landing is followed by a gap (`_gap`), which the decisions taken in it wait out. Once the latest decision is carried out, it is saved complete (unless the id moved
        on: its next save leaves out what landed)."""
        me = asyncio.current_task()
        loop = asyncio.get_running_loop()
        try:
            while queue and self._landings.get(tid) is queue:
                batch = self._next_batch(queue)
                started = loop.time()
                while True:
                    try:
                        await self._carry_out(tid, batch)
                        break
                    except Exception as exc:  # storage trouble, or a defect: the decisions stand
                        if self._landings.get(tid) is not queue:
                            return
                        if not self.owns(tid):  # its new coordinator finishes them
                            self.release(tid)
                            return
                        log.warning(
                            "transactional id %r: transaction %d not carried out yet (%s); retrying",
                            tid,
                            batch[0].txn.number,
                            exc,
                            exc_info=not isinstance(exc, TopiclakeError),
                        )
                        error = (
                            exc
                            if isinstance(exc, TopiclakeError)
                            else CoordinatorNotAvailableError(
                                f"Transactional id {tid!r}: its last transaction is not carried out yet ({exc}); retry.",
                                transactional_id=tid,
                            )
                        )
                        for landing in queue:
                            _settle(landing.done, error)
                            landing.done = asyncio.get_running_loop().create_future()
                        await asyncio.sleep(1.0)
                del queue[: len(batch)]
                for landing in batch:
                    _settle(landing.done)
                if self._txns.get(tid) is (last := batch[-1].txn):
                    self._spawn(self._complete(last))
                await self._gap(tid, queue, loop.time() - started)
        finally:
            if self._landers.get(tid) is me:
                del self._landers[tid]
            if (now := self._landings.get(tid)) and now is not queue and tid not in self._landers:
                self._start_landing(tid)  # queued again after a release

    async def _gap(self, tid: str, queue: list[_Landing], took: float) -> None:
        """After a landing that took `took` seconds, wait for the id's next decisions to join its
        next one. Much of a landing's cost is per landing (a parquet file a partition, a Delta
        commit a topic, their roll-up later, the staging dropped), and a Kafka producer is answered
        at its decision, so it does not wait for it; a decision after the gap lands at once.

        The gap: while a consumer waits on this gateway for new records of a queued decision's
        topics (`watched`), `GAP_FACTOR` times as long as the landing took, at most
        `transactions.max_landing_gap_ms`, as the group commit spaces a topic's flushes
        (delta_log.log.group_commit); otherwise `transactions.unwatched_landing_gap_ms`, so a busy
        producer's transactions land a few at a time (MAX_LANDINGS at most) in fewer, bigger
        commits. Looked at again (`_recheck`) when a decision is queued or a consumer begins to
        wait; a request that waits for a landing ends it (`_hurry`)."""
        loop = asyncio.get_running_loop()
        ended = loop.time()
        settings = self.settings
        watched_gap = min(GAP_FACTOR * took, settings.max_landing_gap_ms / 1000)
        unwatched_gap = max(watched_gap, settings.unwatched_landing_gap_ms / 1000)
        while self._landings.get(tid) is queue and not any(landing.awaited for landing in queue):
            watched = any(self.watched(topic) for landing in queue for topic in landing.topics)
            left = ended + (watched_gap if watched else unwatched_gap) - loop.time()
            if left <= 0:
                return
            waiter = self._gap_waits[tid] = loop.create_future()
            timer = loop.call_later(left, _settle, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                if self._gap_waits.get(tid) is waiter:
                    del self._gap_waits[tid]

    def _recheck(self, tid: str) -> None:
        """A decision of the id was queued, or a consumer began to wait: its lander, if in a gap,
        looks again at how long the gap is."""
        if (waiter := self._gap_waits.get(tid)) is not None:
            _settle(waiter)

    def reader_waits(self, topic: str) -> None:
        """A consumer began to wait on this gateway for new records of `topic` (a
        CommitNotifier's wait listener): the ids whose queued decisions land in it take the
        shorter gap."""
        for tid in list(self._gap_waits):
            if any(topic in landing.topics for landing in self._landings.get(tid, ())):
                self._recheck(tid)

    def _hurry(self, landing: _Landing) -> None:
        """A request waits for `landing` (or it must land now): its id's landings take no gap
        until it has landed."""
        landing.awaited = True
        if (waiter := self._gap_waits.pop(landing.txn.transactional_id, None)) is not None:
            _settle(waiter)

    @staticmethod
    def _next_batch(queue: Sequence[_Landing]) -> list[_Landing]:
        """The decisions at the head of `queue` carried out together: consecutive ones of one
        producer id (their records land under one producer name), none found in a saved row (part
        of such a decision may have landed already, so it lands by itself), MAX_LANDINGS and
        MAX_LANDING_BYTES at most (the first one whatever its size)."""
        first = queue[0]
        batch = [first]
        size = first.size
        for landing in queue[1 : MAX_LANDINGS if not first.alone else 1]:
            size += landing.size
            if landing.alone or landing.staged[0] != first.staged[0] or size > MAX_LANDING_BYTES:
                break
            batch.append(landing)
        return batch

    async def _complete(self, txn: Txn) -> None:
        tid = txn.transactional_id
        try:
            async with self._lock(tid):
                await self._save_complete(txn)
        except TopiclakeError as exc:  # its next save, or a takeover, says it again
            log.warning(
                "transactional id %r: transaction %d carried out, not saved complete (%s)", tid, txn.number, exc
            )

    async def _carry_out(self, tid: str, batch: Sequence[_Landing]) -> None:
        """Carry out saved decisions of one producer id, in order: land the commits' staged
        records and offsets, then drop every staging. Safe to run again after a crash at any
        step."""
        _, staging = self._open()
        commits = [landing for landing in batch if landing.txn.state == rules.PREPARE_COMMIT and landing.staged[1] >= 0]
        if commits:
            pid, number = commits[0].staged[0], commits[-1].txn.number
            await self._land_records(tid, pid, number, commits)
            await self._land_offsets(tid, pid, number, commits)

        def drop() -> None:
            for landing in batch:
                if landing.staged[1] >= 0:
                    staging.drop(tid, *landing.staged, sealed=landing.sealed)

        await asyncio.to_thread(drop)
        for landing in batch:
            for pending in self._pending_offsets.values():
                pending.pop(landing.pending_key, None)
            outcome = "committed" if landing.txn.state == rules.PREPARE_COMMIT else "aborted"
            log.debug("transactional id %r: transaction %d %s", tid, landing.txn.number, outcome)

    async def _land_records(self, tid: str, pid: int, number: int, commits: Sequence[_Landing]) -> None:
        """One append per topic, all topics at once: every partition's records of all `commits`
        in one Delta commit, under the producer's name for its transactions and the last one's
        `number` (so landing them again writes nothing). A file gone means its transaction landed
        and its staging was dropped (a roll-forward after that)."""
        _, staging = self._open()
        by_topic: dict[str, list[tuple[_Landing, list[StagedRecords]]]] = {}
        for landing in commits:
            mine: dict[str, list[StagedRecords]] = {}
            for t, p, seq, path in landing.decision.get("records", ()):
                mine.setdefault(t, []).append(StagedRecords(t, int(p), int(seq), path))
            for t, staged in mine.items():
                by_topic.setdefault(t, []).append((landing, staged))

        def read(topic: str) -> list[tuple[int, pa.Table]]:
            """Each transaction's records of `topic` (with its number), none where it landed."""
            out = []
            for landing, staged in by_topic[topic]:
                if tables := staging.read_records(tid, *landing.staged, staged, sealed=landing.sealed):
                    out.append(
                        (landing.txn.number, pa.concat_tables([t.replace_schema_metadata(None) for t in tables]))
                    )
            return out

        async def land(topic: str) -> None:
            found = await asyncio.to_thread(read, topic)
            if not found:
                return
            try:
                batches = [(number, pa.concat_tables([t for _, t in found]))]
            except pa.ArrowInvalid:  # the topic's schema changed between them: one commit each
                batches = [*found[:-1], (number, found[-1][1])]
            for sequence, batch in batches:
                request = AppendRequest(
                    batch=batch,
                    producer=ProducerSequence(producer_id=landing_producer(pid), sequence=sequence),
                    urgent=True,
                )
                try:
                    result = await self.land(topic, request)
                    if result.error is not None:
                        raise result.error
                except DuplicateSequenceError:
                    pass  # these landed before (a later transaction of the producer may have since)
                except TopicNotFoundError:  # deleted since the decision: its records went with it
                    log.warning(
                        "transactional id %r: transaction %d's records of %r not landed: the topic was deleted",
                        tid,
                        sequence,
                        topic,
                    )
                    return

        await asyncio.gather(*(land(t) for t in sorted(by_topic)))

    async def _land_offsets(self, tid: str, pid: int, number: int, commits: Sequence[_Landing]) -> None:
        """The commits' group offsets (a later transaction's after an earlier's), every group's in
        one commit named by the last one's `number` (so landing them again writes nothing)."""
        if not any(landing.decision.get("offsets") for landing in commits):
            return
        _, staging = self._open()

        def read() -> list[dict[str, Any]]:
            rows: list[dict[str, Any]] = []
            for landing in commits:
                if staged := [StagedOffsets(g, path) for g, path in landing.decision.get("offsets", ())]:
                    rows += staging.read_offsets(tid, *landing.staged, staged, sealed=landing.sealed) or []
            return rows

        latest: dict[str, dict[tuple[str, int], OffsetCommit]] = {}
        for o in await asyncio.to_thread(read):
            c = OffsetCommit(
                group=o["group"],
                topic=o["topic"],
                partition=int(o["partition"]),
                offset=int(o["offset"]),
                metadata=o.get("metadata") or "",
                member_id=o.get("member_id") or "",
                generation=int(o.get("generation", -1)),
            )
            latest.setdefault(c.group, {})[(c.topic, c.partition)] = c
        if latest:
            await self.commit_offsets({g: list(c.values()) for g, c in latest.items()}, (landing_producer(pid), number))

    # -- the data path ----------------------------------------------------------------------------
    async def _verify(self, txn: TxnProduce, topic: str, partitions: Sequence[int]) -> None:
        """KIP-890's check of a transactional write, where this gateway coordinates the id: the
        writer is the id's producer, and its transaction is open and holds the partitions; a write
        that does not name its partitions (`implicit`) adds them, and may begin the transaction.
        Elsewhere the coordinator's EndTxn decides (a fenced producer's commit is refused).

        Raises: InvalidProducerIdMappingError, ProducerFencedError, InvalidTxnStateError,
        ConcurrentTransactionsError, NotCoordinatorError, StorageUnavailableError."""
        tid, b = txn.transactional_id, txn.batch
        if txn.implicit:
            await self._join(
                txn.principal,
                tid,
                b.producer_id,
                b.producer_epoch,
                partitions=[(topic, p) for p in partitions],
                remember=txn.epoch_per_transaction,
            )
            return
        if not self.owns(tid):
            return
        async with self._settled(tid, (b.producer_id, b.producer_epoch)):
            current = rules.check_producer(await self._take_over(tid), tid, b.producer_id, b.producer_epoch)
        missing = [p for p in partitions if (topic, p) not in current.partitions]
        if current.state != rules.ONGOING or missing:
            raise InvalidTxnStateError(
                f"Partition {(missing or list(partitions))[0]} of {topic!r} is not in an open transaction of "
                f"{tid!r}: add it to the transaction (AddPartitionsToTxn) before writing to it.",
                transactional_id=tid,
                topic=topic,
            )

    async def stage(self, txn: TxnProduce, topic: str, request: AppendRequest, *, verify: bool = True) -> AppendResult:
        """Keep a transactional write's records (each partition's) until its transaction is decided,
        checked first (`_verify`; not `verify`: dead letters split from records that were).
        Answered with no offsets: they are assigned when the transaction commits."""
        _, staging = await self._opened()
        batch = request.batch
        parts = request.partition_array()
        touched = [int(p) for p in sorted(set(parts.tolist()))]
        tid, b = txn.transactional_id, txn.batch
        if verify:
            await self._verify(txn, topic, touched)

        def write() -> None:
            # as durable as the topic's own appends: fsynced where they are (a `log` topic)
            sync = self.registry.reader(topic).config.ack_mode == "log"
            for p in touched:
                rows = batch.filter(pa.array(parts == p)) if len(touched) > 1 else batch
                staging.write_records(
                    tid, b.producer_id, b.producer_epoch, topic, p, b.sequence, rows, lane=b.lane, sync=sync
                )

        await asyncio.to_thread(write)
        return AppendResult()

    async def stage_offsets(
        self,
        principal: Principal,
        tid: str,
        group: str,
        producer_id: int,
        epoch: int,
        commits: Sequence[OffsetCommit],
        *,
        implicit: bool = False,
    ) -> None:
        """TxnOffsetCommit's durable part: keep the offsets until the transaction commits (the
        group coordinator checked the member first); `implicit` (TxnOffsetCommit v5, transaction
        version 2): the group joins the transaction, which it may begin. Raises:
        TransactionalIdAuthorizationError, AuthorizationError, InvalidProducerIdMappingError,
        ProducerFencedError, InvalidTxnStateError, CoordinatorNotAvailableError,
        StorageUnavailableError."""
        authorize_transactional_id(principal, "write", tid)
        authorize_group(principal, "read", group)
        for c in commits:
            authorize(principal, "consume", c.topic)
        if implicit:  # TxnOffsetCommit v5: transaction version 2, an epoch a transaction
            await self._join(principal, tid, producer_id, epoch, groups=[group], remember=True)
        elif tid in self._epochs and self.owns(tid):
            txn = rules.check_producer(self._view(tid), tid, producer_id, epoch)
            if txn.state != rules.ONGOING or group not in txn.groups:
                raise InvalidTxnStateError(
                    f"Group {group!r} is not in an open transaction of {tid!r}: add it first "
                    "(sendOffsetsToTransaction does).",
                    transactional_id=tid,
                    group=group,
                )
        _, staging = await self._opened()
        rows = [
            {
                "topic": c.topic,
                "partition": c.partition,
                "offset": c.offset,
                "metadata": c.metadata,
                "member_id": c.member_id,
                "generation": c.generation,
            }
            for c in commits
        ]
        await asyncio.to_thread(staging.stage_offsets, tid, producer_id, epoch, group, rows)
        self._pending_offsets.setdefault(group, {}).setdefault((tid, producer_id, epoch, None), set()).update(
            (c.topic, c.partition) for c in commits
        )

    async def txn_offset_commit(
        self,
        principal: Principal,
        groups: GroupCoordinator,
        tid: str,
        group: str,
        producer_id: int,
        epoch: int,
        commits: list[OffsetCommit],
        *,
        member_id: str | None,
        generation: int,
        implicit: bool = False,
    ) -> None:
        """TxnOffsetCommit, for every face: the member is checked by the group's coordinator as for
        an offset commit (when the request names one: Kafka's v3+), then the offsets are staged with
        the transaction (`stage_offsets`). Raises: AuthorizationError, the group coordinator's
        refusals (UnknownMemberError, FencedMemberError...), and as `stage_offsets`."""
        authorize_group(principal, "read", group)

        async def stage(group_id: str, checked: list[OffsetCommit]) -> int:
            await self.stage_offsets(principal, tid, group_id, producer_id, epoch, checked, implicit=implicit)
            return 0

        if member_id is None and generation < 0:  # no member named: nothing to check it against
            await stage(group, commits)
            return
        await groups.commit(
            group, commits, member_id=member_id, generation=generation, principal=owner_of(principal), write=stage
        )

    async def unstable(self, group: str) -> set[tuple[str, int]]:
        """The group's partitions whose offsets a transaction staged here commits, not landed yet
        (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them). A transaction
        coordinated by another gateway is landed there: its offsets are pending while its
        producer's staging at that epoch holds offsets (read from the root)."""
        pending = self._pending_offsets.get(group, {})
        elsewhere = [k for k in pending if k[0] not in self._epochs or not self.owns(k[0])]
        if elsewhere:
            held = await asyncio.to_thread(lambda: [self._open()[1].holds_offsets(*k[:3]) for k in elsewhere])
            for key, holds in zip(elsewhere, held, strict=True):
                if not holds:
                    pending.pop(key, None)
        return set().union(*pending.values())

    # -- views ------------------------------------------------------------------------------------
    async def describe(self, principal: Principal, tid: str) -> Txn:
        """DescribeTransactions: the id's state. Raises: TransactionalIdAuthorizationError,
        NotCoordinatorError, TransactionalIdNotFoundError, StorageUnavailableError."""
        authorize_transactional_id(principal, "describe", tid)
        self._check_owned(tid)
        txn = self._txns.get(tid) if tid in self._epochs else self._listed.get(tid)
        if txn is None:
            saved = (await asyncio.to_thread(self._open()[0].load, tid)).get(tid)
            txn = saved.txn if saved is not None else None
        if txn is None or txn.state == rules.DEAD:
            raise TransactionalIdNotFoundError(tid)
        return txn

    def state(self, tid: str) -> Txn | None:
        """The id's state as this gateway last saved it (None: not coordinated here since start)."""
        return self._txns.get(tid) if tid in self._epochs else None

    def transactions(self) -> list[Txn]:
        """The ids this gateway coordinates (as last saved here, or read at start)."""
        found = {tid: t for tid, t in self._listed.items() if self.owns(tid)}
        found.update((tid, t) for tid, t in self._txns.items() if tid in self._epochs)
        return [found[tid] for tid in sorted(found)]
