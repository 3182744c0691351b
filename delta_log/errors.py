"""The one error hierarchy of topiclake.

Every error has a stable UPPER_SNAKE `code` that clients branch on, a `retriable` flag and typed
fields from which the message is built. Third-party exceptions (deltalake, pyarrow, py4j) are
translated once, at the adapter that called them, with `raise ... from exc`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TopiclakeError(Exception):
    """Root of every error topiclake raises on purpose."""

    code: ClassVar[str] = "INTERNAL_ERROR"
    retriable: ClassVar[bool] = False
    hint: ClassVar[str] = ""

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.details: dict[str, Any] = {k: v for k, v in details.items() if v is not None}
        base = message or self._default_message()
        self.message = f"{base} {self.hint}".strip() if self.hint else base
        super().__init__(self.message)

    def _default_message(self) -> str:
        return self.code.replace("_", " ").capitalize()

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


# --- topics and partitions -------------------------------------------------------------------
class InvalidTopicError(TopiclakeError):
    code = "INVALID_TOPIC"
    hint = "Topic names use 1-249 characters from [a-zA-Z0-9._-] and are not '.' or '..'."


class TopicNotFoundError(TopiclakeError):
    code = "UNKNOWN_TOPIC"
    hint = "Create it first (POST /topics or `topiclake topics create`)."

    def __init__(self, topic: str) -> None:
        super().__init__(f"Topic {topic!r} does not exist.", topic=topic)


class TopicExistsError(TopiclakeError):
    code = "TOPIC_ALREADY_EXISTS"
    hint = "Pick another name, or delete the existing topic first."

    def __init__(self, topic: str) -> None:
        super().__init__(f"Topic {topic!r} already exists.", topic=topic)


class PartitionNotFoundError(TopiclakeError):
    code = "UNKNOWN_PARTITION"

    def __init__(self, topic: str, partition: int, partitions: int) -> None:
        super().__init__(
            f"Topic {topic!r} has partitions 0..{partitions - 1}; partition {partition} does not exist. "
            "Use one of those, or add partitions.",
            topic=topic,
            partition=partition,
            partitions=partitions,
        )


class InvalidConfigError(TopiclakeError):
    code = "INVALID_CONFIG"


class SourceOptionError(InvalidConfigError):
    """A `topiclake` Spark source option is missing, contradictory or malformed."""

    code = "INVALID_SOURCE_OPTION"


class InvalidPartitionsError(TopiclakeError):
    code = "INVALID_PARTITIONS"


class PartitionCountConflictError(InvalidPartitionsError):
    """A valid count that the topic's current count rules out (it can only grow): a conflict with
    the topic's state, Kafka's INVALID_PARTITIONS."""

    hint = "Describe the topic and ask for more partitions than it has."


# --- records ---------------------------------------------------------------------------------
class InvalidRecordError(TopiclakeError):
    """A record in a batch cannot be stored; `index` names it."""

    code = "INVALID_RECORD"


class InvalidSchemaError(TopiclakeError):
    code = "INVALID_SCHEMA"
    hint = "Send columns key (binary), value (binary), and optionally partition, timestamp, headers."


class InvalidTimestampError(InvalidRecordError):
    """A record timestamp outside what a topic table (and Spark) can hold, or outside the topic's
    message.timestamp.before/after.max.ms; `index` names the record."""

    code = "INVALID_TIMESTAMP"
    hint = "Send epoch milliseconds between 0 and 253402300799999 (9999-12-31), or -1 for the server's time."


class CorruptRecordError(InvalidRecordError):
    """Bytes that are no record batch: truncated, a bad CRC, a codec's frame that does not decode."""

    code = "CORRUPT_RECORD"
    hint = "The client sent damaged bytes; send the batch again (a client bug if it persists)."


class UnsupportedCompressionError(InvalidRecordError):
    code = "UNSUPPORTED_COMPRESSION_TYPE"
    hint = "Compress with none, gzip, snappy, lz4 or zstd."


class UnsupportedMessageFormatError(InvalidRecordError):
    """A record batch older than Kafka's v2 (magic 2) format."""

    code = "UNSUPPORTED_MESSAGE_FORMAT"
    hint = "Use a client that writes record batches v2 (Kafka 0.11 and later)."


class RecordTooLargeError(TopiclakeError):
    code = "RECORD_TOO_LARGE"
    hint = "Split the value, or raise the topic's max.message.bytes."


class RequestTooLargeError(TopiclakeError):
    code = "REQUEST_TOO_LARGE"
    hint = "Send smaller batches."


