"""Kafka's transaction coordinator rules (KIP-98, KIP-360, KIP-447), as pure transitions of one
transactional id's state. Pure: a state and a request in, the next state (or Kafka's error) out.

A transactional id has one producer id and epoch at a time. InitProducerId bumps the epoch (and
so fences every older producer of the id: their requests get PRODUCER_FENCED); AddPartitionsToTxn
and AddOffsetsToTxn open a transaction (Ongoing) and name what it touches; EndTxn decides it
(PrepareCommit or PrepareAbort: the durable decision), and the coordinator completes it
(CompleteCommit, CompleteAbort) once every record and offset is landed or dropped. A transaction
open past its timeout is aborted by the coordinator with the epoch bumped, so the producer that
let it lapse is fenced.

Transaction version 2 (KIP-890 part 2: EndTxn v5) bumps the epoch at every EndTxn: the decision
is taken under the next epoch (a new producer id once the epoch is exhausted), which the producer
uses for its next transaction, so a write of the ended transaction that arrives late is fenced.

The states and their names are Kafka's (DescribeTransactions, ListTransactions report them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from delta_log.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidRecordError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
)

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
DEAD = "Dead"
PREPARE_EPOCH_FENCE = "PrepareEpochFence"
STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT, DEAD, PREPARE_EPOCH_FENCE)
#: a new transaction may start from these (AddPartitionsToTxn, AddOffsetsToTxn)
_IDLE = frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT})
_PREPARED = frozenset({PREPARE_COMMIT, PREPARE_ABORT})

#: Kafka's producer epochs are int16; at this epoch the coordinator rotates to a new producer id
MAX_EPOCH = 2**15 - 2
MAX_TRANSACTIONAL_ID_CHARS = 249

#: a (topic, partition) a transaction writes
TopicPartition = tuple[str, int]


def validate_transactional_id(transactional_id: str) -> None:
    """Raises: InvalidRecordError for an empty id or one over MAX_TRANSACTIONAL_ID_CHARS characters."""
    if not transactional_id or len(transactional_id) > MAX_TRANSACTIONAL_ID_CHARS:
        raise InvalidRecordError(
            f"A transactional id has 1-{MAX_TRANSACTIONAL_ID_CHARS} characters; got {len(transactional_id or '')}.",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Txn:
    """One transactional id's state: its producer, and its transaction if one is open or deciding."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    #: the epoch before the last bump (-1: none); a retried bump with it is answered again
    last_producer_epoch: int = -1
    #: the producer id before the last bump rotated it (-1: none): a retried EndTxn of that bump
    #: names it (transaction version 2)
    previous_producer_id: int = -1
    timeout_ms: int
    state: str = EMPTY
    #: when the open transaction began (-1: none open)
    start_ms: int = -1
    updated_ms: int = 0
    #: how many transactions this producer id has begun: names the current one in the topic tables
    number: int = 0
    partitions: frozenset[TopicPartition] = frozenset()
    groups: frozenset[str] = frozenset()

    @property
    def open(self) -> bool:
        """A transaction is open or being decided: its records and offsets are not visible yet."""
        return self.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT)

    def deadline_ms(self) -> int | None:
        """When the coordinator aborts the open transaction (None: none open)."""
        return self.start_ms + self.timeout_ms if self.state == ONGOING else None

    def snapshot(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "last_producer_epoch": self.last_producer_epoch,
            "previous_producer_id": self.previous_producer_id,
            "timeout_ms": self.timeout_ms,
            "state": self.state,
            "start_ms": self.start_ms,
            "updated_ms": self.updated_ms,
            "number": self.number,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "groups": sorted(self.groups),
        }

    @classmethod
    def of(cls, snapshot: dict[str, Any]) -> Txn:
        return cls(
            transactional_id=snapshot["transactional_id"],
            producer_id=int(snapshot["producer_id"]),
            producer_epoch=int(snapshot["producer_epoch"]),
            last_producer_epoch=int(snapshot["last_producer_epoch"]),
            previous_producer_id=int(snapshot.get("previous_producer_id", -1)),
            timeout_ms=int(snapshot["timeout_ms"]),
            state=str(snapshot["state"]),
            start_ms=int(snapshot["start_ms"]),
            updated_ms=int(snapshot["updated_ms"]),
            number=int(snapshot["number"]),
            partitions=frozenset((str(t), int(p)) for t, p in snapshot["partitions"]),
            groups=frozenset(snapshot["groups"]),
        )


@dataclass(frozen=True, slots=True)
class Initialized:
    """InitProducerId's outcome: the state to save and answer with; `fence`, the open transaction
    that must be aborted first (its producer is fenced by the bumped epoch), then init again."""

    txn: Txn
    fence: bool = False


