"""Kafka's message types through kio (generated from Kafka's own JSON message specs): request
frames to typed entities, and plain values to response frames.

Handlers answer with plain dicts holding the fields of every version they serve (Kafka adds fields
as versions grow); `build` keeps the fields the negotiated version has and gives the others their
schema default, or a neutral value (0, "", empty, null) where the schema has none. So one handler
serves every version, and no version's encoding is written by hand.

Framing (Kafka's protocol guide): a request is [int32 size][header][body]; the header is v1
(api key, version, correlation id, client id) or, for a flexible version, v2 (plus tagged
fields). A response is [int32 size][header][body] with header v0 (correlation id) or v1 (plus
tagged fields); ApiVersions always answers with header v0, so an old client can read it.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import types
import typing
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

API_VERSIONS_KEY = 18
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id: the first 8 bytes of every request

Entity = Any  # a kio dataclass instance


class MalformedFrameError(Exception):
    """A frame that is not a request of the version it names (Kafka answers INVALID_REQUEST, or
    closes the connection when even the header cannot be read)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RequestFrame:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Entity
    #: the response's header is flexible (v1)
    flexible: bool


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a frame, without reading the rest.

    Raises: MalformedFrameError (fewer than 8 bytes)."""
    if len(frame) < _PREFIX.size:
        raise MalformedFrameError("A request is at least 8 bytes: api key, version and correlation id.")
    return _PREFIX.unpack_from(frame)


@functools.cache
def request_schema(api_key: int, api_version: int) -> type:
    return load_request_schema(api_key, api_version)


@functools.cache
def response_schema(api_key: int, api_version: int) -> type:
    return load_response_schema(api_key, api_version)


@functools.cache
def _reader(schema: type) -> Any:
    return entity_reader(schema)


@functools.cache
def _writer(schema: type) -> Any:
    return entity_writer(schema)


def decode_request(frame: bytes | memoryview) -> RequestFrame:
    """A whole request frame (without its size prefix) of a supported API and version.

    Raises: MalformedFrameError."""
    api_key, api_version, _ = peek_header(frame)
    schema = request_schema(api_key, api_version)
    flexible = bool(getattr(schema, "__flexible__", False))
    header_schema = RequestHeaderV2 if flexible else RequestHeaderV1
    try:
        header, offset = _reader(header_schema)(frame, 0)  # kio answers (entity, bytes read)
        body, size = _reader(schema)(frame, offset)
        end = offset + size
    except Exception as exc:  # kio raises several kinds for bytes that do not parse
        raise MalformedFrameError(f"The request does not parse as {schema.__name__} v{api_version}: {exc}") from exc
    # Bytes after the body are ignored, as Kafka's brokers do (librdkafka 2.16 sends 3 after
    # Metadata v12); a body that ends early fails above.
    del end
    return RequestFrame(
        api_key=api_key,
        api_version=api_version,
        correlation_id=header.correlation_id,
        client_id=header.client_id,
        body=body,
        # ApiVersions' response header is v0 whatever its request's version
        flexible=flexible and api_key != API_VERSIONS_KEY,
    )


#: One response frame as the pieces it was written in: sent with one vectored write, so the
#: records of a Fetch answer are never copied into a frame buffer first.
Frame = list[bytes]


class _Pieces:
    """A kio `Writable` that keeps what is written (immutable bytes) instead of copying it."""

    __slots__ = ("pieces", "size")

    def __init__(self) -> None:
        self.pieces: Frame = [b""]  # the size prefix, filled in at the end
        self.size = 0

    def write(self, data: bytes) -> int:
        self.pieces.append(data)
        self.size += len(data)
        return len(data)


def encode_response(correlation_id: int, flexible: bool, body: Entity) -> Frame:
    """The response frame, size prefix included."""
    out = _Pieces()
    if flexible:
        _writer(ResponseHeaderV1)(out, ResponseHeaderV1(correlation_id=i32(correlation_id)))
    else:
        _writer(ResponseHeaderV0)(out, ResponseHeaderV0(correlation_id=i32(correlation_id)))
    _writer(typing.cast(Any, type(body)))(out, body)
    out.pieces[0] = struct.pack(">i", out.size)
    return out.pieces


# -- plain values -> entities ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kafka_type: str | None  # None: an entity or a tuple of entities
    entity: type | None  # the nested entity type
    many: bool  # a tuple
    optional: bool
    default: Any  # dataclasses.MISSING when the schema has none


def _unwrap(tp: Any) -> tuple[Any, bool]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


@functools.cache
def _fields(schema: type) -> tuple[_Field, ...]:
    out = []
    for f in dataclasses.fields(schema):
        tp, optional = _unwrap(f.type)
        many = typing.get_origin(tp) is tuple
        inner = typing.get_args(tp)[0] if many else tp
        entity = typing.cast(type, inner) if dataclasses.is_dataclass(inner) else None
        default: Any = dataclasses.MISSING
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out.append(_Field(f.name, f.metadata.get("kafka_type"), entity, many, optional, default))
    return tuple(out)


def _neutral(f: _Field) -> Any:
    if f.many:
        return ()
    if f.optional:
        return None
    return {
        "string": "",
        "bytes": b"",
        "records": b"",
        "bool": False,
        "error_code": 0,
        "uuid": uuid.UUID(int=0),
        "timedelta_i32": 0,
        "timedelta_i64": 0,
        "datetime_i64": 0,
        "float64": 0.0,
    }.get(f.kafka_type or "", 0)


def _primitive(kafka_type: str | None, value: Any) -> Any:
    if value is None:
        return None
    if kafka_type == "error_code":
        return value if isinstance(value, ErrorCode) else ErrorCode(value)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64":
        return value if isinstance(value, datetime.datetime) else _EPOCH + datetime.timedelta(milliseconds=value)
    return value


#: field types whose null an older version writes as empty (a number's null is a bug, not a downgrade)
_NULLABLE_LATER = frozenset({"string", "bytes", "records"})


def build(schema: type, data: Mapping[str, Any]) -> Entity:
    """`schema` (a kio entity of one version) from plain values: fields the version lacks are
    ignored, fields `data` lacks take their default (arrays: empty, never null); nested entities from nested dicts; error
    codes, durations (ms) and times (epoch ms) from ints. A None where this version's field is not
    nullable (JoinGroup's protocol_name before v7) is written as Kafka's broker writes it: "",
    empty bytes, an empty array or entity."""
    values = {}
    for f in _fields(schema):
        if f.name in data:
            v = data[f.name]
        elif f.many:
            v = ()  # never a null array: Java's admin client fails on one (CreateTopics configs)
        elif f.default is not dataclasses.MISSING:
            continue
        else:
            v = _neutral(f)
        if v is None and not f.optional and (f.many or f.entity is not None or f.kafka_type in _NULLABLE_LATER):
            # null only from the version that made it nullable on; before it "" (or empty) as Kafka
            # writes it. Numbers stay None and fail: 0 would be a plausible wrong answer.
            v = {} if f.entity is not None and not f.many else _neutral(f)
        if f.entity is not None:
            if f.many:
                v = tuple(build(f.entity, item) for item in v) if v is not None else None
            elif v is not None:
                v = build(f.entity, v)
        elif f.many:
            v = tuple(_primitive(f.kafka_type, item) for item in v) if v is not None else None
        else:
            v = _primitive(f.kafka_type, v)
        values[f.name] = v
    return schema(**values)


def respond(api_key: int, api_version: int, data: Mapping[str, Any]) -> Entity:
    """The response entity of an API version, from plain values (see `build`)."""
    return build(response_schema(api_key, api_version), data)


def millis(value: datetime.timedelta | int) -> int:
    """A request's duration field as milliseconds."""
    return int(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else int(value)


# -- the consumer protocol (the bytes inside JoinGroup and SyncGroup) -----------------------------
_SUBSCRIPTION_VERSIONS = 3  # kio's newest ConsumerProtocolSubscription; newer ones append fields


class Subscription(NamedTuple):
    """What a ConsumerProtocolSubscription says: the topics, and (v1+) the partitions its member
    owns (a cooperative member's; an eager one owns none when it joins)."""

    topics: list[str]
    owned: dict[str, list[int]]  # topic -> partitions


def decode_subscription(metadata: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription. Raises: MalformedFrameError."""
    return parse_subscription(metadata).topics


def parse_subscription(metadata: bytes) -> Subscription:
    """A ConsumerProtocolSubscription of any version (fields are only ever appended).

    Raises: MalformedFrameError."""
    if len(metadata) < 2:
        raise MalformedFrameError("A consumer subscription starts with its int16 version.")
    (version,) = struct.unpack_from(">h", metadata)
    error: Exception | None = None
    # newest first; an older layout when the fields a version appended are missing (segmentio's
    # kafka-go says version 1 and writes no owned partitions, as Kafka's v0): topics come first in all
    for v in range(max(0, min(version, _SUBSCRIPTION_VERSIONS)), -1, -1):
        try:
            sub, _size = _reader(_subscription_schema(v))(metadata, 2)
        except Exception as exc:
            error = error or exc
            continue
        owned: dict[str, list[int]] = {}
        for tp in getattr(sub, "owned_partitions", None) or ():
            owned.setdefault(str(tp.topic), []).extend(int(p) for p in tp.partitions)
        return Subscription([str(t) for t in sub.topics], owned)
    raise MalformedFrameError(f"The consumer subscription does not parse: {error}")


@functools.cache
def _subscription_schema(version: int) -> type:
    from kio.index import load_entity_schema
    from kio.static.constants import EntityType

    return load_entity_schema("consumer_protocol_subscription", version, EntityType.data)


@functools.cache
def _assignment_schema(version: int) -> type:
    from kio.index import load_entity_schema
    from kio.static.constants import EntityType

    return load_entity_schema("consumer_protocol_assignment", version, EntityType.data)


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """The topic partitions of a ConsumerProtocolAssignment (any version; empty bytes: none), as a
    consumer group's leader hands them out.

    Raises: MalformedFrameError."""
    if not data:
        return {}
    if len(data) < 2:
        raise MalformedFrameError("A consumer assignment starts with its int16 version.")
    (version,) = struct.unpack_from(">h", data)
    try:
        got, _size = _reader(_assignment_schema(max(0, min(version, _SUBSCRIPTION_VERSIONS))))(data, 2)
    except Exception as exc:
        raise MalformedFrameError(f"The consumer assignment does not parse: {exc}") from exc
    out: dict[str, list[int]] = {}
    for tp in got.assigned_partitions:
        out.setdefault(str(tp.topic), []).extend(int(p) for p in tp.partitions)
    return out


def encode_subscription(topics: list[str]) -> bytes:
    """A v0 ConsumerProtocolSubscription (what DescribeGroups shows as a member's metadata)."""
    out = io.BytesIO()
    out.write(struct.pack(">h", 0))
    _writer(_subscription_schema(0))(out, build(_subscription_schema(0), {"topics": topics, "user_data": None}))
    return out.getvalue()


def encode_assignment(assignment: Mapping[str, list[int]]) -> bytes:
    """A v0 ConsumerProtocolAssignment: what SyncGroup hands each member."""
    from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment

    out = io.BytesIO()
    out.write(struct.pack(">h", 0))
    entity = build(
        ConsumerProtocolAssignment,
        {
            "assigned_partitions": [{"topic": t, "partitions": sorted(ps)} for t, ps in sorted(assignment.items())],
            "user_data": None,
        },
    )
    _writer(ConsumerProtocolAssignment)(out, entity)
    return out.getvalue()
