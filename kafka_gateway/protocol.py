"""Kafka's protocol, apart from the socket: one request frame in, what answers it out.

`dispatch` decodes a frame, checks the API, version and authentication, runs the handler's
ordered part (a group membership request's after the connection's previous one: GROUP_MEMBERSHIP)
and returns what will answer it (kafka_gateway.apis holds the table, the handlers
the behaviour). It reads and writes only the `Session`, so it runs without a connection: the
listener (kafka_gateway.listener) feeds it frames and writes the answers in order.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import struct
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_gateway import handlers, messages
from kafka_gateway.apis import API_VERSIONS, APIS, api_versions_body, name_of
from kafka_gateway.errors import code_of
from kafka_gateway.handlers.sasl import raw_authenticate
from kafka_gateway.session import Session

log = logging.getLogger(__name__)

__all__ = ["Pending", "dispatch", "error_answer", "handlers"]  # importing handlers registers every API


@dataclass(frozen=True, slots=True)
class Pending:
    request: messages.RequestFrame | None
    answer: Awaitable[messages.Frame | None]


def _ready(value: messages.Frame | None) -> asyncio.Future[messages.Frame | None]:
    future: asyncio.Future[messages.Frame | None] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _bare_error(correlation_id: int, code: int) -> messages.Frame:
    """An answer for a request whose response cannot be built (an API or version we do not know):
    header v0 and an int16 error code, which is how every such response begins for ApiVersions."""
    body = struct.pack(">ih", correlation_id, code)
    return [struct.pack(">i", len(body)), body]


def _has_error_field(request: messages.RequestFrame) -> bool:
    """Whether `request`'s response has a top-level error_code."""
    schema = messages.response_schema(request.api_key, request.api_version)
    return any(f.name == "error_code" for f in messages._fields(schema))


def error_answer(request: messages.RequestFrame, code: int) -> messages.Frame:
    """`request`'s response with `code` as its top-level error (or the bare form if it has none)."""
    if not _has_error_field(request):
        return _bare_error(request.correlation_id, code)
    body = messages.respond(request.api_key, request.api_version, {"error_code": code})
    return messages.encode_response(request.correlation_id, request.flexible, body)


async def dispatch(conn: Session, frame: bytes | memoryview) -> Pending:
    """Decode one frame, run its handler's ordered part, and return what will answer it."""
    if conn.sasl_raw:  # after SaslHandshake v0 the next frame is the bare PLAIN token
        return Pending(None, asyncio.ensure_future(raw_authenticate(conn, frame)))
    api_key, api_version, correlation_id = messages.peek_header(frame)
    spec = APIS.get(api_key)
    if spec is None or not spec.min_version <= api_version <= spec.max_version:
        if api_key == API_VERSIONS and spec is not None:
            # Kafka answers an ApiVersions it does not know with v0 and UNSUPPORTED_VERSION
            body = messages.respond(API_VERSIONS, 0, api_versions_body(ErrorCode.unsupported_version))
            return Pending(None, _ready(messages.encode_response(correlation_id, False, body)))
        log.warning(
            "Kafka client %s sent %s v%d, which this server does not serve; answered UNSUPPORTED_VERSION",
            conn.peer,
            name_of(api_key),
            api_version,
        )
        return Pending(None, _ready(_bare_error(correlation_id, ErrorCode.unsupported_version)))
    if conn.principal is None and not spec.before_auth:
        log.warning("Kafka client %s sent %s before authenticating; closing", conn.peer, spec.name)
        conn.close = True
        return Pending(None, _ready(None))
    try:
        request = messages.decode_request(frame)
    except messages.MalformedFrameError as exc:
        log.warning("Kafka client %s sent a malformed %s v%d: %s", conn.peer, spec.name, api_version, exc)
        bad = messages.RequestFrame(api_key, api_version, correlation_id, None, None, _flexible(api_key, api_version))
        return Pending(bad, _ready(error_answer(bad, ErrorCode.invalid_request)))
    conn.client_id = request.client_id
    if api_key in GROUP_MEMBERSHIP:
        # after the connection's previous one, without holding up the connection's other requests
        lane = asyncio.ensure_future(_after(conn.group_lane, _handled(conn, spec, request, api_version)))
        conn.group_lane = lane
        return Pending(request, lane)
    return Pending(request, await _handled(conn, spec, request, api_version))


#: The group membership APIs that answer without waiting for other members (OffsetCommit,
#: Heartbeat, LeaveGroup, ConsumerGroupHeartbeat): a connection's are handled one after another,
#: in the order sent, as Kafka handles all of a connection's requests. Clients pipeline them:
#: librdkafka sends a consumer's leave while its heartbeat or commit is in flight. Let the leave
#: overtake, and the member would be gone when its heartbeat or commit is handled:
#: UNKNOWN_MEMBER_ID, and librdkafka reports its partitions lost (and a join handled after its
#: leave leaves a member that never heartbeats, holding its partitions for a session timeout).
#: JoinGroup and SyncGroup wait for the other members, so nothing queues behind them: a member's
#: LeaveGroup while its JoinGroup waits ends that wait, as the group's rebalance needs.
GROUP_MEMBERSHIP = frozenset({8, 12, 13, 68})


async def _after(before: Awaitable[Any] | None, then: Awaitable[Awaitable[messages.Frame | None]]) -> Any:
    if before is not None:
        await asyncio.wait([asyncio.ensure_future(before)])
    return await (await then)


async def _handled(conn: Session, spec: Any, request: messages.RequestFrame, version: int) -> Awaitable[Any]:
    """Run the handler's ordered part; what will answer the request."""
    try:
        result = await spec.handler(conn, request.body, version)
    except Exception as exc:  # a handler bug: answer it, never leave the client without an answer
        log.exception("Kafka %s v%d from %s failed", spec.name, version, conn.peer)
        return _ready(error_answer(request, code_of(exc)))
    if inspect.isawaitable(result):
        return asyncio.ensure_future(_encoded(request, result))
    return _ready(_encode(request, result))


def _flexible(api_key: int, api_version: int) -> bool:
    return (
        bool(getattr(messages.request_schema(api_key, api_version), "__flexible__", False)) and api_key != API_VERSIONS
    )


async def _encoded(request: messages.RequestFrame, result: Awaitable[Any]) -> messages.Frame | None:
    return _encode(request, await result)


def _encode(request: messages.RequestFrame, data: Any) -> messages.Frame | None:
    if data is None:
        return None
    try:
        body = messages.respond(request.api_key, request.api_version, data)
        return messages.encode_response(request.correlation_id, request.flexible, body)
    except Exception:  # a bug in an answer for this version: an error answer where the API has one
        log.exception("Kafka %s v%d: its answer could not be encoded", name_of(request.api_key), request.api_version)
        if not _has_error_field(request):
            raise  # no frame of this API can say so: the listener closes the connection (the client retries)
        return error_answer(request, ErrorCode.unknown_server_error)