def init_producer_id(
    current: Txn | None,
    transactional_id: str,
    timeout_ms: int,
    *,
    max_timeout_ms: int,
    expected: tuple[int, int] | None,
    new_producer_id: Callable[[], int],
    now_ms: int,
) -> Initialized:
    """InitProducerId with a transactional id: a new producer id (epoch 0) for a new id, else the
    next epoch of its producer id (a new id once the epoch is exhausted). An open transaction is
    first aborted under a bumped epoch (`fence`). `expected`: the (producer id, epoch) a producer
    re-initializing after an abortable error gives (KIP-360).

    Raises: InvalidTransactionTimeoutError, ConcurrentTransactionsError (a decision is completing:
    retry), ProducerFencedError (`expected` is not the id's producer)."""
    validate_transactional_id(transactional_id)
    if not 0 < timeout_ms <= max_timeout_ms:
        raise InvalidTransactionTimeoutError(
            f"transaction.timeout.ms must be between 1 and {max_timeout_ms} (the server's "
            f"transaction.max.timeout.ms); got {timeout_ms}.",
        )
    if current is None or current.state == DEAD:
        return Initialized(
            Txn(
                transactional_id=transactional_id,
                producer_id=new_producer_id(),
                producer_epoch=0,
                timeout_ms=timeout_ms,
                updated_ms=now_ms,
            )
        )
    if current.state in _PREPARED or current.state == PREPARE_EPOCH_FENCE:
        raise ConcurrentTransactionsError(transactional_id)
    if expected is not None:
        pid, epoch = expected
        if pid == current.producer_id and epoch == current.last_producer_epoch and current.state in _IDLE:
            return Initialized(dataclasses.replace(current, timeout_ms=timeout_ms))  # a retried bump
        if pid != current.producer_id or epoch != current.producer_epoch:
            raise ProducerFencedError(transactional_id, current.producer_epoch)
    if current.state == ONGOING:
        return Initialized(current, fence=True)
    nxt = dataclasses.replace(bumped(current, new_producer_id), last_producer_epoch=-1, previous_producer_id=-1)
    if nxt.producer_id == current.producer_id:
        nxt = dataclasses.replace(nxt, last_producer_epoch=current.producer_epoch)
    return Initialized(dataclasses.replace(nxt, state=EMPTY, timeout_ms=timeout_ms, updated_ms=now_ms, start_ms=-1))


def bumped(txn: Txn, new_producer_id: Callable[[], int]) -> Txn:
    """`txn` under the next epoch of its producer id, or a new producer id at epoch 0 once the
    epoch is exhausted; the one before is kept to recognise a retried request of the bump."""
    if txn.producer_epoch >= MAX_EPOCH:
        return dataclasses.replace(
            txn,
            producer_id=new_producer_id(),
            producer_epoch=0,
            last_producer_epoch=txn.producer_epoch,
            previous_producer_id=txn.producer_id,
        )
    return dataclasses.replace(
        txn, producer_epoch=txn.producer_epoch + 1, last_producer_epoch=txn.producer_epoch, previous_producer_id=-1
    )


def check_producer(current: Txn | None, transactional_id: str, producer_id: int, producer_epoch: int) -> Txn:
    """The id's state, if (producer id, epoch) is its current producer.

    Raises: InvalidProducerIdMappingError (unknown id, or another producer id), ProducerFencedError
    (an older epoch: a newer producer of the id initialized since)."""
    if current is None or current.state == DEAD or current.producer_id != producer_id:
        raise InvalidProducerIdMappingError(transactional_id)
    if current.producer_epoch != producer_epoch:
        raise ProducerFencedError(transactional_id, current.producer_epoch)
    return current


def add(
    current: Txn | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    *,
    partitions: Iterable[TopicPartition] = (),
    groups: Iterable[str] = (),
    now_ms: int,
) -> Txn:
    """AddPartitionsToTxn / AddOffsetsToTxn: open a transaction if none is, and add what it touches.
    Returns the same object when nothing changed (nothing to save).

    Raises: InvalidProducerIdMappingError, ProducerFencedError, ConcurrentTransactionsError (the
    previous transaction is completing: retry)."""
    txn = check_producer(current, transactional_id, producer_id, producer_epoch)
    if txn.state in _PREPARED or txn.state == PREPARE_EPOCH_FENCE:
        raise ConcurrentTransactionsError(transactional_id)
    new_partitions, new_groups = frozenset(partitions), frozenset(groups)
    if txn.state == ONGOING:
        if new_partitions <= txn.partitions and new_groups <= txn.groups:
            return txn
        return dataclasses.replace(
            txn, partitions=txn.partitions | new_partitions, groups=txn.groups | new_groups, updated_ms=now_ms
        )
    return dataclasses.replace(
        txn,
        state=ONGOING,
        start_ms=now_ms,
        updated_ms=now_ms,
        number=txn.number + 1,
        partitions=new_partitions,
        groups=new_groups,
    )


