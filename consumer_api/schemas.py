"""HTTP models of the consumer API (snake_case)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JoinRequest(_Model):
    topics: list[str] = Field(description="Topics to subscribe to.")
    member_id: str | None = Field(None, description="Set when rejoining after a rebalance.")
    instance_id: str | None = Field(None, description="Static membership: a stable id for this consumer.")
    session_timeout_ms: int = 10_000
    assignor: str = Field("range", description="range, roundrobin or sticky.")


class JoinResponse(_Model):
    group: str
    member_id: str
    generation: int
    assignment: dict[str, list[int]]
    members: int


class HeartbeatRequest(_Model):
    generation: int


class HeartbeatResponse(_Model):
    generation: int
    rebalance: bool
    assignment: dict[str, list[int]]


class PartitionOffset(_Model):
    topic: str
    partition: int
    offset: int = Field(description="The next offset to consume (Kafka's committed-offset meaning).")
    metadata: str = ""


class CommitRequest(_Model):
    member_id: str | None = None
    generation: int | None = None
    offsets: list[PartitionOffset]


class CommittedOffsets(_Model):
    group: str
    offsets: list[PartitionOffset]


class ResetRequest(_Model):
    topic: str
    to: Literal["earliest", "latest", "timestamp", "offset"]
    timestamp: int | None = Field(None, description="Epoch ms, for to=timestamp.")
    offset: int | None = Field(None, description="For to=offset.")
    partitions: list[int] | None = Field(None, description="Default: every partition.")


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