# --- offsets ---------------------------------------------------------------------------------
class OffsetOutOfRangeError(TopiclakeError):
    code = "OFFSET_OUT_OF_RANGE"

    def __init__(self, *, topic: str, partition: int, offset: int, log_start_offset: int, high_watermark: int) -> None:
        super().__init__(
            f"Offset {offset} is outside [{log_start_offset}, {high_watermark}] for {topic}-{partition}. "
            "Seek to a valid offset (auto.offset.reset earliest or latest).",
            topic=topic,
            partition=partition,
            offset=offset,
            log_start_offset=log_start_offset,
            high_watermark=high_watermark,
        )


class InvalidOffsetError(TopiclakeError):
    code = "INVALID_OFFSET"


class OffsetMetadataTooLargeError(TopiclakeError):
    code = "OFFSET_METADATA_TOO_LARGE"
    hint = "Commit metadata is at most 4096 bytes (Kafka's offset.metadata.max.bytes)."


# --- idempotent producers --------------------------------------------------------------------
class DuplicateSequenceError(TopiclakeError):
    """An older sequence than the producer's last; it was committed, but its offsets are gone."""

    code = "DUPLICATE_SEQUENCE"
    hint = "This request was already written; do not retry it."


class OutOfOrderSequenceError(TopiclakeError):
    """A batch whose first sequence does not follow the producer's last one on the partition
    (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER: a batch before it was lost)."""

    code = "OUT_OF_ORDER_SEQUENCE"
    hint = "A batch before this one was not written; the producer must reset its sequence (a new producer id)."


# --- transactions ----------------------------------------------------------------------------
class ProducerFencedError(TopiclakeError):
    """A newer producer of the transactional id initialized (or the coordinator aborted this
    producer's transaction at its timeout): this one may not write or decide any more. Kafka's
    PRODUCER_FENCED (INVALID_PRODUCER_EPOCH to older clients)."""

    code = "PRODUCER_FENCED"
    hint = "Close this producer; a producer with a newer epoch owns the transactional id."

    def __init__(self, transactional_id: str, epoch: int) -> None:
        super().__init__(
            f"Producer of transactional id {transactional_id!r} was fenced: the current epoch is {epoch}.",
            transactional_id=transactional_id,
            epoch=epoch,
        )


class InvalidProducerIdMappingError(TopiclakeError):
    """The producer id is not the transactional id's (unknown id, or a new producer id since).
    Kafka's INVALID_PRODUCER_ID_MAPPING."""

    code = "INVALID_PRODUCER_ID_MAPPING"
    hint = "Initialize the producer again (initTransactions / init_transactions)."

    def __init__(self, transactional_id: str) -> None:
        super().__init__(
            f"The producer id is not the current one of transactional id {transactional_id!r}.",
            transactional_id=transactional_id,
        )


class InvalidTxnStateError(TopiclakeError):
    """The request does not fit the transaction's state (ending a transaction that is not open, a
    transactional write outside a transaction). Kafka's INVALID_TXN_STATE."""

    code = "INVALID_TXN_STATE"
    hint = "Begin a transaction and add its partitions before writing to them; commit or abort it once."


class InvalidTransactionTimeoutError(TopiclakeError):
    code = "INVALID_TRANSACTION_TIMEOUT"
    hint = "Set transaction.timeout.ms within the server's limit (transactions.max_timeout_ms)."


class ConcurrentTransactionsError(TopiclakeError):
    """The transactional id's previous transaction is being completed. Kafka's
    CONCURRENT_TRANSACTIONS (clients retry it by themselves)."""

    code = "CONCURRENT_TRANSACTIONS"
    retriable = True
    hint = "Retry in a moment: the previous transaction of this id is being completed."

    def __init__(self, transactional_id: str) -> None:
        super().__init__(
            f"Transactional id {transactional_id!r} is completing its previous transaction.",
            transactional_id=transactional_id,
        )


class TransactionalIdNotFoundError(TopiclakeError):
    code = "TRANSACTIONAL_ID_NOT_FOUND"
    hint = "No producer initialized this transactional id (or it expired)."

    def __init__(self, transactional_id: str) -> None:
        super().__init__(f"Transactional id {transactional_id!r} is not known.", transactional_id=transactional_id)


class UnstableOffsetCommitError(TopiclakeError):
    """A transaction that commits offsets for the partition is still open. Kafka's
    UNSTABLE_OFFSET_COMMIT (clients retry it by themselves)."""

    code = "UNSTABLE_OFFSET_COMMIT"
    retriable = True
    hint = "Retry once the transaction that commits this offset is committed or aborted."


