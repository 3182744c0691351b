"""Transaction coordinator: Kafka's transactions (InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, transactional Produce), one
coordinator per transactional id, for every face.

How a transaction maps onto the lakehouse (docs/DESIGN.md, "Transactions"):
- A transactional producer's records are staged, durably, outside the topic tables
  (delta_log.system.transactions.TransactionStaging) and acked without an offset (-1, as Kafka
  answers acks=0): no table reader, Kafka consumer, Spark or SQL can see them.
- EndTxn(commit) saves the decision (PrepareCommit, with the list of staged files) to
  `_system/transactions`, then lands the records: one append per topic, so all of a topic's
  partitions land in one Delta commit, each topic's append idempotent under the producer's
  transaction number (a roll-forward never writes twice); then the group offsets of
  TxnOffsetCommit; then drops the staging and saves CompleteCommit. HTTP's commit is answered
  after that (a committed transaction is readable when its producer returns); Kafka's EndTxn once
  the decision is saved, as Kafka's coordinator answers after PrepareCommit, the rest carried out
  at once in the background while the producer's next requests of the id wait for it.
- EndTxn(abort), a timeout, or a new producer of the id fencing an open transaction: PrepareAbort
  is saved, the staging dropped, CompleteAbort saved. Nothing of it ever reached a table.
- A gateway that starts, or takes an id over (a failover), reads the id's last saved state and
  finishes the decision it finds (a PrepareCommit is rolled forward, a PrepareAbort dropped), and
  aborts an open transaction whose timeout passed. So memory never decides an outcome.
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
    TransactionalIdNotFoundError,
)
from delta_log.log.writer import AppendRequest, AppendResult
from delta_log.registry import TopicRegistry
from delta_log.system.offsets import OffsetCommit as OffsetCommit
from delta_log.system.transactions import StagedOffsets, StagedRecords, TransactionStaging, TransactionStore

log = logging.getLogger(__name__)

#: saves between two rewrites of `_system/transactions` to its latest row per id
COMPACT_EVERY = 256
#: implicit adds made at other gateways remembered (so each is asked once a transaction)
ADDED_ELSEWHERE_KEPT = 100_000
#: lands one topic's records (ProduceService.append): the Delta commit that holds them, or its error
Land = Callable[[str, AppendRequest], Awaitable[AppendResult]]
#: writes a transaction's group offsets once it commits (GroupCoordinator.commit_transactional),
#: the commit naming the transaction (the Delta app transaction its records landed under)
CommitOffsets = Callable[[str, list[OffsetCommit], tuple[str, int]], Awaitable[None]]
#: adds partitions and groups to a transaction at its coordinator, another gateway, for a client
#: this one authenticated: (principal, id, producer id, epoch, partitions, groups); raises the
#: coordinator's refusal
RemoteAdd = Callable[[Principal, str, int, int, Sequence[tuple[str, int]], Sequence[str]], Awaitable[None]]


def landing_producer(producer_id: int) -> str:
    """The producer name a transaction's records land under in the topic tables: the table keeps
    the last transaction number landed per partition, so landing a transaction again writes
    nothing (delta_log.core.producer)."""
    return f"t{producer_id}"


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
        #: group -> partitions with offsets staged by open transactions coordinated here
        self._pending_offsets: dict[str, dict[str, set[tuple[str, int]]]] = {}
        self._background: set[asyncio.Future[Any]] = set()
        #: ids whose decision is being carried out after EndTxn was answered (Kafka's face): done
        #: once it landed
        self._completing: dict[str, asyncio.Future[None]] = {}
        self._saves = 0
        #: every id's state as read at start (what ListTransactions lists before an id is used)
        self._listed: dict[str, Txn] = {}

    # -- lifecycle --------------------------------------------------------------------------------
    def _open(self) -> tuple[TransactionStore, TransactionStaging]:
        if self._store is None or self._staging is None:
            self._store = TransactionStore(self.registry.storage)
            self._staging = TransactionStaging(self.registry.storage)
        return self._store, self._staging

    async def start(self) -> None:
        """Take over every id this gateway coordinates that has a decision to finish or an open
        transaction (its timeout then runs from its start, not from now)."""
        store, _ = await asyncio.to_thread(self._open)
        saved = await asyncio.to_thread(store.load)
        self._listed = {tid: s.txn for tid, s in saved.items()}
        for tid, s in saved.items():
            if s.txn.open and self.owns(tid):
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

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._background:
            task.cancel()

    def _lock(self, tid: str) -> asyncio.Lock:
        lock = self._locks.get(tid)
        if lock is None:
            lock = self._locks[tid] = asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def _settled(self, tid: str) -> AsyncIterator[None]:
        """The id's lock, once no decision of it is being carried out in the background: a request
        of the producer's next transaction waits for the last one to land (woken when it has, no
        polling)."""
        while True:
            if (pending := self._completing.get(tid)) is not None:
                await asyncio.shield(pending)
                continue
            async with self._lock(tid):
                if tid in self._completing:  # decided while this request waited for the lock
                    continue
                yield
                return

    def release(self, tid: str) -> None:
        """Stop acting for an id (another gateway coordinates it now)."""
        self._txns.pop(tid, None)
        self._epochs.pop(tid, None)
        self._locks.pop(tid, None)
        if (timer := self._timers.pop(tid, None)) is not None:
            timer.cancel()
        for groups in self._pending_offsets.values():
            groups.pop(tid, None)

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
            return self._txns.get(tid)
        if len(self._epochs) >= self.settings.max_transactional_ids:
            raise CoordinatorNotAvailableError(
                f"This gateway coordinates {len(self._epochs)} transactional ids, its limit "
                "(transactions.max_transactional_ids); retry later or add gateways.",
            )
        store, _ = await asyncio.to_thread(self._open)
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
        if txn.state in (rules.PREPARE_COMMIT, rules.PREPARE_ABORT):
            await self._carry_out(txn, saved.decision or {})
        elif txn.state == rules.ONGOING:
            self._arm(txn)
        return self._txns.get(tid)

    async def _save(self, txn: Txn, decision: Mapping[str, Any] | None = None) -> None:
        tid = txn.transactional_id
        store, _ = self._open()
        try:
            await asyncio.to_thread(store.save, txn, self._epochs[tid], decision)
        except NotCoordinatorError:
            self.release(tid)
            raise
        self._txns[tid] = txn
        self._saves += 1
        if self._saves % COMPACT_EVERY == 0:  # the table to a row per id, idle ids expired
            expire = self.clock_ms() - self.settings.id_expiration_ms
            self._spawn(asyncio.to_thread(store.compact, min_rows=COMPACT_EVERY, expire_before_ms=expire))

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
        what it added there once need not be asked again. Raises: as `_add`, or the coordinator's
        refusal, CoordinatorNotAvailableError (it cannot be reached: the client retries)."""
        if self.owns(tid):
            await self._add(tid, producer_id, epoch, partitions=partitions, groups=groups)
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
    ) -> Txn:
        async with self._settled(tid):
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
                await self._save(nxt)
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
        async with self._settled(tid):
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
        carry it out: now, or (not `wait`) in the background, after the caller's lock."""
        if (timer := self._timers.pop(txn.transactional_id, None)) is not None:
            timer.cancel()
        _, staging = self._open()
        pid, staged_epoch = staged
        found = await asyncio.to_thread(staging.staged, txn.transactional_id, pid, staged_epoch)
        decision = {
            "producer_id": pid,
            "staged_epoch": staged_epoch,
            "records": [[s.topic, s.partition, s.base_sequence, s.path] for s in found.records],
            "offsets": [[o.group, o.path] for o in found.offsets],
        }
        await self._save(txn, decision)
        if wait:
            await self._carry_out(txn, decision)
            return
        tid = txn.transactional_id
        self._completing[tid] = asyncio.get_running_loop().create_future()
        self._spawn(self._finish(txn, decision))

    async def _finish(self, txn: Txn, decision: Mapping[str, Any]) -> None:
        """Carry out a decision in the background, retried while this gateway coordinates the id
        (a takeover finishes it otherwise); then wake the requests waiting for it."""
        tid = txn.transactional_id
        try:
            while True:
                try:
                    async with self._lock(tid):
                        if self._txns.get(tid) is not txn:  # released, or finished by a takeover
                            return
                        await self._carry_out(txn, decision)
                    return
                except Exception as exc:  # storage trouble, or a defect: the decision stands; try again
                    if tid not in self._epochs or not self.owns(tid):
                        return
                    log.warning(
                        "transactional id %r: transaction %d not carried out yet (%s); retrying",
                        tid,
                        txn.number,
                        exc,
                        exc_info=not isinstance(exc, TopiclakeError),
                    )
                    await asyncio.sleep(1.0)
        finally:
            if (done := self._completing.pop(tid, None)) is not None and not done.done():
                done.set_result(None)

    async def _carry_out(self, txn: Txn, decision: Mapping[str, Any]) -> None:
        """Finish a saved decision: land (commit) or drop (abort) the staged records and offsets,
        then save the transaction complete. Safe to run again after a crash at any step."""
        _, staging = self._open()
        tid = txn.transactional_id
        pid, staged_epoch = int(decision.get("producer_id", txn.producer_id)), int(decision.get("staged_epoch", -1))
        if txn.state == rules.PREPARE_COMMIT and staged_epoch >= 0:
            records = [StagedRecords(t, int(p), int(s), path) for t, p, s, path in decision.get("records", ())]
            await self._land_records(txn, pid, staged_epoch, records)
            await self._land_offsets(txn, pid, staged_epoch, decision.get("offsets", ()))
        if staged_epoch >= 0:
            await asyncio.to_thread(staging.drop, tid, pid, staged_epoch)
        for groups in self._pending_offsets.values():
            groups.pop(tid, None)
        await self._save(rules.complete(txn, now_ms=self.clock_ms()))
        log.info("transactional id %r: transaction %d %s", tid, txn.number, self._txns[tid].state)

    async def _land_records(self, txn: Txn, pid: int, staged_epoch: int, records: Sequence[StagedRecords]) -> None:
        """One append per topic (its partitions in one Delta commit), all topics at once. A file
        gone means its topic landed and the staging was dropped (a roll-forward after that)."""
        _, staging = self._open()
        by_topic: dict[str, list[StagedRecords]] = {}
        for r in records:
            by_topic.setdefault(r.topic, []).append(r)

        def read(topic: str) -> pa.Table | None:
            tables = staging.read_records(txn.transactional_id, pid, staged_epoch, by_topic[topic])
            return None if tables is None else pa.concat_tables([t.replace_schema_metadata(None) for t in tables])

        async def land(topic: str) -> None:
            batch = await asyncio.to_thread(read, topic)
            if batch is None or batch.num_rows == 0:
                return
            request = AppendRequest(
                batch=batch,
                producer=ProducerSequence(producer_id=landing_producer(pid), sequence=txn.number),
                urgent=True,
            )
            result = await self.land(topic, request)
            # a duplicate: this transaction landed before (answered with its offsets, or, when a later
            # transaction of the producer landed since, refused as older)
            if result.error is not None and not isinstance(result.error, DuplicateSequenceError):
                raise result.error

        await asyncio.gather(*(land(t) for t in sorted(by_topic)))

    async def _land_offsets(self, txn: Txn, pid: int, staged_epoch: int, offsets: Iterable[Sequence[str]]) -> None:
        _, staging = self._open()
        staged = [StagedOffsets(g, path) for g, path in offsets]
        if not staged:
            return

        rows = await asyncio.to_thread(staging.read_offsets, txn.transactional_id, pid, staged_epoch, staged) or []
        latest: dict[str, dict[tuple[str, int], OffsetCommit]] = {}
        for o in rows:
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
        for group, commits in sorted(latest.items()):
            await self.commit_offsets(group, list(commits.values()), (landing_producer(pid), txn.number))

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
        async with self._settled(tid):
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
        _, staging = await asyncio.to_thread(self._open)
        batch = request.batch
        parts = request.partition_array()
        touched = [int(p) for p in sorted(set(parts.tolist()))]
        if verify:
            await self._verify(txn, topic, touched)
        tid, b = txn.transactional_id, txn.batch

        def write() -> None:
            for p in touched:
                rows = batch.filter(pa.array(parts == p)) if len(touched) > 1 else batch
                staging.stage_records(tid, b.producer_id, b.producer_epoch, topic, p, b.sequence, rows, lane=b.lane)

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
            txn = rules.check_producer(self._txns.get(tid), tid, producer_id, epoch)
            if txn.state != rules.ONGOING or group not in txn.groups:
                raise InvalidTxnStateError(
                    f"Group {group!r} is not in an open transaction of {tid!r}: add it first "
                    "(sendOffsetsToTransaction does).",
                    transactional_id=tid,
                    group=group,
                )
        _, staging = await asyncio.to_thread(self._open)
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
        self._pending_offsets.setdefault(group, {}).setdefault(tid, set()).update(
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

    def unstable(self, group: str) -> set[tuple[str, int]]:
        """The group's partitions whose offsets an open transaction coordinated here commits
        (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        return set().union(*self._pending_offsets.get(group, {}).values())

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
