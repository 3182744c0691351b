"""Produce route: JSON, NDJSON or Arrow IPC into one all-or-nothing append."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping
from typing import Annotated

import pyarrow as pa
from fastapi import APIRouter, Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Match
from starlette.types import Receive, Scope, Send

from broker.produce import (
    Acked,
    AppendResult,
    DeadLetter,
    DeadLetters,
    Decoded,
    PreparedRequest,
    Produce,
    ProducePlan,
    dead_letter_entries,
    producer_from_headers,
    record_offset_columns,
)
from broker.services import Services
from broker.transactions import TxnBatch
from conf import Settings
from delta_log.core.acl import Principal
from delta_log.core.records import producer_arrow_stream
from delta_log.errors import RequestTooLargeError, SchemaValidationError
from ingest_gateway import decoding
from ingest_gateway.kit.dependencies import PrincipalDep, SettingsDep, principal_of
from ingest_gateway.kit.errors import MalformedRequestError, UnsupportedMediaTypeError
from ingest_gateway.kit.forwarding import FORWARDED_BY
from ingest_gateway.kit.params import KeyFormat, TopicPath, ValueFormat
from ingest_gateway.produce_forwarding import forward_append
from ingest_gateway.schemas import ProduceBatchResponse, ProduceResponse

router = APIRouter(tags=["produce"])

_DECODERS: dict[str, Callable[[bytes, str, str], pa.Table]] = {
    decoding.ARROW_STREAM: lambda body, kf, vf: decoding.decode_arrow(body),
    "application/json": lambda body, kf, vf: decoding.decode_json(body, key_format=kf, value_format=vf),
    "application/x-ndjson": lambda body, kf, vf: decoding.decode_ndjson(body, key_format=kf, value_format=vf),
    "application/ndjson": lambda body, kf, vf: decoding.decode_ndjson(body, key_format=kf, value_format=vf),
    "application/jsonlines": lambda body, kf, vf: decoding.decode_ndjson(body, key_format=kf, value_format=vf),
}


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
    topic: TopicPath,
    request: Request,
    settings: SettingsDep,
    principal: PrincipalDep,
    key_format: KeyFormat = "string",
    value_format: ValueFormat = "json",
    producer_id: Annotated[
        str,
        Header(
            description="Idempotent producer: with Producer-Sequence; not with Idempotency-Key.",
            json_schema_extra={"pattern": r"^([A-Za-z0-9._:-]{1,128})?$"},
        ),
    ] = "",
    producer_sequence: Annotated[
        str,
        Header(
            description="The batch's sequence number (0, 1, 2...) for Producer-Id.",
            json_schema_extra={"pattern": r"^([0-9]{1,15})?$"},
        ),
    ] = "",
    idempotency_key: Annotated[
        str,
        Header(
            description="Any 1-256 characters naming this request, instead of Producer-Id/Sequence.",
            json_schema_extra={"maxLength": 256},
        ),
    ] = "",
    record_offsets: Annotated[
        bool, Query(description="Arrow requests: also return each record's partition and offset, in order.")
    ] = False,
    transactional_id: Annotated[
        str,
        Header(
            description="Write in this transactional id's transaction (POST /transactions/{id}/init first); "
            "with Transactional-Producer, Producer-Id and Producer-Sequence.",
            json_schema_extra={"maxLength": 249},
        ),
    ] = "",
    transactional_producer: Annotated[
        str,
        Header(
            description="`<producer_id>.<producer_epoch>` as POST /transactions/{id}/init answered.",
            json_schema_extra={"pattern": r"^([0-9]{1,19}\.[0-9]{1,5})?$"},
        ),
    ] = "",
) -> Response:
    """Append records to a topic; the response comes after the Delta commit that holds them. In a
    transaction (Transactional-Id), after the records are staged with it: their offsets are null
    until it commits."""
    return await produce_records(
        request,
        topic,
        settings,
        principal,
        key_format=key_format,
        value_format=value_format,
        producer_headers=(producer_id, producer_sequence, idempotency_key),
        record_offsets=record_offsets,
    )


async def produce_records(
    request: Request,
    topic: str,
    settings: Settings,
    principal: Principal,
    *,
    key_format: str,
    value_format: str,
    producer_headers: tuple[str, str, str],
    record_offsets: bool,
) -> Response:
    """The produce route's work, whichever route took the request (`produce` above, or
    `QuerylessProduceRoute`); `producer_headers`: Producer-Id, Producer-Sequence, Idempotency-Key
    ("" where absent). Produce's rules are the broker's (broker.produce.ProduceService); this
    decodes the body, forwards to the owner gateway, and encodes the answer."""
    body = await _read_body(request, settings.server.max_request_bytes)
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media not in _DECODERS:
        raise UnsupportedMediaTypeError(f"Content-Type {media!r} is not supported.", content_type=media)

    tid, txn = _transaction(request.headers, producer_headers)

    def decode() -> Decoded:  # after the ACL check, in the broker's decoding thread for large bodies
        producer = producer_from_headers(*(h or None for h in producer_headers))
        return Decoded(_DECODERS[media](body, key_format, value_format), producer, transactional=txn)

    state = request.app.state
    services: Services = state.services
    service = services.produce
    forwarded = FORWARDED_BY in request.headers
    route = not forwarded and tid is None  # a transaction's records are staged here, for any partition
    unit = Produce(topic=topic, decode=decode, size=len(body), route=route, forwarded=forwarded, transactional_id=tid)
    await service.plan(principal, [unit])
    if unit.error is not None:
        raise unit.error
    prepared_plan = unit.plan
    assert prepared_plan is not None
    prepared, cluster = prepared_plan.prepared, services.cluster
    owner = cluster.member(prepared.owner) if cluster and prepared and prepared.owner else None
    if cluster is not None and owner is not None and prepared is not None:
        forward = producer_arrow_stream(prepared.append.batch)
        if len(forward) <= settings.server.max_request_bytes:
            outcome = await forward_append(
                state.forwarder,
                url=owner.url,
                owner_id=owner.gateway_id,
                me=cluster.me.gateway_id,
                topic=topic,
                body=forward,
                headers=request.headers,
                idempotent=prepared.append.producer is not None,
            )
            state.metrics.on_forward(topic, appended_here=outcome is None)
            if isinstance(outcome, Response) and _schema_refusal(outcome):
                # the owner read a newer registry than this gateway: read it too, and decide here
                await run_in_threadpool(services.registry.schemas.state, max_age_s=0)
                unit = Produce(topic=topic, decode=decode, size=len(body))
                await service.plan(principal, [unit])
                if unit.error is not None:
                    raise unit.error
            elif isinstance(outcome, Response):
                return outcome
            elif outcome is not None:
                return _respond(topic, media, prepared_plan, Acked(outcome, None), record_offsets)
    await service.submit([unit])
    assert unit.plan is not None
    acked = await service.acked(unit)
    if tid is not None:
        return _staged(topic, tid, media, unit.plan, record_offsets)
    return _respond(topic, media, unit.plan, acked, record_offsets)


def _staged(topic: str, tid: str, media: str, plan: ProducePlan, record_offsets: bool) -> Response:
    """A transactional request's answer: where each record goes, without offsets (null: they are
    assigned when the transaction commits)."""
    parts = plan.prepared.append.partition_array().tolist() if plan.prepared is not None else []
    payload: dict[str, object] = {"topic": topic, "transactional_id": tid, "duplicate": False}
    if media == decoding.ARROW_STREAM:
        counts: dict[int, int] = {}
        for p in parts:
            counts[p] = counts.get(p, 0) + 1
        payload["record_count"] = len(parts)
        payload["partitions"] = [{"partition": p, "base_offset": None, "count": n} for p, n in sorted(counts.items())]
        if record_offsets:
            payload["record_partitions"], payload["record_offsets"] = parts, [None] * len(parts)
    else:
        payload["offsets"] = [{"partition": p, "offset": None} for p in parts]
    return Response(json.dumps(payload, separators=(",", ":")), media_type="application/json")


def _transaction(
    headers: Mapping[str, str], producer_headers: tuple[str, str, str]
) -> tuple[str | None, TxnBatch | None]:
    """The transactional id and writer a request names (Transactional-Id, Transactional-Producer,
    with Producer-Id and Producer-Sequence: a retried request is staged once). Raises:
    MalformedRequestError."""
    tid, producer = headers.get("transactional-id"), headers.get("transactional-producer")
    if tid is None and producer is None:
        return None, None
    lane, sequence, _ = producer_headers
    pid, _, epoch = (producer or "").partition(".")
    if not tid or not (pid.isdigit() and epoch.isdigit() and sequence.isdigit() and lane):
        raise MalformedRequestError(
            "A transactional request has Transactional-Id, Transactional-Producer (<producer_id>.<epoch>, as "
            "POST /transactions/{id}/init answered), Producer-Id and Producer-Sequence.",
        )
    if int(pid) >= 2**63 or int(epoch) >= 2**15 or len(tid) > 249:
        raise MalformedRequestError("Transactional-Producer's id or epoch is out of range, or the id is too long.")
    return tid, TxnBatch(int(pid), int(epoch), int(sequence), lane)


def _respond(topic: str, media: str, plan: ProducePlan, acked: Acked, record_offsets: bool) -> Response:
    payload = _answer(topic, media, plan.prepared, acked.result, record_offsets, plan.dead, acked.dead)
    return Response(json.dumps(payload, separators=(",", ":")), media_type="application/json")


class QuerylessProduceRoute(BaseRoute):
    """`POST /topics/{topic}/records` with no query parameters (the defaults: JSON values, string
    keys, no per-record offsets for Arrow), answered by `produce_records` as the documented route
    answers it, without FastAPI's parameter and dependency solving: measured, that was a fifth of
    the event loop's time for a 10-record request, the size an ack-latency-bound producer sends.
    Any request with a query string is left to the documented route (its parameters are parsed
    and checked in one place). Placed before that route (`install`); not in the OpenAPI document,
    which the documented route describes. Errors reach the app's handlers as the route's do."""

    def __init__(self) -> None:
        self.path = "/topics/{topic}/records"

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("query_string"):
            path = scope["path"]  # (behind a root_path nothing matches: the documented route answers)
            if path.startswith("/topics/") and path.endswith("/records"):
                topic = path[len("/topics/") : -len("/records")]
                if topic and "/" not in topic:
                    return Match.FULL, {"path_params": {**scope.get("path_params", {}), "topic": topic}}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        state = request.app.state
        settings: Settings = state.settings
        headers = request.headers
        response = await produce_records(
            request,
            scope["path_params"]["topic"],
            settings,
            principal_of(request, settings, headers.get("authorization")),
            key_format="string",
            value_format="json",
            producer_headers=(
                headers.get("producer-id", ""),
                headers.get("producer-sequence", ""),
                headers.get("idempotency-key", ""),
            ),
            record_offsets=False,
        )
        await response(scope, receive, send)

    @staticmethod
    def install(routes: list[BaseRoute]) -> None:
        """Put the route before the documented one in an app's `routes`."""
        routes.insert(0, QuerylessProduceRoute())


