"""Transactions over HTTP: the same coordinator, fencing and timeouts as Kafka's (broker.transactions).

    POST /transactions/{id}/init     a producer of the id: its producer id and epoch (older ones fenced)
    POST /topics/{t}/records         with Transactional-Id, Transactional-Producer ("<id>.<epoch>"),
                                     Producer-Id and Producer-Sequence: staged with the transaction
    POST /transactions/{id}/partitions  partitions and groups joining the transaction (as a write
                                     does; a gateway asks the id's coordinator so for a write it took)
    POST /transactions/{id}/offsets  a group's offsets, committed with the transaction
    POST /transactions/{id}/commit   every record and offset visible at once (answered after)
    POST /transactions/{id}/abort    none of them, ever
    GET  /transactions/{id}, GET /transactions

A transaction begins with its first write (records or offsets) after init or after the previous
one ended; its partitions and groups join it as they are written. The routes of one id are served
by its coordinator gateway (ingest_gateway.kit.forwarding forwards them there).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from broker.services import Services
from broker.transactions import OffsetCommit, Txn
from delta_log.core.acl import Principal, authorize
from ingest_gateway.kit.dependencies import PrincipalDep, ServicesDep
from ingest_gateway.kit.params import TransactionalIdPath
from ingest_gateway.schemas import (
    InitTransaction,
    TransactionAdd,
    TransactionList,
    TransactionOffsets,
    TransactionPartitions,
    TransactionProducer,
    TransactionState,
)

router = APIRouter(prefix="/transactions", tags=["transactions"])


def _state(txn: Txn, principal: Principal) -> TransactionState:
    by_topic: dict[str, list[int]] = {}
    for t, p in sorted(txn.partitions):
        if principal.allows("describe", t):
            by_topic.setdefault(t, []).append(p)
    return TransactionState(
        transactional_id=txn.transactional_id,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        state=txn.state,
        timeout_ms=txn.timeout_ms,
        start_ms=txn.start_ms if txn.start_ms >= 0 else None,
        topics=[TransactionPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()],
        groups=sorted(txn.groups),
    )


@router.post("/{transactional_id}/init", response_model=TransactionState)
async def init(
    transactional_id: TransactionalIdPath, body: InitTransaction, principal: PrincipalDep, services: ServicesDep
) -> TransactionState:
    """Become the id's producer: its producer id and a new epoch. A transaction the id left open is
    aborted, and the producers before this one are fenced (409 PRODUCER_FENCED from now on)."""
    txn = await services.transactions.init_producer_id(principal, transactional_id, body.timeout_ms)
    return _state(txn, principal)


@router.post("/{transactional_id}/partitions", response_model=TransactionState)
async def add(
    transactional_id: TransactionalIdPath, body: TransactionAdd, principal: PrincipalDep, services: ServicesDep
) -> TransactionState:
    """Add partitions (the key may produce to their topics) and groups (the key may read them) to
    the producer's transaction, beginning one if none is open: what a transactional write does
    itself, and what a gateway that took a write of Kafka's transaction version 2 asks the id's
    coordinator (as a Kafka partition leader does)."""
    partitions = [(p.topic, p.partition) for p in body.partitions]
    await services.transactions.add(
        principal, transactional_id, body.producer_id, body.producer_epoch, partitions=partitions, groups=body.groups
    )
    return await _described(transactional_id, principal, services)


@router.post("/{transactional_id}/offsets", response_model=TransactionState)
async def offsets(
    transactional_id: TransactionalIdPath, body: TransactionOffsets, principal: PrincipalDep, services: ServicesDep
) -> TransactionState:
    """Commit a group's offsets with the transaction: the group's table shows them once it commits.
    With `member_id`/`generation` the member is checked as for POST /groups/{g}/offsets."""
    transactions = services.transactions
    commits = [
        OffsetCommit(
            group=body.group,
            topic=o.topic,
            partition=o.partition,
            offset=o.offset,
            metadata=o.metadata,
            member_id=body.member_id or "",
            generation=-1 if body.generation is None else body.generation,
        )
        for o in body.offsets
    ]
    for c in commits:
        authorize(principal, "consume", c.topic)
    await transactions.add_offsets(principal, transactional_id, body.producer_id, body.producer_epoch, body.group)
    await transactions.txn_offset_commit(
        principal,
        services.coordinator,
        transactional_id,
        body.group,
        body.producer_id,
        body.producer_epoch,
        commits,
        member_id=body.member_id,
        generation=-1 if body.generation is None else body.generation,
    )
    return await _described(transactional_id, principal, services)


@router.post("/{transactional_id}/commit", response_model=TransactionState)
async def commit(
    transactional_id: TransactionalIdPath, body: TransactionProducer, principal: PrincipalDep, services: ServicesDep
) -> TransactionState:
    """Commit: every record and offset of the transaction becomes visible, all at once per topic
    (one Delta commit each), and the answer comes after. A retry after a lost answer is answered
    again."""
    await services.transactions.end_txn(principal, transactional_id, body.producer_id, body.producer_epoch, commit=True)
    return await _described(transactional_id, principal, services)


@router.post("/{transactional_id}/abort", response_model=TransactionState)
async def abort(
    transactional_id: TransactionalIdPath, body: TransactionProducer, principal: PrincipalDep, services: ServicesDep
) -> TransactionState:
    """Abort: none of the transaction's records or offsets ever reaches a table."""
    await services.transactions.end_txn(
        principal, transactional_id, body.producer_id, body.producer_epoch, commit=False
    )
    return await _described(transactional_id, principal, services)


@router.get("/{transactional_id}", response_model=TransactionState)
async def describe(
    transactional_id: TransactionalIdPath, principal: PrincipalDep, services: ServicesDep
) -> TransactionState:
    """The id's state (Kafka's DescribeTransactions): its producer, and its open transaction's
    partitions and groups."""
    return await _described(transactional_id, principal, services)


async def _described(transactional_id: str, principal: Principal, services: Services) -> TransactionState:
    return _state(await services.transactions.describe(principal, transactional_id), principal)


@router.get("", response_model=TransactionList)
async def listing(
    principal: PrincipalDep,
    services: ServicesDep,
    state: Annotated[str | None, Query(max_length=32, description="Only ids in this state.")] = None,
) -> TransactionList:
    """The transactional ids this gateway coordinates that this key may describe (each gateway of
    a cluster lists its own, as each Kafka broker does)."""
    return TransactionList(
        transactions=[
            _state(t, principal)
            for t in services.transactions.transactions()
            if principal.allows_transactional_id("describe", t.transactional_id) and (state is None or t.state == state)
        ]
    )
