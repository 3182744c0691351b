"""HTTP request and response models (snake_case JSON)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateTopic(_Model):
    name: str = Field(description="Topic name: 1-249 characters from [a-zA-Z0-9._-].")
    partitions: int = Field(1, description="Partition count (can be raised later, never lowered).")
    config: dict[str, str | int | bool] = Field(default_factory=dict, description="Kafka-style topic config.")


class AlterConfig(_Model):
    config: dict[str, str | int | bool | None] = Field(description="Keys to set; null resets a key to its default.")


class AddPartitions(_Model):
    count: int = Field(description="The new total partition count.")


class PartitionInfo(_Model):
    partition: int
    log_start_offset: int
    high_watermark: int
    segments: int
    size_bytes: int


class TopicInfo(_Model):
    name: str
    partitions: int
    config: dict[str, str]
    table_version: int
    partition_offsets: list[PartitionInfo] | None = None


class TopicList(_Model):
    topics: list[str]


class RecordOffset(_Model):
    partition: int
    offset: int


class ProduceResponse(_Model):
    topic: str
    offsets: list[RecordOffset]
    duplicate: bool = False


class PartitionBatch(_Model):
    partition: int
    base_offset: int
    count: int


class ProduceBatchResponse(_Model):
    topic: str
    record_count: int
    partitions: list[PartitionBatch]
    duplicate: bool = False
