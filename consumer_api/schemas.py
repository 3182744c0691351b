"""HTTP models of the consumer API (snake_case)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


INT32 = 2**31 - 1
INT64 = 2**63 - 1


class JoinRequest(_Model):
    topics: list[Annotated[str, Field(max_length=249)]] = Field(
        max_length=100_000, description="1-1000 distinct topics to subscribe to (duplicates are ignored)."
    )
    member_id: str | None = Field(None, max_length=300, description="Set when rejoining after a rebalance.")
    instance_id: str | None = Field(
        None,
        max_length=249,
        pattern=r"^[a-zA-Z0-9._-]+$",
        description="Static membership (Kafka's group.instance.id): a stable id for this consumer.",
    )
    session_timeout_ms: int = Field(10_000, description="1000-300000; outside: 400 INVALID_GROUP.")
    assignor: str = Field("range", max_length=32, description="range, roundrobin or sticky.")


class JoinResponse(_Model):
    group: str
    member_id: str
    generation: int
    assignment: dict[str, list[int]]
    members: int


class HeartbeatRequest(_Model):
    generation: int = Field(ge=-1, le=INT32)


class HeartbeatResponse(_Model):
    generation: int
    rebalance: bool
    assignment: dict[str, list[int]]


class PartitionOffset(_Model):
    topic: str = Field(max_length=249)
    partition: int
    offset: int = Field(description="The next offset to consume (Kafka's committed-offset meaning), 0..2**63-1.")
    metadata: str = Field("", max_length=4096, description="At most 4096 bytes (offset.metadata.max.bytes).")


class CommitRequest(_Model):
    member_id: str | None = Field(None, max_length=300)
    generation: int | None = Field(None, ge=-1, le=INT32)
    offsets: list[PartitionOffset] = Field(max_length=100_000)


class CommittedOffsets(_Model):
    group: str
    offsets: list[PartitionOffset]


class ResetRequest(_Model):
    topic: str = Field(max_length=249)
    to: Literal["earliest", "latest", "timestamp", "offset"]
    timestamp: int | None = Field(None, ge=0, le=INT64, description="Epoch ms, for to=timestamp.")
    offset: int | None = Field(None, ge=0, le=INT64, description="For to=offset.")
    partitions: list[Annotated[int, Field(ge=0, le=INT32)]] | None = Field(
        None, max_length=10_000, description="Default: every partition."
    )


class MemberInfo(_Model):
    member_id: str
    instance_id: str | None
    topics: list[str]
    session_timeout_ms: int
    assignment: dict[str, list[int]]


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


class OffsetLookup(_Model):
    topic: str
    partitions: list[dict[str, int | None]]
