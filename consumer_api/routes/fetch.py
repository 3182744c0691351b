"""Fetch by offset (JSON or Arrow, with long-poll), offset lookups, and SSE push."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import pyarrow as pa
import pyarrow.ipc as ipc
from fastapi import APIRouter, Header, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from broker.fetch import FetchPart, FetchResult, list_offsets
from broker.services import Services
from consumer_api.encoding import check_format, records_to_json
from consumer_api.schemas import OffsetLookup
from delta_log.core.acl import Principal
from delta_log.core.records import DIGITS
from delta_log.errors import InvalidOffsetError
from ingest_gateway.kit.dependencies import PrincipalDep, ServicesDep
from ingest_gateway.kit.params import (
    MAX_JSON_INT,
    KeyFormat,
    LastEventId,
    OffsetQuery,
    PartitionPath,
    TopicPath,
    ValueFormat,
    bounded_int,
    check_json_int,
)

router = APIRouter(tags=["consume"])

ARROW = "application/vnd.apache.arrow.stream"
MAX_WAIT_MS = 60_000
#: JSON answers of up to this many records are rendered on the event loop (cheaper than a hop).
INLINE_RENDER_ROWS = 64
SSE_BATCH_RECORDS = 500
SSE_BATCH_BYTES = 1024 * 1024
KEEP_ALIVE_S = 15.0


async def _fetch(
    services: Services,
    principal: Principal,
    topic: str,
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    max_wait_s: float,
) -> FetchResult:
    """One partition through the broker's fetch. Raises: AuthorizationError, TopicNotFoundError,
    PartitionNotFoundError, OffsetOutOfRangeError, StorageUnavailableError."""
    part = FetchPart(topic, partition, offset, max_bytes)
    await services.fetch.fetch(principal, [part], max_bytes=max_bytes, max_records=max_records, max_wait_s=max_wait_s)
    if part.error is not None:
        raise part.error
    assert part.result is not None
    return part.result


def _arrow(result: FetchResult) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, result.records.schema) as w:
        w.write_table(result.records)
    return sink.getvalue().to_pybytes()


@router.get("/topics/{topic}/partitions/{partition}/records")
async def fetch(
    topic: TopicPath,
    partition: PartitionPath,
    services: ServicesDep,
    principal: PrincipalDep,
    offset: OffsetQuery,
    max_records: Annotated[int, bounded_int("At most this many records.", 1, 1_000_000)] = 500,
    max_bytes: Annotated[
        int,
        Query(
            description="About this many record bytes; any larger value is capped at the server's fetch.max.bytes.",
            json_schema_extra={"minimum": 1},
        ),
    ] = 1024 * 1024,
    max_wait_ms: Annotated[int, bounded_int("Long-poll: wait up to this long for new records.", 0, MAX_WAIT_MS)] = 0,
    key_format: KeyFormat = "string",
    value_format: ValueFormat = "binary",
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Records of one partition from an offset: JSON, or Arrow IPC with `Accept: application/vnd.apache.arrow.stream`."""
    check_format("key_format", key_format)
    check_format("value_format", value_format)
    check_json_int("offset", offset)
    if not 0 <= max_wait_ms <= MAX_WAIT_MS:
        raise InvalidOffsetError(f"max_wait_ms must be between 0 and {MAX_WAIT_MS}.", max_wait_ms=max_wait_ms)
    # a long-poll sleeps until a commit to this partition (ours at once, other processes' via the
    # notifier's one watcher per topic) or the deadline: no CPU while waiting
    result = await _fetch(services, principal, topic, partition, offset, max_records, max_bytes, max_wait_ms / 1000)
    headers = {
        "X-Next-Offset": str(result.next_offset),
        "X-High-Watermark": str(result.high_watermark),
        "X-Log-Start-Offset": str(result.log_start_offset),
    }
    if accept and ARROW in accept:
        body = await run_in_threadpool(_arrow, result)
        return Response(body, media_type=ARROW, headers=headers)

    def render() -> bytes:
        records = records_to_json(result.records, key_format=key_format, value_format=value_format)
        return json.dumps(
            {
                "topic": topic,
                "partition": partition,
                "records": records,
                "next_offset": result.next_offset,
                "high_watermark": result.high_watermark,
                "log_start_offset": result.log_start_offset,
            }
        ).encode()

    # Small answers render here; large ones in a worker thread, so health checks and other
    # clients are answered while they render.
    body = render() if result.records.num_rows <= INLINE_RENDER_ROWS else await run_in_threadpool(render)
    return Response(body, media_type="application/json", headers=headers)


