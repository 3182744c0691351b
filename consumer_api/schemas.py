"""HTTP models of the consumer API (snake_case).

Bounds that have a domain check (and a domain error code clients branch on, e.g. 400
INVALID_GROUP) are documented in the schema with `json_schema_extra` rather than enforced by
pydantic (which would answer 422 INVALID_REQUEST); the OpenAPI document states them either way.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from delta_log.core.group_rules import MAX_SUBSCRIBED_TOPICS
from delta_log.core.topic_config import MAX_PARTITIONS, MAX_TOPIC_NAME_LENGTH, TOPIC_NAME_PATTERN
from ingest_gateway.kit.params import BodyInt

#: A topic name, as the OpenAPI document states it (validate_topic_name enforces it).
TOPIC_NAME: dict[str, Any] = {"minLength": 1, "maxLength": MAX_TOPIC_NAME_LENGTH, "pattern": TOPIC_NAME_PATTERN}
PARTITION: dict[str, Any] = {"minimum": 0, "maximum": MAX_PARTITIONS - 1}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


INT32 = 2**31 - 1
#: I-JSON's exact integers: the HTTP API's bound for offsets (ingest_gateway.kit.params.MAX_JSON_INT)
JSON_INT = 2**53 - 1


class JoinRequest(_Model):
    topics: list[Annotated[str, Field(max_length=249, json_schema_extra=TOPIC_NAME)]] = Field(
        max_length=100_000,
        description=f"1-{MAX_SUBSCRIBED_TOPICS} distinct topics to subscribe to (duplicates are ignored).",
        json_schema_extra={"minItems": 1},
    )
    member_id: str | None = Field(None, max_length=300, description="Set when rejoining after a rebalance.")
    client_id: str | None = Field(
        None, max_length=255, description="Who this client is (Kafka's client.id), shown when the group is described."
    )
    instance_id: str | None = Field(
        None,
        max_length=249,
        pattern=r"^[a-zA-Z0-9._-]+$",
        description="Static membership (Kafka's group.instance.id): a stable id for this consumer.",
    )
    session_timeout_ms: BodyInt = Field(
        10_000,
        description="1000-300000; outside: 400 INVALID_GROUP.",
        json_schema_extra={"minimum": 1000, "maximum": 300_000},
    )
    assignor: str = Field(
        "range",
        max_length=32,
        description="range, roundrobin or sticky; with group_protocol consumer the server-side assignor: "
        "uniform, range or lag (balanced by backlog); else 400 UNKNOWN_ASSIGNOR.",
        json_schema_extra={"enum": ["range", "roundrobin", "sticky", "uniform", "lag"]},
    )
    group_protocol: Literal["classic", "consumer"] = Field(
        "classic",
        description="consumer: the group runs Kafka's consumer protocol (KIP-848), as Kafka 4 members with "
        "group.protocol=consumer ask; a classic group of consumers is upgraded. Partitions move one at a "
        "time: a join answers at once with what is free, and a heartbeat says rebalance when more is.",
    )


class JoinResponse(_Model):
    group: str
    member_id: str
    generation: int
    assignment: dict[str, list[int]]
    members: int


class HeartbeatRequest(_Model):
    generation: BodyInt = Field(ge=-1, le=INT32)


class HeartbeatResponse(_Model):
    generation: int
    rebalance: bool
    assignment: dict[str, list[int]]


class PartitionOffset(_Model):
    topic: str = Field(max_length=249, json_schema_extra=TOPIC_NAME)
    partition: int = Field(json_schema_extra=PARTITION)
    offset: int = Field(
        description="The next offset to consume (Kafka's committed-offset meaning), 0..2**53-1.",
        json_schema_extra={"minimum": 0, "maximum": JSON_INT},
    )
    metadata: str = Field("", max_length=4096, description="At most 4096 bytes (offset.metadata.max.bytes).")


class CommitRequest(_Model):
    member_id: str | None = Field(None, max_length=300)
    generation: BodyInt | None = Field(None, ge=-1, le=INT32)
    offsets: list[PartitionOffset] = Field(max_length=100_000)


class CommittedOffsets(_Model):
    group: str
    offsets: list[PartitionOffset]


def _reset_cases(schema: dict[str, Any]) -> None:
    schema["oneOf"] = [
        {"properties": {"to": {"enum": ["earliest", "latest"]}}},
        {"properties": {"to": {"const": "timestamp"}}, "required": ["timestamp"]},
        {"properties": {"to": {"const": "offset"}}, "required": ["offset"]},
    ]


class ResetRequest(_Model):
    """to=timestamp needs `timestamp`, to=offset needs `offset` (else 400 INVALID_OFFSET)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_reset_cases)

    topic: str = Field(max_length=249, json_schema_extra=TOPIC_NAME)
    to: Literal["earliest", "latest", "timestamp", "offset"]
    timestamp: BodyInt | None = Field(None, ge=0, le=JSON_INT, description="Epoch ms, for to=timestamp.")
    offset: BodyInt | None = Field(None, ge=0, le=JSON_INT, description="For to=offset.")
    partitions: list[Annotated[BodyInt, Field(ge=0, le=INT32)]] | None = Field(
        None, max_length=10_000, description="Default: every partition."
    )


class MemberInfo(_Model):
    member_id: str
    instance_id: str | None
    topics: list[str]
    session_timeout_ms: int
    assignment: dict[str, list[int]]
    client_id: str = Field("", description="Kafka's client.id; over HTTP the join's `client_id`, else its User-Agent.")
    client_host: str = Field("", description="Where the member joined from, as Kafka shows it (`/127.0.0.1`).")


class LagInfo(_Model):
    topic: str
    partition: int
    committed_offset: int | None
    high_watermark: int
    log_start_offset: int
    lag: int


class GroupInfo(_Model):
    group: str
    state: str
    generation: int
    assignor: str
    members: list[MemberInfo]
    lag: list[LagInfo]


class GroupList(_Model):
    groups: list[dict[str, str | int]]
    next: str | None = Field(None, description="More groups follow: pass this as `after` for the next page.")


class PartitionLagAt(_Model):
    topic: str
    partition: int
    committed_offset: int
    high_watermark: int
    lag: int


class LagAt(_Model):
    at_ms: int = Field(description="The moment (epoch ms).")
    lag: int | None = Field(
        description="Total lag then, over the partitions below; null: the history does not reach back."
    )
    partitions: list[PartitionLagAt]


class LagHistory(_Model):
    group: str
    points: list[LagAt]


class OffsetLookup(_Model):
    topic: str
    partitions: list[dict[str, int | None]]