# --- storage and concurrency -----------------------------------------------------------------
class CommitConflictError(TopiclakeError):
    code = "COMMIT_CONFLICT"
    retriable = True
    hint = "Another writer kept winning; retry the request."


class SourcesGoneError(TopiclakeError):
    """A file a maintenance commit meant to remove is no longer live (another job removed it), or
    other commits kept landing first; the caller plans again."""

    code = "SOURCES_GONE"
    retriable = True
    hint = "Another job changed the same files; run it again."


class WriteAheadGapError(TopiclakeError):
    """Records a write-ahead log acked do not continue the topic table (something other than the
    partition's owner appended to it). Never expected; the flush stops and says so."""

    code = "WRITE_AHEAD_GAP"
    hint = "Report it with the gateway's log; the write-ahead log is kept until it flushes."


class StorageUnavailableError(TopiclakeError):
    code = "STORAGE_UNAVAILABLE"
    retriable = True
    hint = "Check the storage root is reachable and writable, then retry."


class BackPressureError(TopiclakeError):
    code = "BACK_PRESSURE"
    retriable = True
    hint = "The write queue is full; retry after the Retry-After delay."


class WriterClosedError(TopiclakeError):
    code = "WRITER_CLOSED"
    retriable = True
    hint = "The server is shutting down; retry against a running server."


# --- value schemas and the schema registry ----------------------------------------------------
class SchemaRegistryError(TopiclakeError):
    """An error of the schema registry API; `registry_code` is Confluent Schema Registry's
    `error_code` for it (its clients branch on that)."""

    code = "SCHEMA_REGISTRY_ERROR"
    registry_code: ClassVar[int] = 50001


class SubjectNotFoundError(SchemaRegistryError):
    code = "SUBJECT_NOT_FOUND"
    registry_code = 40401
    hint = "Register a schema under it first (POST /registry/subjects/<subject>/versions); GET /registry/subjects lists them."


class VersionNotFoundError(SchemaRegistryError):
    code = "VERSION_NOT_FOUND"
    registry_code = 40402
    hint = "GET /registry/subjects/<subject>/versions lists the versions there are."


class SchemaNotFoundError(SchemaRegistryError):
    code = "SCHEMA_NOT_FOUND"
    registry_code = 40403
    hint = "Register the schema first; ids come from POST /registry/subjects/<subject>/versions."


class SubjectNotSoftDeletedError(SchemaRegistryError):
    code = "SUBJECT_NOT_SOFT_DELETED"
    registry_code = 40405
    hint = "Delete it without permanent=true first, then permanently."


class VersionNotSoftDeletedError(SchemaRegistryError):
    code = "VERSION_NOT_SOFT_DELETED"
    registry_code = 40407
    hint = "Delete the version without permanent=true first, then permanently."


class SubjectConfigNotFoundError(SchemaRegistryError):
    code = "SUBJECT_CONFIG_NOT_FOUND"
    registry_code = 40408
    hint = "The subject uses the global level (GET /registry/config, or defaultToGlobal=true)."


class IncompatibleSchemaError(SchemaRegistryError):
    """A new version breaks the subject's compatibility level; `messages` say where."""

    code = "INCOMPATIBLE_SCHEMA"
    registry_code = 409
    hint = "Change the schema as the level allows (e.g. BACKWARD: add fields with defaults), or change the level."


class InvalidValueSchemaError(SchemaRegistryError):
    code = "INVALID_VALUE_SCHEMA"
    registry_code = 42201
    hint = "Send {'schema': '<the schema as a JSON string>', 'schemaType': 'AVRO' (default) or 'JSON'}."


class InvalidCompatibilityLevelError(SchemaRegistryError):
    code = "INVALID_COMPATIBILITY_LEVEL"
    registry_code = 42203
    hint = "Use NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL or FULL_TRANSITIVE."


class SchemaValidationError(InvalidRecordError):
    """Records of a request do not match the topic's value schema; `records` lists each one's index
    and reason, and nothing of the request was written."""

    code = "SCHEMA_VALIDATION_FAILED"
    hint = (
        "Fix the records listed (or set the topic's errors.tolerance=all to send them to its "
        "dead-letter topic) and send the request again."
    )


class SinkRefusedError(TopiclakeError):
    """A gateway refused the Spark sink's records; the message carries the gateway's answer (a bad
    record, no access). Raised on the Spark driver, never answered over HTTP."""

    code = "SINK_REFUSED"
    hint = "Fix what the gateway's answer names, or write directly with option('gateway', 'none')."


