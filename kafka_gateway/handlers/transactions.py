"""Kafka's transactions: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and
EndTxn, through broker.transactions (one coordinator per transactional id, for every face); and
what kafka-transactions asks: ListTransactions, DescribeTransactions, DescribeProducers.

- The transaction protocol of every client (KIP-98, KIP-360, KIP-447, KIP-890), by request
  version as Kafka's broker serves it: transaction version 2 (finalized in ApiVersions; Java 4.x
  and franz-go use it) has Produce v12 and TxnOffsetCommit v5 add to the transaction and EndTxn v5
  bump the epoch; the TV1 flow (AddPartitionsToTxn up to v3, EndTxn up to v4) is librdkafka's and
  older clients' (docs/KAFKA.md).
- Errors to clients before PRODUCER_FENCED existed (InitProducerId < v4, EndTxn, AddOffsetsToTxn
  and AddPartitionsToTxn < v2) are INVALID_PRODUCER_EPOCH, as Kafka answers them.
- InitProducerId without a transactional id is an idempotent producer's: a producer id is 63
  random bits (no service hands them out; a collision needs about 3e9 producers alive at once),
  epoch 0; a producer that asks again with its id gets epoch + 1.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from kio.schema.errors import ErrorCode

from broker.transactions import OffsetCommit, rules
from delta_log.errors import TopiclakeError
from kafka_gateway.apis import api
from kafka_gateway.errors import code_of
from kafka_gateway.messages import millis
from kafka_gateway.session import Session


def _code(exc: TopiclakeError, version: int, fenced_since: int) -> ErrorCode:
    """Kafka's code for `exc`, PRODUCER_FENCED as INVALID_PRODUCER_EPOCH before `fenced_since`."""
    code = code_of(exc)
    if code == ErrorCode.producer_fenced and version < fenced_since:
        return ErrorCode.invalid_producer_epoch
    return code


@api(22, "InitProducerId", 0, 5)
async def init_producer_id(conn: Session, request: Any, version: int) -> dict[str, Any]:
    assert conn.principal is not None
    none = {"throttle_time": 0, "producer_id": -1, "producer_epoch": -1}
    known = getattr(request, "producer_id", -1)
    known_epoch = getattr(request, "producer_epoch", -1)
    if (known < 0) != (known_epoch < 0):
        return none | {"error_code": ErrorCode.invalid_request}
    tid = request.transactional_id
    if tid is not None:
        try:
            txn = await conn.services.transactions.init_producer_id(
                conn.principal,
                tid,
                millis(request.transaction_timeout),
                (known, known_epoch) if known >= 0 else None,
            )
        except TopiclakeError as exc:
            return none | {"error_code": _code(exc, version, 4)}
        return {
            "throttle_time": 0,
            "error_code": 0,
            "producer_id": txn.producer_id,
            "producer_epoch": txn.producer_epoch,
        }
    if not conn.principal.allows("produce", None):
        return none | {"error_code": ErrorCode.cluster_authorization_failed}
    if known >= 0:  # a producer re-initializing (KIP-360): same id, next epoch
        epoch = known_epoch + 1
        if epoch < 2**15 - 1:
            return {"throttle_time": 0, "error_code": 0, "producer_id": known, "producer_epoch": epoch}
    return {"throttle_time": 0, "error_code": 0, "producer_id": secrets.randbits(63), "producer_epoch": 0}


@api(24, "AddPartitionsToTxn", 0, 3)
async def add_partitions_to_txn(conn: Session, request: Any, version: int) -> dict[str, Any]:
    assert conn.principal is not None
    wanted = [(t.name, int(p)) for t in request.v3_and_below_topics for p in t.partitions]
    results: dict[tuple[str, int], int] = {}
    try:
        refused = await conn.services.transactions.add_partitions(
            conn.principal,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            wanted,
        )
    except TopiclakeError as exc:
        results = dict.fromkeys(wanted, _code(exc, version, 2))
    else:
        failed = any(e is not None for e in refused.values())
        for tp, error in refused.items():
            if error is not None:
                results[tp] = code_of(error)
            else:  # Kafka: the others of a request with a refused partition are not attempted
                results[tp] = ErrorCode.operation_not_attempted if failed else ErrorCode.none
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (t, p), code in results.items():
        by_topic.setdefault(t, []).append({"partition_index": p, "partition_error_code": code})
    return {
        "throttle_time": 0,
        "results_by_topic_v3_and_below": [{"name": t, "results_by_partition": ps} for t, ps in by_topic.items()],
    }


@api(25, "AddOffsetsToTxn", 0, 4)
async def add_offsets_to_txn(conn: Session, request: Any, version: int) -> dict[str, Any]:
    assert conn.principal is not None
    try:
        await conn.services.transactions.add_offsets(
            conn.principal, request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
        )
    except TopiclakeError as exc:
        code = _code(exc, version, 2)
        return {"throttle_time": 0, "error_code": code}
    return {"throttle_time": 0, "error_code": 0}


@api(26, "EndTxn", 0, 5)
async def end_txn(conn: Session, request: Any, version: int) -> dict[str, Any]:
    """Answered once the decision is saved, as Kafka answers after PrepareCommit: the records and
    offsets land right after (read_committed readers see them then). v5 is transaction version 2:
    the epoch is bumped at every EndTxn, and the answer names the producer id and epoch of the
    producer's next transaction, which goes on while this one lands (before v5 its requests wait
    for the landing)."""
    assert conn.principal is not None
    try:
        txn = await conn.services.transactions.end_txn(
            conn.principal,
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            commit=bool(request.committed),
            bump=version >= 5,
            wait=False,  # answered once decided, as Kafka's coordinator answers after PrepareCommit
        )
    except TopiclakeError as exc:
        return {"throttle_time": 0, "error_code": _code(exc, version, 2), "producer_id": -1, "producer_epoch": -1}
    return {"throttle_time": 0, "error_code": 0, "producer_id": txn.producer_id, "producer_epoch": txn.producer_epoch}


