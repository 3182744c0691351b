"""Produce: each partition's record batches -> Arrow columns (compiled codec) -> broker.produce,
the same rules as HTTP (ACLs, schema checks, dead letters, partition checks, idempotence).

- acks 1 and all are both answered after the Delta commit (there is one copy: the table); acks 0
  gets no answer, and the connection closes if a partition failed (Kafka's way of telling).
- A partition this gateway does not lead (own) is refused with NOT_LEADER_OR_FOLLOWER; the
  client refreshes its metadata and sends it to the owner.
- Idempotent producers: producer id and epoch name the producer (`k<id>.<epoch>`); a batch's
  sequence range is checked by the writer's rules (delta_log.core.producer): a retried batch is
  answered with its first offsets, an older one with DUPLICATE_SEQUENCE_NUMBER, a gap with
  OUT_OF_ORDER_SEQUENCE_NUMBER, whichever gateway the retry reaches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from kio.schema.errors import ErrorCode

from broker.produce import INLINE_DECODE_BYTES, ProducePlan, has_value_schema, plan_produce, submit
from delta_log.core.producer import KAFKA_SEQUENCES, ProducerSequence
from delta_log.core.records import HEADERS_TYPE, TIMESTAMP_TYPE
from delta_log.errors import InvalidRecordError, TopiclakeError, TransactionalRecordsError
from delta_log.log.writer import AppendResult
from delta_log.registry import Committer
from kafka_gateway.apis import api
from kafka_gateway.errors import code_of, message_of
from kafka_gateway.records import DecodedBatches, decode_batches
from kafka_gateway.session import Session


def kafka_producer_id(producer_id: int, epoch: int) -> str:
    return f"k{producer_id}.{epoch}"


def _table(decoded: DecodedBatches, partition: int) -> pa.Table:
    ms = decoded.timestamp_ms
    micros = pc.multiply(ms, 1000).cast(pa.int64())
    no_time = pc.less(ms, 0)  # Kafka's -1: no timestamp, the server's time is used
    ts = pc.if_else(no_time, pa.scalar(None, pa.int64()), micros).cast(TIMESTAMP_TYPE)
    n = len(decoded.value)
    return pa.table(
        {
            "key": decoded.key,
            "value": decoded.value,
            "partition": pa.array([partition] * n, pa.int32()) if n < 64 else pa.repeat(partition, n).cast(pa.int32()),
            "timestamp": ts,
            "headers": decoded.headers.cast(HEADERS_TYPE),
        }
    )


def _producer(decoded: DecodedBatches) -> ProducerSequence | None:
    """The idempotent producer's sequence range of the partition's batches (None: not idempotent).

    Raises: InvalidRecordError (batches of several producers, or sequences that do not follow)."""
    first = decoded.batches[0]
    if first.producer_id < 0 or first.base_sequence < 0:
        return None
    expected = first.base_sequence
    for b in decoded.batches:
        if (b.producer_id, b.producer_epoch) != (
            first.producer_id,
            first.producer_epoch,
        ) or b.base_sequence != expected:
            raise InvalidRecordError("The batches of one partition must be of one producer, in sequence.")
        expected = (b.base_sequence + b.record_count) % KAFKA_SEQUENCES  # int32 sequences wrap to 0
    return ProducerSequence(
        producer_id=kafka_producer_id(first.producer_id, first.producer_epoch),
        sequence=(expected - 1) % KAFKA_SEQUENCES,
        first_sequence=first.base_sequence,
    )


@dataclass(slots=True)
class _Partition:
    index: int
    error: int = 0
    message: str | None = None
    record_errors: list[dict[str, Any]] | None = None
    waiting: asyncio.Future[AppendResult] | None = None
    dead: asyncio.Future[AppendResult] | None = None
    base_offset: int = -1
    log_append_time: int = -1


@dataclass(slots=True)
class _Planned:
    """One partition's records, checked and partitioned by produce's rules, ready to submit."""

    out: _Partition
    topic: str
    plan: ProducePlan | None = None
    committer: Committer | None = None
    dead_committer: Committer | None = None


def _plan(conn: Session, topic: str, records: bytes, partition: int, budget: list[int]) -> tuple[ProducePlan, bool]:
    """Decode and apply produce's rules (blocking); `budget` holds the decompressed bytes the
    request may still take (one budget for all its partitions). Raises: TopiclakeError."""
    assert conn.principal is not None
    reader = conn.services.registry.reader(topic)
    decoded = decode_batches(
        records, max_records=conn.services.settings.reader.max_fetch_records, max_bytes=max(budget[0], 1)
    )
    budget[0] -= decoded.value.nbytes + decoded.key.nbytes
    if any(b.is_transactional or b.is_control for b in decoded.batches):
        raise TransactionalRecordsError("Transactions are not supported yet (docs/KAFKA.md).")
    producer = _producer(decoded)
    plan = plan_produce(
        conn.services.registry,
        conn.principal,
        topic,
        _table(decoded, partition),
        producer,
        codec=decoded.batches[-1].compression if decoded.batches else "none",
    )
    return plan, reader.config.log_append_time


def _plan_all(conn: Session, work: list[tuple[bytes, _Planned]]) -> None:
    """Decode and plan every partition of a request (blocking), and open the committers they
    need, so all of them are handed to the writers at once: one request, one flush."""
    registry = conn.services.registry
    budget = [conn.settings.max_request_bytes]  # decompressed, for the whole request
    for records, item in work:
        out = item.out
        try:
            item.plan, log_append = _plan(conn, item.topic, records, out.index, budget)
            if item.plan.prepared is not None:
                item.committer = registry.committer(item.topic)
            if item.plan.dead is not None:
                item.dead_committer = registry.committer(item.plan.dead.topic)
        except TopiclakeError as exc:
            out.error, out.message = code_of(exc), message_of(exc)
            shown = exc.details.get("records")
            if shown:
                out.record_errors = [
                    {"batch_index": r["index"], "batch_index_error_message": r["reason"]} for r in shown
                ]
            continue
        if log_append:
            out.log_append_time = int(time.time() * 1000)


def _submit(conn: Session, item: _Planned) -> None:
    """Hand a planned partition to the writers (in arrival order: called on the loop, request by
    request); the dead letters first, so a failure after them leaves none of the valid records."""
    plan, out = item.plan, item.out
    if plan is None:
        return
    try:
        if plan.dead is not None and item.dead_committer is not None:
            out.dead = submit(plan.dead.append.append, item.dead_committer)
        if plan.prepared is not None and item.committer is not None:
            out.waiting = submit(plan.prepared.append, item.committer)
    except TopiclakeError as exc:  # back-pressure, or a writer released meanwhile: the client retries
        out.error, out.message = code_of(exc), message_of(exc)


async def _finish(out: _Partition) -> dict[str, Any]:
    try:
        if out.dead is not None:
            dead = await out.dead
            if dead.error is not None:
                raise dead.error
            if out.waiting is None:
                out.base_offset = dead.ranges[0].base_offset if dead.ranges else -1
        if out.waiting is not None:
            result = await out.waiting
            if result.error is not None:
                raise result.error
            out.base_offset = result.ranges[0].base_offset if result.ranges else -1
    except TopiclakeError as exc:
        out.error, out.message = code_of(exc), message_of(exc)
    except Exception as exc:
        out.error, out.message = ErrorCode.unknown_server_error, message_of(exc)
    return {
        "index": out.index,
        "error_code": out.error,
        "base_offset": out.base_offset if not out.error else -1,
        "log_append_time": out.log_append_time,
        "log_start_offset": -1,
        "record_errors": out.record_errors or [],
        "error_message": out.message,
    }


async def _partition_counts(conn: Session, topic_data: list[Any]) -> dict[str, int | TopiclakeError]:
    """Each topic's partition count: of open topics as read lately (no I/O; read afresh when a
    partition the request names is past it: one added since), the others in ONE thread hop for
    the request (not one per topic: a request may name hundreds)."""
    registry = conn.services.registry
    out: dict[str, int | TopiclakeError] = {}
    for t in topic_data:
        n = registry.recent_partitions(t.name)
        if n is not None and all(p.index < n for p in t.partition_data):
            out[t.name] = n
    missing = [t.name for t in topic_data if t.name not in out]
    if missing:

        def read() -> dict[str, int | TopiclakeError]:
            got: dict[str, int | TopiclakeError] = {}
            for name in missing:
                try:
                    got[name] = registry.partitions(name)
                except TopiclakeError as exc:
                    got[name] = exc
            return got

        out |= await asyncio.to_thread(read)
    return out


def _refusal(conn: Session, request: Any, topic: str) -> tuple[int, str | None]:
    """Why the request may not write `topic` at all (Kafka's error code and message), or (0, None)."""
    assert conn.principal is not None
    if request.transactional_id is not None:
        return ErrorCode.transactional_id_authorization_failed, "Transactions are not supported yet."
    if request.acks not in (0, 1, -1):
        return ErrorCode.invalid_required_acks, "acks must be 0, 1 or all (-1)."
    if not conn.principal.allows("produce", topic):
        return ErrorCode.topic_authorization_failed, f"No produce ACL on topic {topic!r}."
    return ErrorCode.none, None


@api(0, "Produce", 3, 12)
async def produce(conn: Session, request: Any, version: int) -> Awaitable[dict[str, Any] | None]:
    assert conn.principal is not None
    acks = request.acks
    started: list[tuple[str, list[_Partition]]] = []
    work: list[tuple[bytes, _Planned]] = []
    refusals = {t.name: _refusal(conn, request, t.name) for t in request.topic_data}
    counts = await _partition_counts(conn, [t for t in request.topic_data if not refusals[t.name][0]])
    for t in request.topic_data:
        parts: list[_Partition] = []
        code, why = refusals[t.name]
        n = 0
        if not code:
            got = counts[t.name]
            if isinstance(got, TopiclakeError):
                code, why = code_of(got), message_of(got)
            else:
                n = got
        for p in t.partition_data:
            out = _Partition(index=p.index, error=code, message=why)
            parts.append(out)
            if code:
                continue
            if not 0 <= p.index < n:
                out.error, out.message = ErrorCode.unknown_topic_or_partition, "No such partition."
            elif not conn.brokers.leads(t.name, p.index, n):
                out.error = ErrorCode.not_leader_or_follower
                out.message = "Another gateway leads this partition; refresh metadata."
            else:
                work.append((bytes(p.records or b""), _Planned(out=out, topic=t.name)))
        started.append((t.name, parts))
    # Every partition of the request is decoded and planned first, then all are handed to the
    # writers together: they land in one flush (one Delta commit per topic), not one each.
    registry = conn.services.registry
    open_now = registry.committers()  # a topic whose writer must be opened first goes to a thread
    if sum(len(r) for r, _ in work) <= INLINE_DECODE_BYTES and not any(
        has_value_schema(registry, item.topic) or item.topic not in open_now for _, item in work
    ):
        _plan_all(conn, work)
    else:
        await asyncio.to_thread(_plan_all, conn, work)
    for _, item in work:
        _submit(conn, item)

    async def answer() -> dict[str, Any] | None:
        responses: list[dict[str, Any]] = [
            {"name": name, "partition_responses": [await _finish(p) for p in parts]} for name, parts in started
        ]
        if acks == 0:
            if any(p["error_code"] for r in responses for p in r["partition_responses"]):
                conn.close = True  # acks=0: the only way Kafka tells a producer that a write failed
            return None
        return {"responses": responses, "throttle_time": 0}

    return answer()