@router.get("/topics/{topic}/offsets", response_model=OffsetLookup)
async def lookup_offsets(
    topic: TopicPath,
    services: ServicesDep,
    principal: PrincipalDep,
    at: Annotated[
        str,
        Query(
            description="earliest, latest, or an epoch-ms timestamp",
            json_schema_extra={"pattern": r"^(earliest|latest|[0-9]{1,15})$"},
        ),
    ] = "latest",
) -> OffsetLookup:
    """Per partition: the earliest offset, the latest (high watermark), or the first offset at/after a timestamp."""
    ts = 0
    if at not in ("earliest", "latest"):
        if not re.fullmatch(DIGITS, at):
            raise InvalidOffsetError(f"at must be earliest, latest or epoch ms; got {at[:40]!r}.")
        ts = int(at)

    def lookup() -> list[dict[str, int | None]]:
        spec: Literal["earliest", "latest", "timestamp"] = "timestamp" if at not in ("earliest", "latest") else at  # type: ignore[assignment]
        return [
            {
                "partition": o.partition,
                "offset": o.high_watermark if o.offset is None else o.offset,  # none at or after: the end
                "log_start_offset": o.log_start_offset,
                "high_watermark": o.high_watermark,
            }
            for o in list_offsets(services.registry, principal, topic, spec, timestamp_ms=ts)
        ]

    return OffsetLookup(topic=topic, partitions=await run_in_threadpool(lookup))


@router.get(
    "/topics/{topic}/partitions/{partition}/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-Sent Events: first `event: position` (data: the start offset and the high "
            "watermark), then per record `id` (its offset), `event: record`, `data` (the record as JSON).",
            "content": {
                "text/event-stream": {
                    "schema": {
                        "type": "object",
                        "required": ["event", "data"],
                        "properties": {
                            "event": {"type": "string", "enum": ["position", "record"]},
                            "id": {"type": "string", "description": "The record's offset."},
                            "data": {"type": "string", "description": "JSON."},
                        },
                    }
                }
            },
        }
    },
)
async def stream(
    topic: TopicPath,
    partition: PartitionPath,
    services: ServicesDep,
    principal: PrincipalDep,
    offset: Annotated[
        int | None,
        Query(
            description="Start here (default: the high watermark).",
            json_schema_extra={"minimum": 0, "maximum": MAX_JSON_INT},
        ),
    ] = None,
    key_format: KeyFormat = "string",
    value_format: ValueFormat = "binary",
    last_event_id: LastEventId = "",
) -> StreamingResponse:
    """Server-Sent Events: records as they commit; `id` is the offset, resume with Last-Event-ID."""
    check_format("key_format", key_format)
    check_format("value_format", value_format)
    if last_event_id:
        if not re.fullmatch(DIGITS, last_event_id):
            raise InvalidOffsetError("Last-Event-ID must be an offset.")
        position = int(last_event_id) + 1
    elif offset is not None:
        position = check_json_int("offset", offset)
    else:
        position = await services.fetch.high_watermark(principal, topic, partition)
    # the first read answers 403/404/416 before streaming
    first = await _fetch(services, principal, topic, partition, position, SSE_BATCH_RECORDS, SSE_BATCH_BYTES, 0.0)

    def render(result: FetchResult) -> bytes:
        return "".join(
            f"id: {rec['offset']}\nevent: record\ndata: {json.dumps(rec)}\n\n"
            for rec in records_to_json(result.records, key_format=key_format, value_format=value_format)
        ).encode()

    async def events() -> AsyncIterator[bytes]:
        # Starlette cancels this generator when the client disconnects.
        nonlocal position
        # First, where the stream starts: the client knows at once that it is connected and from
        # which offset records will come (no `id`, so Last-Event-ID keeps meaning a record).
        start = {"offset": position, "high_watermark": first.high_watermark}
        yield f"event: position\ndata: {json.dumps(start)}\n\n".encode()
        result = first
        while True:
            position = max(position, result.next_offset)
            if result.records.num_rows:
                yield await run_in_threadpool(render, result)
            # The next records, asleep until a commit to this partition; a comment line keeps
            # proxies from timing out.
            result = await _fetch(
                services, principal, topic, partition, position, SSE_BATCH_RECORDS, SSE_BATCH_BYTES, KEEP_ALIVE_S
            )
            if not result.records.num_rows:
                yield b": keep-alive\n\n"

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
