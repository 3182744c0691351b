"""Topic administration, whichever door asked: create (with a value schema), list, describe,
alter configs, add partitions, delete. Each checks the caller's ACLs (Kafka's: CREATE, DESCRIBE,
ALTER_CONFIGS, ALTER, DELETE are `admin` and `describe` here). Blocking: call them in a thread."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from delta_log.core.acl import Principal, authorize
from delta_log.core.paging import page_of
from delta_log.core.value_schemas import parse_schema, subject_for
from delta_log.errors import InvalidConfigError, TopiclakeError
from delta_log.log.catalog import TopicDescription as TopicDescription
from delta_log.log.reader import PartitionOffsets
from delta_log.log.reader import TopicReader as TopicReader
from delta_log.registry import TopicRegistry
from delta_log.system.job_runs import JobRun as JobRun
from delta_log.system.job_runs import JobRunLog as JobRunLog
from delta_log.system.schemas import RegistryState as RegistryState
from delta_log.system.schemas import SubjectVersion as SubjectVersion
from delta_log.system.schemas import find_version as find_version
from delta_log.system.schemas import version_of as version_of
from delta_log.table.time_travel import appended_history


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueSchema:
    schema_type: str | None  # None: AVRO, as Confluent's registry
    schema_text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatedTopic:
    description: TopicDescription
    #: (subject, version, id) of the value schema registered with it
    schema: tuple[str, int, int] | None = None


def create_topic(
    registry: TopicRegistry,
    principal: Principal,
    name: str,
    *,
    partitions: int,
    config: Mapping[str, object] | None = None,
    value_schema: ValueSchema | None = None,
    validate_only: bool = False,
) -> CreatedTopic:
    """Create a topic (a Delta table partitioned by `partition`), with its value schema if given:
    the topic's checks first (a refused topic registers nothing), then the schema (a refused one
    leaves no topic, so no record is ever unchecked), then the table.

    Raises: AuthorizationError, InvalidTopicError, InvalidPartitionsError, InvalidConfigError,
    TopicExistsError, InvalidValueSchemaError, IncompatibleSchemaError, StorageUnavailableError.
    """
    authorize(principal, "admin", name)  # admin implies produce, which registering needs
    config_checked = registry.catalog.check_new_topic(name, partitions=partitions, config=config)
    if validate_only:
        return CreatedTopic(description=TopicDescription(name=name, uri="", config=config_checked, table_version=-1))
    registered = None
    if value_schema is not None:
        schema = parse_schema(value_schema.schema_type, value_schema.schema_text)
        subject = subject_for(name)
        v = registry.schemas.register(subject, schema)
        registered = (subject, v.version, v.schema_id)
    d = registry.catalog.create_topic(name, partitions=partitions, config=config)
    return CreatedTopic(description=d, schema=registered)


def list_topics(
    registry: TopicRegistry,
    principal: Principal,
    *,
    search: str = "",
    after: str = "",
    limit: int | None = None,
) -> tuple[list[str], str | None]:
    """The topics this key may describe, by name: those containing `search` (case-insensitive),
    after the name `after`, at most `limit` of them; and the name to ask `after` next (None: no more)."""
    visible = (n for n in registry.catalog.topic_dirs() if principal.allows("describe", n))
    return page_of(visible, str, search=search, after=after, limit=limit, keep=registry.catalog.is_topic)


#: Commits a throughput series may ask for: each is one commit entry read from the table's log.
MAX_THROUGHPUT_COMMITS = 1000


def throughput(registry: TopicRegistry, principal: Principal, name: str, commits: int) -> list[tuple[int, int, int]]:
    """(commit time ms, records, bytes) of the topic's last `commits` appends, oldest first, from
    its Delta history (every gateway's and the Spark sink's appends). Blocking.

    Raises: AuthorizationError, TopicNotFoundError, InvalidConfigError (`commits` out of range)."""
    authorize(principal, "describe", name)
    if not 1 <= commits <= MAX_THROUGHPUT_COMMITS:
        raise InvalidConfigError(f"commits must be 1-{MAX_THROUGHPUT_COMMITS}; got {commits}.")
    return appended_history(registry.storage.open_topic(name), commits)


def describe_topic(registry: TopicRegistry, principal: Principal, name: str) -> tuple[TopicDescription, TopicReader]:
    """Raises: AuthorizationError, TopicNotFoundError."""
    authorize(principal, "describe", name)
    return registry.describe_topic(name)


def alter_config(
    registry: TopicRegistry,
    principal: Principal,
    name: str,
    updates: Mapping[str, object],
    *,
    validate_only: bool = False,
) -> TopicDescription:
    """Set config keys (None resets one to its default); `validate_only`: authorize and check
    them, change nothing. Raises: AuthorizationError, TopicNotFoundError, InvalidConfigError."""
    authorize(principal, "admin", name)
    return registry.alter_config(name, updates, validate_only=validate_only)


def add_partitions(
    registry: TopicRegistry, principal: Principal, name: str, total: int, *, validate_only: bool = False
) -> TopicDescription:
    """Raise the partition count to `total` (never lower); `validate_only`: authorize and check it,
    change nothing. Raises: AuthorizationError, TopicNotFoundError, InvalidPartitionsError."""
    authorize(principal, "admin", name)
    return registry.add_partitions(name, total, validate_only=validate_only)


def delete_topic(registry: TopicRegistry, principal: Principal, name: str) -> None:
    """Delete a topic and its data. A key that may describe the name learns that no such topic
    exists before it is told it may not delete it (Kafka's order). Raises: AuthorizationError,
    TopicNotFoundError, InvalidTopicError."""
    if principal.allows("describe", name):
        registry.catalog.open_topic(name)  # TopicNotFoundError, InvalidTopicError
    authorize(principal, "admin", name)
    registry.delete_topic(name)


def topics_by_id(registry: TopicRegistry, wanted: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The names of the topics with these ids (Kafka's topic ids: each topic table's Delta id),
    found among every topic of the root (an id names a topic whatever the key may see: the caller
    authorizes the names). Blocking."""
    found: dict[uuid.UUID, str] = {}
    if not wanted:
        return found
    for name in registry.catalog.list_topics():
        with contextlib.suppress(TopiclakeError):  # deleted meanwhile
            topic_id = registry.reader(name).topic_id
            if topic_id in wanted:
                found[topic_id] = name
    return found


def delete_records(registry: TopicRegistry, principal: Principal, name: str, partition: int, offset: int) -> int:
    """Kafka's DeleteRecords (Kafka's DELETE on the topic is `admin` here): the new log start offset.

    Raises: AuthorizationError, TopicNotFoundError, PartitionNotFoundError, InvalidOffsetError,
    StorageUnavailableError."""
    authorize(principal, "admin", name)
    return registry.delete_records(name, partition, offset)


def partition_sizes(
    registry: TopicRegistry, principal: Principal, names: Collection[str] | None
) -> dict[str, list[PartitionOffsets] | TopiclakeError]:
    """Kafka's DescribeLogDirs: every partition of each named topic (None: of every topic this key
    may describe) with its bytes in the table, or the error (AuthorizationError,
    TopicNotFoundError) that keeps a named topic from being described. Blocking.

    Raises: AuthorizationError without admin on some topic (Kafka: DESCRIBE on the cluster, as
    GET /cluster): the answer names the storage root."""
    authorize(principal, "admin", None)
    if names is None:
        names = [n for n in registry.catalog.list_topics() if principal.allows("describe", n)]
    out: dict[str, list[PartitionOffsets] | TopiclakeError] = {}
    for name in names:
        try:
            authorize(principal, "describe", name)
            out[name] = registry.reader(name).partition_offsets()
        except TopiclakeError as exc:
            out[name] = exc
    return out
