"""ListOffsets (earliest, latest, by timestamp), DeleteRecords (the log start offset moves up:
delta_log.maintenance.delete_records) and OffsetForLeaderEpoch (partitions have no
leader epochs: the answer is the high watermark, which is all a client validating a position
needs)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Literal

from broker import admin, fetch
from delta_log.core.acl import authorize
from delta_log.core.topic_config import INTERNAL_TOPICS
from delta_log.errors import PartitionNotFoundError, TopiclakeError
from kafka_gateway.apis import api
from kafka_gateway.errors import code_of
from kafka_gateway.session import Session

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5


def _list_offset(conn: Session, topic: str, partition: int, timestamp: int) -> dict[str, Any]:
    out: dict[str, Any] = {"partition_index": partition, "error_code": 0, "timestamp": -1, "leader_epoch": -1}
    assert conn.principal is not None
    if topic in INTERNAL_TOPICS or timestamp <= LATEST_TIERED:  # answered without reading the log
        authorize(conn.principal, "describe", topic)
    if topic in INTERNAL_TOPICS:  # read as empty (docs/KAFKA.md)
        if not 0 <= partition < INTERNAL_TOPICS[topic]:
            raise PartitionNotFoundError(topic, partition, INTERNAL_TOPICS[topic])
        return out | {"offset": 0 if timestamp in (LATEST, EARLIEST, EARLIEST_LOCAL) else -1, "old_style_offsets": [0]}
    if timestamp <= LATEST_TIERED:  # no tiered storage; no other special timestamp is known
        return out | {"offset": -1}
    at: Literal["earliest", "latest", "max_timestamp", "timestamp"] = _SPECS.get(timestamp, "timestamp")
    (found,) = fetch.list_offsets(
        conn.services.registry,
        conn.principal,
        topic,
        at,
        timestamp_ms=timestamp,
        partitions=[partition],
        action="describe",
    )
    offset = -1 if found.offset is None else found.offset
    if at in ("earliest", "latest"):
        return out | {"offset": offset, "old_style_offsets": [offset]}
    return out | {"offset": offset, "timestamp": found.timestamp_ms}


#: Kafka's special timestamps -> the lookup (EARLIEST_LOCAL: every record is local)
_SPECS: dict[int, Literal["earliest", "latest", "max_timestamp"]] = {
    LATEST: "latest",
    EARLIEST: "earliest",
    EARLIEST_LOCAL: "earliest",
    MAX_TIMESTAMP: "max_timestamp",
}


def each_partition(
    topics: Iterable[Any],
    topic_field: str,
    answer: Callable[[str, Any], dict[str, Any]],
    failed: Callable[[Any], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The per-topic, per-partition answer most requests have: `answer(topic, partition request)`,
    or for a partition whose answer raised, `failed(partition request)` with the error's code
    (an ACL the caller lacks included: TOPIC_AUTHORIZATION_FAILED)."""
    out = []
    for t in topics:
        name = getattr(t, topic_field)
        parts = []
        for p in t.partitions:
            try:
                parts.append(answer(name, p))
            except TopiclakeError as exc:
                parts.append(failed(p) | {"error_code": code_of(exc)})
        out.append({topic_field: name, "partitions": parts})
    return out


def _list_offsets(conn: Session, request: Any) -> dict[str, Any]:
    def answer(topic: str, p: Any) -> dict[str, Any]:
        return _list_offset(conn, topic, p.partition_index, p.timestamp)

    topics = each_partition(
        request.topics, "name", answer, lambda p: {"partition_index": p.partition_index, "offset": -1}
    )
    return {"throttle_time": 0, "topics": topics}


@api(2, "ListOffsets", 1, 9)
async def list_offsets(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return await asyncio.to_thread(_list_offsets, conn, request)


def _end_offsets(conn: Session, request: Any) -> dict[str, Any]:
    assert conn.principal is not None
    principal = conn.principal

    def answer(topic: str, p: Any) -> dict[str, Any]:
        (found,) = fetch.list_offsets(
            conn.services.registry, principal, topic, "latest", partitions=[p.partition], action="describe"
        )
        hw = found.high_watermark
        return {"partition": p.partition, "leader_epoch": -1, "end_offset": hw, "error_code": 0}

    def failed(p: Any) -> dict[str, Any]:
        return {"partition": p.partition, "leader_epoch": -1, "end_offset": -1}

    return {"throttle_time": 0, "topics": each_partition(request.topics, "topic", answer, failed)}


@api(23, "OffsetForLeaderEpoch", 2, 4)
async def offset_for_leader_epoch(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return await asyncio.to_thread(_end_offsets, conn, request)


def _delete_records(conn: Session, request: Any) -> dict[str, Any]:
    assert conn.principal is not None
    principal = conn.principal

    def answer(topic: str, p: Any) -> dict[str, Any]:
        low = admin.delete_records(conn.services.registry, principal, topic, p.partition_index, p.offset)
        return {"partition_index": p.partition_index, "low_watermark": low, "error_code": 0}

    def failed(p: Any) -> dict[str, Any]:
        return {"partition_index": p.partition_index, "low_watermark": -1}

    return {"throttle_time": 0, "topics": each_partition(request.topics, "name", answer, failed)}


@api(21, "DeleteRecords", 0, 2)
async def delete_records(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return await asyncio.to_thread(_delete_records, conn, request)