def _schema_refusal(response: Response) -> bool:
    """Whether an owner gateway refused a forwarded request for its values."""
    if response.status_code != 422:
        return False
    try:
        return bool(json.loads(bytes(response.body))["error"]["code"] == SchemaValidationError.code)
    except (ValueError, KeyError, TypeError):
        return False


def _answer(
    topic: str,
    media: str,
    prepared: PreparedRequest | None,
    result: AppendResult | None,
    record_offsets: bool,
    dead: DeadLetters | None,
    dead_result: AppendResult | None,
) -> dict[str, object]:
    # Serialized by hand: building a pydantic model per record cost more than the decode.
    # each record's offset only where the answer holds it (an Arrow answer holds ranges by default)
    per_record = media != decoding.ARROW_STREAM or record_offsets or dead is not None
    parts, offsets = record_offset_columns(prepared, result) if prepared and result and per_record else ([], [])
    letters = dead_letter_entries(dead, dead_result) if dead and dead_result else []
    if dead is not None:  # every record in request order: a dead letter where it went
        parts, offsets = _merged(dead.split.valid_indexes.tolist(), parts, offsets, letters)
    duplicate = any(r.duplicate for r in (result, dead_result) if r is not None)
    payload: dict[str, object] = {"topic": topic}
    if media == decoding.ARROW_STREAM:
        payload["record_count"] = prepared.append.batch.num_rows if prepared else 0
        payload["partitions"] = [
            {"partition": r.partition, "base_offset": r.base_offset, "count": r.count}
            for r in (result.ranges if result is not None else [])
        ]
        payload["duplicate"] = duplicate
        if record_offsets:
            payload["record_partitions"], payload["record_offsets"] = parts, offsets
    else:
        entries: list[dict[str, object]] = [{"partition": p, "offset": o} for p, o in zip(parts, offsets, strict=True)]
        for d in letters:
            entries[d.index] |= {"topic": dead.topic, "error": d.reason}  # type: ignore[union-attr]
        payload["offsets"] = entries
        payload["duplicate"] = duplicate
    if dead is not None:
        payload["dead_letter_topic"] = dead.topic
        payload["dead_letters"] = [
            {"index": d.index, "partition": d.partition, "offset": d.offset, "reason": d.reason} for d in letters
        ]
    return payload


def _merged(
    valid_indexes: list[int], parts: list[int], offsets: list[int], letters: list[DeadLetter]
) -> tuple[list[int], list[int]]:
    """Partitions and offsets of every record of a request in its order: the valid records' in the
    topic, the dead letters' in the dead-letter topic."""
    n = len(valid_indexes) + len(letters)
    all_parts, all_offsets = [0] * n, [0] * n
    for i, p, o in zip(valid_indexes, parts, offsets, strict=True):
        all_parts[i], all_offsets[i] = p, o
    for d in letters:
        all_parts[d.index], all_offsets[d.index] = d.partition, d.offset
    return all_parts, all_offsets
