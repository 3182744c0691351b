"""Produce route: JSON, NDJSON or Arrow IPC into one all-or-nothing append."""

from __future__ import annotations

import asyncio
import zlib
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool

from delta_log.errors import MalformedRequestError, RequestTooLargeError, UnsupportedMediaTypeError
from ingest_gateway import decoding
from ingest_gateway.auth import authorize
from ingest_gateway.dependencies import PrincipalDep, RegistryDep, SettingsDep
from ingest_gateway.produce import prepare, producer_from_headers, record_offsets
from ingest_gateway.schemas import (
    PartitionBatch,
    ProduceBatchResponse,
    ProduceResponse,
    RecordOffset,
)

router = APIRouter(tags=["produce"])


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(
            f"The request is {declared} bytes; the limit is {limit}.", size=int(declared), limit=limit
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"The request is over the {limit}-byte limit.", limit=limit)
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding == "gzip":
        return _gunzip(body, limit)
    if encoding != "identity":
        raise UnsupportedMediaTypeError(f"Content-Encoding {encoding!r} is not supported; use gzip or none.")
    return body


def _gunzip(body: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise MalformedRequestError(f"The gzip body cannot be decompressed: {exc}.") from exc
    if len(out) > limit or d.unconsumed_tail:
        raise RequestTooLargeError(f"The decompressed request is over the {limit}-byte limit.", limit=limit)
    return out


@router.post(
    "/topics/{topic}/records",
    response_model=ProduceResponse | ProduceBatchResponse,
    responses={200: {"description": "Offsets per record (JSON, NDJSON) or per partition (Arrow)."}},
)
async def produce(
    topic: str,
    request: Request,
    registry: RegistryDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    key_format: Annotated[str, Query(description="json | string | binary (base64)")] = "string",
    value_format: Annotated[str, Query(description="json | string | binary (base64)")] = "json",
    content_type: Annotated[str | None, Header()] = None,
    producer_id: Annotated[str | None, Header()] = None,
    producer_sequence: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> ProduceResponse | ProduceBatchResponse:
    """Append records to a topic; the response comes after the Delta commit that holds them."""
    authorize(principal, "produce", topic)
    producer = producer_from_headers(producer_id, producer_sequence, idempotency_key)
    body = await _read_body(request, settings.server.max_request_bytes)
    media = (content_type or "application/json").split(";")[0].strip().lower()
    if media == decoding.ARROW_STREAM:
        table = await run_in_threadpool(decoding.decode_arrow, body)
    elif media in ("application/x-ndjson", "application/ndjson", "application/jsonlines"):
        table = await run_in_threadpool(decoding.decode_ndjson, body, key_format=key_format, value_format=value_format)
    elif media == "application/json":
        table = await run_in_threadpool(decoding.decode_json, body, key_format=key_format, value_format=value_format)
    else:
        raise UnsupportedMediaTypeError(f"Content-Type {media!r} is not supported.", content_type=media)
    append = await run_in_threadpool(prepare, registry, topic, table, producer)
    committer = await run_in_threadpool(registry.committer, topic)
    result = await asyncio.wrap_future(committer.submit(append))
    if media == decoding.ARROW_STREAM:
        return ProduceBatchResponse(
            topic=topic,
            record_count=append.batch.num_rows,
            partitions=[
                PartitionBatch(partition=r.partition, base_offset=r.base_offset, count=r.count) for r in result.ranges
            ],
            duplicate=result.duplicate,
        )
    return ProduceResponse(
        topic=topic,
        offsets=[RecordOffset(partition=p, offset=o) for p, o in record_offsets(append, result)],
        duplicate=result.duplicate,
    )
