"""ListOffsets (earliest, latest, by timestamp), DeleteRecords (the log start offset moves up:
delta_log.maintenance.delete_records) and OffsetForLeaderEpoch (partitions have no
leader epochs: the answer is the high watermark, which is all a client validating a position
needs)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from broker import admin
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
    if topic in INTERNAL_TOPICS:  # read as empty (docs/KAFKA.md)
        if not 0 <= partition < INTERNAL_TOPICS[topic]:
            raise PartitionNotFoundError(topic, partition, INTERNAL_TOPICS[topic])
        return out | {"offset": 0 if timestamp in (LATEST, EARLIEST, EARLIEST_LOCAL) else -1, "old_style_offsets": [0]}
    reader = conn.services.registry.reader(topic)
    if timestamp in (LATEST, MAX_TIMESTAMP):
        hw = reader.resolve_offsets("latest", partitions=[partition])[partition]
        if timestamp == LATEST:
            return out | {"offset": hw, "old_style_offsets": [hw]}
        if hw == reader.log_start_offset(partition):
            return out | {"offset": -1}
        last = reader.fetch(partition, hw - 1, max_records=1).records  # Kafka: the newest record's
        ms = last.column("timestamp").cast("int64")[0].as_py() // 1000 if last.num_rows else -1
        return out | {"offset": hw - 1, "timestamp": ms}
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        lso = reader.resolve_offsets("earliest", partitions=[partition])[partition]
        return out | {"offset": lso, "old_style_offsets": [lso]}
    if timestamp == LATEST_TIERED or timestamp < 0:
        return out | {"offset": -1}
    found = reader.offset_for_timestamp(partition, timestamp)
    if found is None:  # no record at or after the time
        return out | {"offset": -1}
    record = reader.fetch(partition, found, max_records=1).records
    ms = record.column("timestamp").cast("int64")[0].as_py() // 1000 if record.num_rows else timestamp
    return out | {"offset": found, "timestamp": ms}


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
    assert conn.principal is not None
    principal = conn.principal

    def answer(topic: str, p: Any) -> dict[str, Any]:
        authorize(principal, "describe", topic)
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
        authorize(principal, "describe", topic)
        hw = conn.services.registry.reader(topic).high_watermark(p.partition)
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
