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
- Transactional batches (the request names its transactional id) are staged with their
  transaction (broker.transactions) and answered with base offset -1: their offsets are assigned
  when the transaction commits.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from kio.schema.errors import ErrorCode

from broker.produce import Decoded, Produce, ProduceService
from broker.transactions import TxnBatch
from delta_log.core.producer import KAFKA_SEQUENCES, ProducerSequence
from delta_log.core.records import HEADERS_TYPE, TIMESTAMP_TYPE
from delta_log.errors import InvalidRecordError, TopiclakeError
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


def _decoder(records: bytes, partition: int, max_records: int, budget: list[int]) -> Callable[[], Decoded]:
    """One partition's batches -> Arrow columns (blocking); `budget` holds the decompressed bytes
    the request may still take (one budget for all its partitions)."""

    def decode() -> Decoded:
        decoded = decode_batches(records, max_records=max_records, max_bytes=max(budget[0], 1))
        budget[0] -= decoded.value.nbytes + decoded.key.nbytes
        if any(b.is_control for b in decoded.batches):
            raise InvalidRecordError("Control batches are written by the transaction coordinator, not produced.")
        transactional = {b.is_transactional for b in decoded.batches}
        if len(transactional) > 1:
            raise InvalidRecordError("The batches of one partition are all transactional, or none is.")
        codec = decoded.batches[-1].compression if decoded.batches else "none"
        producer = _producer(decoded)
        txn = None
        if transactional == {True}:
            if producer is None:
                raise InvalidRecordError("Transactional batches carry a producer id, epoch and sequence.")
            first = decoded.batches[0]
            txn = TxnBatch(first.producer_id, first.producer_epoch, first.base_sequence)
        return Decoded(_table(decoded, partition), producer, codec, txn)

    return decode


def _refusal(conn: Session, request: Any) -> tuple[int, str | None]:
    """Why the request may not be written at all (Kafka's error code and message), or (0, None)."""
    assert conn.principal is not None
    tid = request.transactional_id
    if tid is not None and not conn.principal.allows_transactional_id("write", tid):
        return ErrorCode.transactional_id_authorization_failed, "No ACL to write this transactional id."
    if request.acks not in (0, 1, -1):
        return ErrorCode.invalid_required_acks, "acks must be 0, 1 or all (-1)."
    return ErrorCode.none, None


async def _answer(service: ProduceService, unit: Produce) -> dict[str, Any]:
    try:
        base_offset = (await service.acked(unit)).base_offset
    except TopiclakeError as exc:
        out = _refused(unit, code_of(exc), message_of(exc))
        out["record_errors"] = [
            {"batch_index": r["index"], "batch_index_error_message": r["reason"]}
            for r in exc.details.get("records") or ()
        ]
        return out
    except Exception as exc:
        return _refused(unit, ErrorCode.unknown_server_error, message_of(exc))
    log_append = unit.plan is not None and unit.plan.log_append_time
    return _refused(unit, ErrorCode.none, None) | {
        "base_offset": base_offset,
        "log_append_time": int(time.time() * 1000) if log_append else -1,
    }


@api(0, "Produce", 3, 12)
async def produce(conn: Session, request: Any, version: int) -> Awaitable[dict[str, Any] | None]:
    assert conn.principal is not None
    service = conn.services.produce
    code, why = _refusal(conn, request)
    max_records = conn.services.settings.reader.max_fetch_records
    budget = [conn.settings.max_request_bytes]  # decompressed, for the whole request
    units = [
        [
            Produce(
                topic=t.name,
                partition=p.index,
                size=len(p.records or b""),
                decode=_decoder(bytes(p.records or b""), p.index, max_records, budget),
                transactional_id=request.transactional_id,
                adds_to_transaction=version >= 12,  # transaction version 2 (KIP-890 part 2)
            )
            for p in t.partition_data
        ]
        for t in request.topic_data
    ]
    if not code:
        # Every partition of the request is decoded and planned first, then all are handed to
        # the writers together: they land in one flush (one Delta commit per topic), not one each.
        await service.produce(conn.principal, [u for us in units for u in us])

    async def answer() -> dict[str, Any] | None:
        responses: list[dict[str, Any]] = [
            {
                "name": t.name,
                "partition_responses": [_refused(u, code, why) if code else await _answer(service, u) for u in us],
            }
            for t, us in zip(request.topic_data, units, strict=True)
        ]
        if request.acks == 0:
            if any(p["error_code"] for r in responses for p in r["partition_responses"]):
                conn.close = True  # acks=0: the only way Kafka tells a producer that a write failed
            return None
        return {"responses": responses, "throttle_time": 0}

    return answer()


def _refused(unit: Produce, code: int, why: str | None) -> dict[str, Any]:
    return {
        "index": unit.partition,
        "error_code": code,
        "base_offset": -1,
        "log_append_time": -1,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": why,
    }