def error_of(payload: dict[str, Any]) -> TopiclakeError:
    """The error an answer's envelope (`TopiclakeError.to_dict`) carries, as its class when one
    has its code (a gateway relaying another gateway's refusal to its own client)."""
    code = str(payload.get("code", TopiclakeError.code))
    cls = next((c for c in all_error_classes() if c.code == code), TopiclakeError)
    exc = cls.__new__(cls)
    exc.details = dict(payload.get("details") or {})
    exc.message = str(payload.get("message") or code)
    Exception.__init__(exc, exc.message)
    return exc


def all_error_classes() -> list[type[TopiclakeError]]:
    """Every concrete error class (used to check each has an HTTP status)."""
    seen: list[type[TopiclakeError]] = []
    stack: list[type[TopiclakeError]] = [TopiclakeError]
    while stack:
        cls = stack.pop()
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    return seen


# --- authentication and authorization (every front door: HTTP, forwarded requests, Kafka) -------
class AuthenticationError(TopiclakeError):
    code = "UNAUTHENTICATED"
    hint = "Send 'Authorization: Bearer <api key>' with a configured key."


class AuthorizationError(TopiclakeError):
    code = "FORBIDDEN"
    hint = "Ask an admin to grant this key the operation on the topic or group (auth.api_keys acls, groups)."


class TransactionalIdAuthorizationError(AuthorizationError):
    """Kafka's TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""


# --- maintenance jobs ------------------------------------------------------------------------
class UnknownJobError(TopiclakeError):
    code = "UNKNOWN_JOB"
    hint = "GET /jobs lists the jobs this server runs."


# --- consumer groups -------------------------------------------------------------------------
class UnknownGroupError(TopiclakeError):
    code = "UNKNOWN_GROUP"
    hint = "Join the group first (POST /groups/{group}/members)."


class UnknownGroupMemberError(UnknownGroupError):
    """A member's request (SyncGroup, Heartbeat, LeaveGroup) to a group that does not exist: to the
    member, it is unknown (Kafka answers UNKNOWN_MEMBER_ID; HTTP, UNKNOWN_GROUP)."""


class UnknownMemberError(TopiclakeError):
    code = "UNKNOWN_MEMBER"
    hint = "The member left or its session expired; join the group again."


class NotCoordinatorError(TopiclakeError):
    """This gateway does not (or no longer) coordinate the group: another gateway took it over.
    Kafka's NOT_COORDINATOR."""

    code = "NOT_COORDINATOR"
    hint = "Retry: any gateway forwards the request to the group's coordinator."


class CoordinatorNotAvailableError(TopiclakeError):
    """The group's coordinator gateway cannot be reached (it may have died; another takes the group
    over within the cluster's membership timeout). Kafka's COORDINATOR_NOT_AVAILABLE."""

    code = "COORDINATOR_NOT_AVAILABLE"
    hint = "Retry after a few seconds, through any gateway."


class OwnerNotAvailableError(TopiclakeError):
    """The gateway that owns a produce request's partitions was lost after the request reached it:
    the records may or may not be written (Kafka's clients see a network error here)."""

    code = "OWNER_NOT_AVAILABLE"
    retriable = True
    hint = (
        "Retry through any gateway; an idempotent producer (Producer-Id + Producer-Sequence or "
        "Idempotency-Key) is never written twice."
    )


class NotPartitionOwnerError(TopiclakeError):
    """A Kafka produce to a partition another gateway of the cluster owns (Kafka's
    NOT_LEADER_OR_FOLLOWER): each partition is appended to by its owner."""

    code = "NOT_PARTITION_OWNER"
    retriable = True
    hint = "Refresh the metadata and send the records to the partition's leader."


class PartitionRecoveringError(TopiclakeError):
    """A partition whose acked records are not all readable here yet: a gateway that died left
    them in its write-ahead log, and its lease has not ended (at most `writer.wal_lease_ms`).
    Answered instead of a high watermark below an acked offset."""

    code = "PARTITION_RECOVERING"
    retriable = True
    hint = "Retry in a second: the partition is served again once its records are recovered."


class MemberIdRequiredError(TopiclakeError):
    """Kafka's KIP-394: a new member's first JoinGroup is answered with the member id it is to
    join with, so that a client that gives up (closes, times out) can leave under that id instead
    of leaving a member the group waits for."""

    code = "MEMBER_ID_REQUIRED"
    retriable = True
    hint = "Join again with the member id given."