@api(28, "TxnOffsetCommit", 0, 5)
async def txn_offset_commit(conn: Session, request: Any, version: int) -> dict[str, Any]:
    """Sent to the group's coordinator: the member is checked as for OffsetCommit (v3+ carries it),
    and the offsets are kept with the transaction until it commits; v5 (transaction version 2)
    adds the group to the transaction (no AddOffsetsToTxn before it)."""
    assert conn.principal is not None
    principal = conn.principal
    group = request.group_id
    member_id = getattr(request, "member_id", "") or None
    generation = getattr(request, "generation_id", -1)
    commits = [
        OffsetCommit(
            group=group,
            topic=t.name,
            partition=p.partition_index,
            offset=p.committed_offset,
            metadata=p.committed_metadata or "",
            member_id=member_id or "",
            generation=generation,
        )
        for t in request.topics
        for p in t.partitions
    ]
    code = ErrorCode.none
    try:
        await conn.services.transactions.txn_offset_commit(
            principal,
            conn.services.coordinator,
            request.transactional_id,
            group,
            request.producer_id,
            request.producer_epoch,
            commits,
            member_id=member_id,
            generation=generation,
            implicit=version >= 5,
        )
    except TopiclakeError as exc:
        code = _code(exc, version, 0)
    topics: dict[str, list[dict[str, Any]]] = {}
    for c in commits:
        topics.setdefault(c.topic, []).append({"partition_index": c.partition, "error_code": code})
    return {"throttle_time": 0, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}


@api(66, "ListTransactions", 0, 1)
async def list_transactions(conn: Session, request: Any, version: int) -> dict[str, Any]:
    """The transactional ids this gateway coordinates that the key may describe (the admin client
    asks every broker), filtered by state, producer id and (v1) how long they have been open."""
    assert conn.principal is not None
    states = {str(f) for f in request.state_filters}
    unknown = sorted(states - set(rules.STATES))
    pids = set(request.producer_id_filters)
    older_than = getattr(request, "duration_filter", -1)
    now = int(time.time() * 1000)
    listed = [
        {"transactional_id": t.transactional_id, "producer_id": t.producer_id, "transaction_state": t.state}
        for t in conn.services.transactions.transactions()
        if conn.principal.allows_transactional_id("describe", t.transactional_id)
        and (not states or t.state in states)
        and (not pids or t.producer_id in pids)
        and (older_than < 0 or (t.start_ms >= 0 and now - t.start_ms > older_than))
    ]
    return {"throttle_time": 0, "error_code": 0, "unknown_state_filters": unknown, "transaction_states": listed}


@api(65, "DescribeTransactions", 0, 0)
async def describe_transactions(conn: Session, request: Any, version: int) -> dict[str, Any]:
    assert conn.principal is not None
    principal = conn.principal
    out = []
    for tid in request.transactional_ids:
        none = {
            "transactional_id": tid,
            "transaction_state": "",
            "transaction_timeout": 0,
            "transaction_start_time": -1,
            "producer_id": -1,
            "producer_epoch": -1,
            "topics": [],
        }
        try:
            txn = await conn.services.transactions.describe(principal, tid)
        except TopiclakeError as exc:
            out.append(none | {"error_code": code_of(exc)})
            continue
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(txn.partitions):
            if principal.allows("describe", t):
                by_topic.setdefault(t, []).append(p)
        out.append(
            {
                "error_code": 0,
                "transactional_id": tid,
                "transaction_state": txn.state,
                "transaction_timeout": txn.timeout_ms,
                "transaction_start_time": txn.start_ms,
                "producer_id": txn.producer_id,
                "producer_epoch": txn.producer_epoch,
                "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
            }
        )
    return {"throttle_time": 0, "transaction_states": out}


@api(61, "DescribeProducers", 0, 0)
async def describe_producers(conn: Session, request: Any, version: int) -> dict[str, Any]:
    """A partition's producers with an open transaction that writes it (coordinated here). Their
    records are not in the log yet, so no transaction start offset is known (-1): nothing can
    hang a partition's last stable offset (docs/KAFKA.md)."""
    assert conn.principal is not None
    principal = conn.principal
    open_txns = [t for t in conn.services.transactions.transactions() if t.state == rules.ONGOING]
    topics = []
    for t in request.topics:
        allowed = principal.allows("describe", t.name)
        parts = []
        for p in t.partition_indexes:
            if not allowed:
                parts.append(
                    {
                        "partition_index": p,
                        "error_code": ErrorCode.topic_authorization_failed,
                        "error_message": None,
                        "active_producers": [],
                    }
                )
                continue
            active = [
                {
                    "producer_id": txn.producer_id,
                    "producer_epoch": txn.producer_epoch,
                    "last_sequence": -1,
                    "last_timestamp": txn.updated_ms,
                    "coordinator_epoch": 0,
                    "current_txn_start_offset": -1,
                }
                for txn in open_txns
                if (t.name, p) in txn.partitions
            ]
            parts.append({"partition_index": p, "error_code": 0, "error_message": None, "active_producers": active})
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