@dataclass(frozen=True, slots=True)
class Ending:
    """EndTxn's outcome: the decision to save and complete, or (`retry`) the same decision already
    complete (a retried EndTxn, answered with success)."""

    txn: Txn
    retry: bool = False


def end(
    current: Txn | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    *,
    commit: bool,
    now_ms: int,
    bump: Callable[[], int] | None = None,
) -> Ending:
    """EndTxn: decide the open transaction (PrepareCommit or PrepareAbort). With `bump` (transaction
    version 2; it makes a new producer id should the epoch be exhausted) the decision is taken
    under the next epoch, which the producer's next transaction uses; an abort with no transaction
    open is allowed (the producer cannot know whether its writes opened one) and bumps the epoch
    too; and a retried EndTxn names the epoch before the bump.

    Raises: InvalidProducerIdMappingError, ProducerFencedError, ConcurrentTransactionsError (the
    decision is completing: retry), InvalidTxnStateError (no transaction is open, or the other
    decision was taken)."""
    done, preparing = (COMPLETE_COMMIT, PREPARE_COMMIT) if commit else (COMPLETE_ABORT, PREPARE_ABORT)
    if bump is not None and current is not None and _retried_bump(current, producer_id, producer_epoch):
        if current.state == done:
            return Ending(current, retry=True)
        if current.state == preparing:
            raise ConcurrentTransactionsError(transactional_id)
        # the other decision was taken (a commit retried as an abort, or a transaction the
        # coordinator aborted at its timeout): Kafka's answer
        raise InvalidTxnStateError(
            f"Transactional id {transactional_id!r}'s transaction was {current.state}, not "
            f"{'committed' if commit else 'aborted'}; begin a new transaction.",
            transactional_id=transactional_id,
            state=current.state,
        )
    txn = check_producer(current, transactional_id, producer_id, producer_epoch)
    if txn.state == ONGOING:
        decided = dataclasses.replace(txn, state=preparing, updated_ms=now_ms)
        return Ending(decided if bump is None else bumped(decided, bump))
    if bump is not None and not commit and txn.state in _IDLE:
        return Ending(bumped(dataclasses.replace(txn, state=PREPARE_ABORT, updated_ms=now_ms), bump))
    if txn.state == done and bump is None:
        return Ending(txn, retry=True)
    if txn.state == preparing:
        raise ConcurrentTransactionsError(transactional_id)
    raise InvalidTxnStateError(
        f"Transactional id {transactional_id!r} has no open transaction to "
        f"{'commit' if commit else 'abort'} (it is {txn.state}).",
        transactional_id=transactional_id,
        state=txn.state,
    )


def _retried_bump(txn: Txn, producer_id: int, producer_epoch: int) -> bool:
    """(producer id, epoch) is the one the id's last bump replaced: a retry of that request."""
    return (
        txn.last_producer_epoch >= 0
        and producer_epoch == txn.last_producer_epoch
        and producer_id in (txn.producer_id, txn.previous_producer_id)
        and txn.state != ONGOING
    )


def fence_and_abort(txn: Txn, *, now_ms: int) -> Txn:
    """Abort the open transaction under a bumped epoch (a timeout, or a new producer of the id):
    the producer that opened it is fenced, and cannot commit it any more."""
    assert txn.state == ONGOING, txn.state
    return dataclasses.replace(
        txn,
        state=PREPARE_ABORT,
        producer_epoch=txn.producer_epoch + 1,
        last_producer_epoch=txn.producer_epoch,
        updated_ms=now_ms,
    )


def complete(txn: Txn, *, now_ms: int) -> Txn:
    """The decision carried out: every record and offset landed (commit) or dropped (abort)."""
    assert txn.state in _PREPARED, txn.state
    return dataclasses.replace(
        txn,
        state=COMPLETE_COMMIT if txn.state == PREPARE_COMMIT else COMPLETE_ABORT,
        start_ms=-1,
        updated_ms=now_ms,
        partitions=frozenset(),
        groups=frozenset(),
    )


def timed_out(txn: Txn, now_ms: int) -> bool:
    deadline = txn.deadline_ms()
    return deadline is not None and deadline <= now_ms