class GroupMaxSizeReachedError(TopiclakeError):
    """A new member would take the group past its most members (`server.group_max_size`, or
    `server.consumer_group_max_size` for Kafka's consumer protocol)."""

    code = "GROUP_MAX_SIZE_REACHED"
    hint = "Use another group id for more consumers, or ask an operator to raise the group's limit."

    def __init__(self, group: str, limit: int) -> None:
        super().__init__(f"Group {group!r} has its most members ({limit}).", group=group, limit=limit)


class FencedInstanceIdError(TopiclakeError):
    """Kafka's KIP-345: a static member (`group.instance.id`) was taken over by a newer process with
    the same instance id; the older one is fenced."""

    code = "FENCED_INSTANCE_ID"
    hint = "Another consumer runs with this group.instance.id; give each consumer an instance id of its own."


class FencedMemberError(TopiclakeError):
    """A commit or heartbeat from an old generation or from a member that does not own the partition."""

    code = "FENCED_MEMBER"
    hint = "A rebalance happened; rejoin the group and continue from the committed offsets."


class FencedMemberEpochError(TopiclakeError):
    """Kafka's consumer protocol (KIP-848): a heartbeat at a member epoch the coordinator does not
    know (the member missed an assignment, or was replaced)."""

    code = "FENCED_MEMBER_EPOCH"
    hint = "Give up the partitions held and rejoin the group with member epoch 0."


class StaleMemberEpochError(TopiclakeError):
    """Kafka's consumer protocol: an offset commit or fetch at a member epoch that is not the
    member's current one."""

    code = "STALE_MEMBER_EPOCH"
    retriable = True
    hint = "Heartbeat for the member's current epoch, then commit again."


class UnreleasedInstanceIdError(TopiclakeError):
    """Kafka's consumer protocol: a static member joins with an instance id whose member has not
    left (with epoch -2) or expired."""

    code = "UNRELEASED_INSTANCE_ID"
    retriable = True
    hint = "Stop the other consumer with this group.instance.id, or wait for its session to end."


class UnsupportedAssignorError(TopiclakeError):
    code = "UNSUPPORTED_ASSIGNOR"
    hint = "Set group.remote.assignor to uniform, range or lag."


class InvalidRegularExpressionError(TopiclakeError):
    code = "INVALID_REGULAR_EXPRESSION"
    hint = "Subscribe with a regular expression in RE2's syntax (as Kafka's brokers take it)."


class InvalidGroupRequestError(TopiclakeError):
    """A group request whose fields contradict each other (Kafka's INVALID_REQUEST)."""

    code = "INVALID_GROUP_REQUEST"


class UnknownAssignorError(TopiclakeError):
    code = "UNKNOWN_ASSIGNOR"
    hint = "Use range, roundrobin or sticky (with group_protocol consumer: uniform, range or lag)."


class InconsistentGroupProtocolError(TopiclakeError):
    """A member's protocols do not fit the group's: an HTTP member (the coordinator assigns) and a
    Kafka group whose leader assigns (Kafka Connect, Kafka Streams, a custom assignor) cannot be
    mixed, and Kafka members need a protocol type and one protocol in common."""

    code = "INCONSISTENT_GROUP_PROTOCOL"
    hint = "Join with the protocol type and an assignor the group's members use, or use another group id."


class RebalanceInProgressError(TopiclakeError):
    """The group is between generations (its leader has not handed out the assignment yet)."""

    code = "REBALANCE_IN_PROGRESS"
    retriable = True
    hint = "Join the group again, then retry."


class GroupNotEmptyError(TopiclakeError):
    code = "GROUP_NOT_EMPTY"
    hint = "Stop the group's consumers (or wait for their sessions to expire), then retry."


class GroupSubscribedToTopicError(TopiclakeError):
    """Offsets of a topic the group's members subscribe to cannot be deleted (Kafka's rule)."""

    code = "GROUP_SUBSCRIBED_TO_TOPIC"


class InvalidGroupError(TopiclakeError):
    code = "INVALID_GROUP"


# --- Spark source ------------------------------------------------------------------------------
class DataLossError(TopiclakeError):
    """Offsets a query needs were removed by retention (failOnDataLoss=true)."""

    code = "DATA_LOSS"


# --- replication ---------------------------------------------------------------------------------
class ReplicaStateError(TopiclakeError):
    """A root is in the wrong replication state for the operation (see delta_log.maintenance.replication)."""

    code = "REPLICA_STATE"
