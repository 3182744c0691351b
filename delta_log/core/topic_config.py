"""Topic names and topic configuration: pure validation, no I/O.

Names follow Kafka's rule: 1-249 characters from [a-zA-Z0-9._-], not "." or "..".
Configuration uses Kafka's keys; values are kept as strings (as Kafka does) after validation and
are stored as Delta table properties prefixed `topiclake.`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from delta_log.core.records import MAX_OFFSET, TimestampWindow
from delta_log.errors import InvalidConfigError, InvalidPartitionsError, InvalidTopicError

MAX_TOPIC_NAME_LENGTH = 249
MAX_PARTITIONS = 10_000
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")

#: Kafka's internal topic of committed offsets: listed by the Kafka face as Kafka lists it
#: (internal, `OFFSETS_TOPIC_PARTITIONS` partitions), read as empty (the offsets are the offsets
#: table's, docs/KAFKA.md); no topic of that name can be created
OFFSETS_TOPIC = "__consumer_offsets"
#: Kafka's offsets.topic.num.partitions default
OFFSETS_TOPIC_PARTITIONS = 50
INTERNAL_TOPICS = {OFFSETS_TOPIC: OFFSETS_TOPIC_PARTITIONS}
#: validate_topic_name as one regular expression (legal characters, not "." or ".."), for the
#: OpenAPI document; with maxLength MAX_TOPIC_NAME_LENGTH.
TOPIC_NAME_PATTERN = r"^(?:[a-zA-Z0-9_-][a-zA-Z0-9._-]*|\.[a-zA-Z0-9_-][a-zA-Z0-9._-]*|\.\.[a-zA-Z0-9._-]+)$"
PROPERTY_PREFIX = "topiclake."
PARTITIONS_PROPERTY = "topiclake.partitions"

DEFAULT_CONFIG: dict[str, str] = {
    "retention.ms": "604800000",  # 7 days; -1 = forever
    "retention.bytes": "-1",  # per partition; -1 = unlimited
    "cleanup.policy": "delete",
    "max.message.bytes": "1048588",
    "delete.retention.ms": "86400000",
    "message.timestamp.type": "CreateTime",
    # Kafka 4's defaults (KIP-937/KIP-1030): any time in the past, at most one hour ahead
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.after.max.ms": "3600000",
    "min.compaction.lag.ms": "0",
    "replicas": "1",
    "retention.protect.unconsumed": "false",
    # records that fail the topic's value schema (Kafka Connect's names): "none" refuses the request,
    # "all" writes the valid records and sends the others to the dead-letter topic
    "errors.tolerance": "none",
    "errors.deadletterqueue.topic.name": "",  # empty: <topic>.dlq
    # when a produce is acked: "table" after the Delta commit that holds it; "log" once durable in
    # the gateway's write-ahead log, flushed into the table within topiclake.table.max.lag.ms
    "topiclake.ack.mode": "table",
    "topiclake.table.max.lag.ms": "1000",
    # "upsert" also keeps <topic>_latest, one row per key (the upsert job, delta_log.maintenance.upsert)
    "topiclake.table.mode": "log",
}
ACK_MODES = ("table", "log")
TABLE_MODES = ("log", "upsert")

#: Kafka's topic configs that mean nothing for a Delta table (log segments, replicas, flushing and
#: tiered storage are the table's and the storage root's business): accepted, validated, stored and
#: described as Kafka does, so Kafka's tools, Connect and Streams may set them; they change nothing.
#: key -> (Kafka's default, kind of value)
INERT_CONFIG: dict[str, tuple[str, str]] = {
    "compression.type": ("producer", "compression"),
    "segment.bytes": ("1073741824", "int"),
    "segment.ms": ("604800000", "int"),
    "segment.jitter.ms": ("0", "int"),
    "segment.index.bytes": ("10485760", "int"),
    "index.interval.bytes": ("4096", "int"),
    "min.insync.replicas": ("1", "int"),
    "unclean.leader.election.enable": ("false", "bool"),
    "flush.messages": ("9223372036854775807", "int"),
    "flush.ms": ("9223372036854775807", "int"),
    "min.cleanable.dirty.ratio": ("0.5", "ratio"),
    "max.compaction.lag.ms": ("9223372036854775807", "int"),
    "file.delete.delay.ms": ("60000", "int"),
    "preallocate": ("false", "bool"),
    "remote.storage.enable": ("false", "bool"),
    "local.retention.ms": ("-2", "int"),
    "local.retention.bytes": ("-2", "int"),
    "leader.replication.throttled.replicas": ("", "text"),
    "follower.replication.throttled.replicas": ("", "text"),
}
DEFAULT_CONFIG.update({k: default for k, (default, _kind) in INERT_CONFIG.items()})
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
#: a number between 0 and 1, at most 6 decimals (min.cleanable.dirty.ratio)
RATIO_PATTERN = r"^(0(\.[0-9]{1,6})?|1(\.0{1,6})?)$"
MIN_TABLE_LAG_MS, MAX_TABLE_LAG_MS = 10, 3_600_000

#: cleanup.policy: delete, compact or both (Kafka's list syntax, spaces around items allowed)
CLEANUP_POLICY_PATTERN = r"^ *(compact *, *delete|delete *, *compact|compact|delete) *$"


def validate_topic_name(name: object) -> str:
    """Return `name` if it is a legal topic name.

    Raises:
        InvalidTopicError: wrong type, empty, too long, illegal characters, "." or "..".
    """
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("Topic name must be a non-empty string.", topic=str(name))
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name is {len(name)} characters; the limit is {MAX_TOPIC_NAME_LENGTH}.", topic=name
        )
    if name in {".", ".."}:
        raise InvalidTopicError(f"Topic name {name!r} is reserved.", topic=name)
    if not _LEGAL.fullmatch(name):
        raise InvalidTopicError(f"Topic name {name!r} has illegal characters.", topic=name)
    return name


def validate_partitions(partitions: object) -> int:
    """Raises: InvalidPartitionsError unless 1 <= partitions <= MAX_PARTITIONS."""
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise InvalidPartitionsError("Partition count must be an integer.", partitions=str(partitions))
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"Partition count must be between 1 and {MAX_PARTITIONS}; got {partitions}.",
            partitions=partitions,
        )
    return partitions


MAX_JSON_INT = 2**53 - 1
#: plain decimal digits, at most 18, or Kafka's "no limit" (Long.MAX_VALUE)
_INTEGER = re.compile(r"^(-?[0-9]{1,18}|9223372036854775807)$")


def _int_value(key: str, raw: object, value: str, minimum: int) -> None:
    """JSON integers up to 2**53-1 (what every JSON parser reads exactly), or strings of plain
    decimal digits (at most 18, or 9223372036854775807)."""
    if isinstance(raw, bool) or not (isinstance(raw, int) or _INTEGER.fullmatch(value)):
        raise InvalidConfigError(f"{key} must be an integer; got {value!r}.", key=key)
    if isinstance(raw, int) and raw > MAX_JSON_INT:
        raise InvalidConfigError(f"{key}: integers above {MAX_JSON_INT} are sent as strings; got {raw}.", key=key)
    number = int(value)
    if not minimum <= number <= MAX_OFFSET:
        raise InvalidConfigError(f"{key} must be between {minimum} and {MAX_OFFSET}; got {number}.", key=key)


def _inert_value(key: str, raw: object, value: str, kind: str) -> None:
    """Raises: InvalidConfigError for a value Kafka would refuse for `key`."""
    if kind == "int":
        _int_value(key, raw, value, -2)
    elif kind == "bool" and value not in {"true", "false"}:
        raise InvalidConfigError(f"{key} must be true or false; got {value!r}.", key=key)
    elif kind == "ratio" and not re.fullmatch(RATIO_PATTERN, value):
        raise InvalidConfigError(f"{key} must be a number between 0 and 1; got {value!r}.", key=key)
    elif kind == "compression" and value not in COMPRESSION_TYPES:
        raise InvalidConfigError(f"{key} must be one of {', '.join(COMPRESSION_TYPES)}; got {value!r}.", key=key)
    elif kind == "text" and (not isinstance(raw, str) or len(value) > 1000):
        raise InvalidConfigError(f"{key} is a string of at most 1000 characters.", key=key)


def validate_config(updates: Mapping[str, object]) -> dict[str, str]:
    """Validate config updates; return them as strings.

    Raises:
        InvalidConfigError: unknown key or a value of the wrong type or range.
    """
    out: dict[str, str] = {}
    for key, raw in updates.items():
        if key not in DEFAULT_CONFIG:
            raise InvalidConfigError(
                f"Unknown topic config {key!r}. Known keys: {', '.join(sorted(DEFAULT_CONFIG))}.", key=key
            )
        value = str(raw) if not isinstance(raw, bool) else str(raw).lower()
        if key in {"retention.ms", "retention.bytes"}:
            _int_value(key, raw, value, -1)
        elif key in {"max.message.bytes", "replicas"}:
            _int_value(key, raw, value, 1)
        elif key in {
            "delete.retention.ms",
            "min.compaction.lag.ms",
            "message.timestamp.before.max.ms",
            "message.timestamp.after.max.ms",
        }:
            _int_value(key, raw, value, 0)
        elif key == "cleanup.policy":
            if not re.fullmatch(CLEANUP_POLICY_PATTERN, value):
                raise InvalidConfigError(
                    f"cleanup.policy must be delete, compact or compact,delete; got {value!r}.", key=key
                )
            value = value.replace(" ", "")
        elif key == "message.timestamp.type":
            if value not in {"CreateTime", "LogAppendTime"}:
                raise InvalidConfigError(
                    f"message.timestamp.type must be CreateTime or LogAppendTime; got {value!r}.", key=key
                )
        elif key == "retention.protect.unconsumed" and value not in {"true", "false"}:
            raise InvalidConfigError(f"{key} must be true or false; got {value!r}.", key=key)
        elif key in INERT_CONFIG:
            _inert_value(key, raw, value, INERT_CONFIG[key][1])
        elif key == "topiclake.ack.mode" and value not in ACK_MODES:
            raise InvalidConfigError(f"{key} must be table or log; got {value!r}.", key=key)
        elif key == "topiclake.table.mode" and value not in TABLE_MODES:
            raise InvalidConfigError(
                f"{key} must be log or upsert (upsert also keeps <topic>_latest, the latest value per key); "
                f"got {value!r}.",
                key=key,
            )
        elif key == "topiclake.table.max.lag.ms":
            _int_value(key, raw, value, MIN_TABLE_LAG_MS)
            if int(value) > MAX_TABLE_LAG_MS:
                raise InvalidConfigError(f"{key} must be at most {MAX_TABLE_LAG_MS} (one hour); got {value}.", key=key)
        elif key == "errors.tolerance" and value not in {"none", "all"}:
            raise InvalidConfigError(f"{key} must be none or all; got {value!r}.", key=key)
        elif key == "errors.deadletterqueue.topic.name":
            if not isinstance(raw, str):
                raise InvalidConfigError(f"{key} is a topic name (a string); got {value!r}.", key=key)
            if value:
                validate_topic_name(value)
        out[key] = value
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfig:
    """A topic's partition count and Kafka-style configuration (all values present)."""

    partitions: int
    values: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CONFIG))

    @property
    def max_message_bytes(self) -> int:
        return int(self.values["max.message.bytes"])

    @property
    def retention_ms(self) -> int:
        return int(self.values["retention.ms"])

    @property
    def retention_bytes(self) -> int:
        return int(self.values["retention.bytes"])

    @property
    def cleanup_policy(self) -> str:
        return self.values["cleanup.policy"]

    @property
    def timestamp_window(self) -> TimestampWindow:
        return TimestampWindow(
            before_max_ms=int(self.values.get("message.timestamp.before.max.ms", MAX_OFFSET)),
            after_max_ms=int(self.values.get("message.timestamp.after.max.ms", MAX_OFFSET)),
        )

    @property
    def compression_type(self) -> str:
        """Kafka's compression.type: the codec of the batches Kafka's Fetch returns ("producer":
        the one the records' producer used, kept as their metadata, records.CODEC_KEY;
        "uncompressed", or a codec name)."""
        return self.values.get("compression.type", "producer")

    @property
    def ack_mode(self) -> str:
        return self.values.get("topiclake.ack.mode", "table")

    @property
    def table_max_lag_ms(self) -> int:
        return int(self.values.get("topiclake.table.max.lag.ms", "1000"))

    @property
    def table_mode(self) -> str:
        return self.values.get("topiclake.table.mode", "log")

    @property
    def log_append_time(self) -> bool:
        return self.values["message.timestamp.type"] == "LogAppendTime"

    def dead_letter_config(self) -> dict[str, str]:
        """What a dead-letter topic created on first use inherits from its topic: how it acks (a
        `log` topic's requests must not wait for a Delta commit of their dead letters)."""
        keys = ("topiclake.ack.mode", "topiclake.table.max.lag.ms")
        return {k: self.values[k] for k in keys if k in self.values}

    def dead_letter_topic(self, topic: str) -> str | None:
        """Where `topic`'s invalid records go (None: errors.tolerance=none, they are refused).

        Raises: InvalidConfigError when the default name `<topic>.dlq` would be too long.
        """
        if self.values.get("errors.tolerance", "none") != "all":
            return None
        name = self.values.get("errors.deadletterqueue.topic.name") or f"{topic}.dlq"
        if name == topic:
            raise InvalidConfigError(
                f"Topic {topic!r} cannot be its own dead-letter topic; set errors.deadletterqueue.topic.name.",
                key="errors.deadletterqueue.topic.name",
            )
        if len(name) > MAX_TOPIC_NAME_LENGTH:
            raise InvalidConfigError(
                f"{name[:40]}... is too long for a topic name; set errors.deadletterqueue.topic.name.",
                key="errors.deadletterqueue.topic.name",
            )
        return name

    def to_properties(self) -> dict[str, str]:
        props = {PROPERTY_PREFIX + k: v for k, v in self.values.items()}
        props[PARTITIONS_PROPERTY] = str(self.partitions)
        return props

    @classmethod
    def from_properties(cls, props: Mapping[str, str | None]) -> TopicConfig:
        values = dict(DEFAULT_CONFIG)
        for key, value in props.items():
            if key.startswith(PROPERTY_PREFIX) and key != PARTITIONS_PROPERTY and value is not None:
                values[key[len(PROPERTY_PREFIX) :]] = value
        return cls(partitions=int(props.get(PARTITIONS_PROPERTY) or 1), values=values)
