"""HTTP request and response models (snake_case JSON)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from delta_log.core.topic_config import (
    ACK_MODES,
    CLEANUP_POLICY_PATTERN,
    COMPRESSION_TYPES,
    DEFAULT_CONFIG,
    INERT_CONFIG,
    MAX_JSON_INT,
    MAX_PARTITIONS,
    MAX_TABLE_LAG_MS,
    MAX_TOPIC_NAME_LENGTH,
    MIN_TABLE_LAG_MS,
    RATIO_PATTERN,
    TABLE_MODES,
    TOPIC_NAME_PATTERN,
)
from delta_log.core.value_schemas import COMPATIBILITY_LEVELS, MAX_SCHEMA_CHARS
from ingest_gateway.kit.params import BodyInt


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _config_schema(nullable: bool) -> dict[str, Any]:
    """The known keys and their values, as validate_config checks them (which stays the enforcer)."""

    def integer(minimum: int) -> dict[str, Any]:
        digits = {
            -2: r"^(-[12]|[0-9]{1,18}|9223372036854775807)$",
            -1: r"^(-1|[0-9]{1,18}|9223372036854775807)$",
            0: r"^([0-9]{1,18}|9223372036854775807)$",
            1: r"^([1-9][0-9]{0,17}|9223372036854775807)$",
        }[minimum]
        return {
            "anyOf": [
                {"type": "integer", "minimum": minimum, "maximum": MAX_JSON_INT},
                {"type": "string", "pattern": digits},
            ]
        }

    def choice(*values: str) -> dict[str, Any]:
        return {"type": "string", "enum": list(values)}

    keys: dict[str, dict[str, Any]] = {
        "retention.ms": integer(-1),
        "retention.bytes": integer(-1),
        "max.message.bytes": integer(1),
        "replicas": integer(1),
        "delete.retention.ms": integer(0),
        "min.compaction.lag.ms": integer(0),
        "message.timestamp.before.max.ms": integer(0),
        "message.timestamp.after.max.ms": integer(0),
        "cleanup.policy": {"type": "string", "pattern": CLEANUP_POLICY_PATTERN},
        "message.timestamp.type": choice("CreateTime", "LogAppendTime"),
        "retention.protect.unconsumed": {"anyOf": [{"type": "boolean"}, choice("true", "false")]},
        "errors.tolerance": choice("none", "all"),
        "errors.deadletterqueue.topic.name": {
            "anyOf": [
                {"type": "string", "maxLength": 0},
                {"type": "string", "pattern": TOPIC_NAME_PATTERN, "maxLength": MAX_TOPIC_NAME_LENGTH},
            ]
        },
        "topiclake.ack.mode": choice(*ACK_MODES),
        "topiclake.table.mode": choice(*TABLE_MODES),
        "topiclake.table.max.lag.ms": {
            "anyOf": [
                {"type": "integer", "minimum": MIN_TABLE_LAG_MS, "maximum": MAX_TABLE_LAG_MS},
                {"type": "string", "pattern": r"^0{0,11}([1-9][0-9]{1,5}|[12][0-9]{6}|3[0-5][0-9]{5}|3600000)$"},
            ]
        },
    }
    kinds: dict[str, dict[str, Any]] = {
        "int": integer(-2),
        "bool": {"anyOf": [{"type": "boolean"}, choice("true", "false")]},
        "ratio": {
            "anyOf": [{"type": "integer", "minimum": 0, "maximum": 1}, {"type": "string", "pattern": RATIO_PATTERN}]
        },
        "compression": choice(*COMPRESSION_TYPES),
        "text": {"type": "string", "maxLength": 1000},
    }
    keys |= {key: kinds[kind] for key, (_default, kind) in INERT_CONFIG.items()}
    assert set(keys) == set(DEFAULT_CONFIG), "document every topic config key"
    if nullable:
        keys = {k: {"anyOf": [v, {"type": "null"}]} for k, v in keys.items()}
    return {"type": "object", "properties": keys, "additionalProperties": False}


class RegisterSchema(BaseModel):
    """A schema to register, look up or check. Confluent's clients may also send `metadata` and
    `ruleSet` (data contracts): ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_text: str = Field(
        alias="schema", min_length=1, max_length=MAX_SCHEMA_CHARS, description="The schema, as a JSON string."
    )
    schema_type: Literal["AVRO", "JSON"] | None = Field(
        None, alias="schemaType", description="AVRO (the default) or JSON (JSON Schema)."
    )
    references: list[dict[str, Any]] = Field(
        default_factory=list, max_length=0, description="Not supported yet: inline referenced types."
    )


class CreateTopic(_Model):
    name: str = Field(
        description="Topic name: 1-249 characters from [a-zA-Z0-9._-], not '.' or '..'.",
        json_schema_extra={"minLength": 1, "maxLength": MAX_TOPIC_NAME_LENGTH, "pattern": TOPIC_NAME_PATTERN},
    )
    partitions: BodyInt = Field(
        1,
        description="Partition count (can be raised later, never lowered).",
        json_schema_extra={"minimum": 1, "maximum": MAX_PARTITIONS},
    )
    config: dict[str, str | int | bool] = Field(
        default_factory=dict, description="Kafka-style topic config.", json_schema_extra=_config_schema(False)
    )
    value_schema: RegisterSchema | None = Field(
        None,
        description="A value schema (`schema`, `schemaType` AVRO or JSON, as the registry takes them) "
        "registered under subject `<name>-value` with the topic, so produce is checked from the first "
        "record (on other gateways within server.schema_refresh_s). A schema the registry refuses "
        "refuses the request, and no topic is left behind.",
    )


class AlterConfig(_Model):
    config: dict[str, str | int | bool | None] = Field(
        description="Keys to set; null resets a key to its default.", json_schema_extra=_config_schema(True)
    )


class AddPartitions(_Model):
    count: BodyInt = Field(
        description="The new total partition count (larger than the current one).",
        json_schema_extra={"minimum": 1, "maximum": MAX_PARTITIONS},
    )


class PartitionInfo(_Model):
    partition: int
    log_start_offset: int
    high_watermark: int
    segments: int
    size_bytes: int


class RegisteredSchema(_Model):
    subject: str
    version: int
    id: int


class TopicInfo(_Model):
    name: str
    partitions: int
    config: dict[str, str]
    table_version: int
    partition_offsets: list[PartitionInfo] | None = None
    value_schema: RegisteredSchema | None = Field(None, description="The value schema registered at creation.")
    table_lag_ms: int | None = Field(
        None,
        description="`log` topics (topiclake.ack.mode=log): how long the oldest acked record has waited for the "
        "Delta table on this gateway; 0 when the table holds every ack.",
    )


class TopicList(_Model):
    topics: list[str]
    next: str | None = Field(None, description="More names follow: pass this as `after` for the next page.")


class RecordOffset(_Model):
    partition: int
    offset: int | None = Field(description="null in a transaction: offsets are assigned when it commits.")


class ProduceResponse(_Model):
    topic: str
    offsets: list[RecordOffset]
    duplicate: bool = False
    transactional_id: str | None = Field(None, description="The transaction the records are staged with.")


class PartitionBatch(_Model):
    partition: int
    base_offset: int | None = Field(description="null in a transaction: offsets are assigned when it commits.")
    count: int


class ProduceBatchResponse(_Model):
    topic: str
    record_count: int
    partitions: list[PartitionBatch]
    duplicate: bool = False
    transactional_id: str | None = Field(None, description="The transaction the records are staged with.")


class RecordHeader(_Model):
    key: str
    value: str | None = None


class ProducedRecord(_Model):
    """One record of a JSON produce body (also one line of NDJSON)."""

    value: Any = Field(
        description="Any JSON (value_format=json), a string (string) or base64 (binary); null: tombstone."
    )
    key: Any = Field(None, description="As `value`, per key_format (default string).")
    partition: BodyInt | None = Field(None, ge=0, description="Default: by key hash, else sticky.")
    timestamp: BodyInt | str | None = Field(None, description="Epoch ms or ISO-8601; -1 or absent: the server's time.")
    headers: dict[str, str | None] | list[RecordHeader] | None = None


class ProduceRequest(_Model):
    records: list[ProducedRecord] = Field(min_length=1)
    key_format: Literal["json", "string", "binary"] | None = None
    value_format: Literal["json", "string", "binary"] | None = None


# --- the schema registry API (Confluent's field names) -----------------------------------------
class CompatibilityLevel(BaseModel):
    model_config = ConfigDict(extra="ignore")

    compatibility: str = Field(
        json_schema_extra={"enum": list(COMPATIBILITY_LEVELS)}, description="Confluent's level names."
    )


# -- transactions ---------------------------------------------------------------------------------
_PRODUCER_ID: dict[str, Any] = {"minimum": 0, "maximum": 2**63 - 1}


class InitTransaction(_Model):
    timeout_ms: BodyInt = Field(
        60_000,
        ge=1,
        le=2**31 - 1,
        description="Abort the transaction if it stays open this long (transaction.timeout.ms).",
    )


class TransactionProducer(_Model):
    """The producer id and epoch `POST /transactions/{id}/init` gave."""

    producer_id: BodyInt = Field(json_schema_extra=_PRODUCER_ID)
    producer_epoch: BodyInt = Field(ge=0, le=2**15 - 1)


class TransactionOffset(_Model):
    topic: str = Field(
        max_length=MAX_TOPIC_NAME_LENGTH, json_schema_extra={"minLength": 1, "pattern": TOPIC_NAME_PATTERN}
    )
    partition: BodyInt = Field(ge=0, le=MAX_PARTITIONS - 1)
    offset: BodyInt = Field(
        ge=0, le=MAX_JSON_INT, description="The next offset to consume, committed with the transaction."
    )
    metadata: str = Field("", max_length=4096)


class TransactionPartition(_Model):
    topic: str = Field(
        max_length=MAX_TOPIC_NAME_LENGTH, json_schema_extra={"minLength": 1, "pattern": TOPIC_NAME_PATTERN}
    )
    partition: BodyInt = Field(ge=0, le=MAX_PARTITIONS - 1)


class TransactionAdd(TransactionProducer):
    """Partitions and groups the producer's transaction writes (Kafka's AddPartitionsToTxn and
    AddOffsetsToTxn in one)."""

    partitions: list[TransactionPartition] = Field(default_factory=list, max_length=10_000)
    groups: list[Annotated[str, Field(min_length=1, max_length=255)]] = Field(default_factory=list, max_length=100)


class TransactionOffsets(TransactionProducer):
    group: str = Field(min_length=1, max_length=255)
    #: the group member the offsets are committed for (checked as for POST /groups/{g}/offsets)
    member_id: str | None = Field(None, max_length=300)
    generation: BodyInt | None = Field(None, ge=-1, le=2**31 - 1)
    offsets: list[TransactionOffset] = Field(max_length=100_000)


class TransactionPartitions(_Model):
    topic: str
    partitions: list[int]


class TransactionState(_Model):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str = Field(
        description="Kafka's: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort."
    )
    timeout_ms: int
    #: when the open transaction began (ms since the epoch; null: none is open)
    start_ms: int | None
    topics: list[TransactionPartitions]
    groups: list[str]


class TransactionList(_Model):
    transactions: list[TransactionState]
