"""Topic catalog: create, list, describe, alter, add partitions, delete.

A topic is the Delta table `<root>/topics/<name>`, partitioned by `partition`, with the Kafka source
schema. Its partition count and Kafka-style config are Delta table properties (`topiclake.*`), so
they live with the table and every engine sees them.

Concurrency contract: create is put-if-absent at the Delta log (a second create of the same name
fails); alter/add-partitions are metadata commits, which conflict with concurrent appends; the
writer retries those, so producers never see the conflict. Delete removes the folder: stop the
topic's writers first (the gateway does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from conf import WriterSettings
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.core.topic_config import (
    DEFAULT_CONFIG,
    INTERNAL_TOPICS,
    PARTITIONS_PROPERTY,
    TopicConfig,
    validate_config,
    validate_partitions,
    validate_topic_name,
)
from delta_log.errors import (
    CommitConflictError,
    InvalidConfigError,
    PartitionCountConflictError,
    StorageUnavailableError,
    TopicExistsError,
    TopicNotFoundError,
)
from delta_log.table.storage import LATEST_DIR, TOPICS_DIR, StorageRoot, translate_storage_errors

log = logging.getLogger(__name__)

#: `_system/markers/<this>` changes with every create, delete, config change and added partitions
CATALOG_MARKER = "catalog"

#: Delta properties every engine must leave alone on topic tables (see ARCHITECTURE.md).
FORBIDDEN_DELTA_PROPERTIES = frozenset(
    {
        "delta.setTransactionRetentionDuration",  # would drop `hw-<p>` txns: offsets restart at 0
        "delta.enableDeletionVectors",
        "delta.enableRowTracking",
        "delta.enableInCommitTimestamps",
    }
)


def table_properties(settings: WriterSettings) -> dict[str, str]:
    """Delta properties that keep commit latency flat as a topic ages."""
    return {
        "delta.checkpointInterval": str(settings.checkpoint_interval),
        "delta.logRetentionDuration": settings.log_retention,
        "delta.deletedFileRetentionDuration": settings.deleted_file_retention,
        "delta.dataSkippingStatsColumns": "offset,timestamp,timestampType",
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicDescription:
    name: str
    uri: str
    config: TopicConfig
    table_version: int

    @property
    def partitions(self) -> int:
        return self.config.partitions


class Catalog:
    """Topic administration over a storage root."""

    def __init__(self, storage: StorageRoot, settings: WriterSettings) -> None:
        self.storage = storage
        self.settings = settings

    def create_topic(
        self, name: str, *, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> TopicDescription:
        """Create a topic table.

        Raises:
            InvalidTopicError, InvalidPartitionsError, InvalidConfigError: bad arguments.
            TopicExistsError: a topic of that name exists.
            StorageUnavailableError: the root cannot be written.
        """
        topic_config = self.check_new_topic(name, partitions=partitions, config=config)
        uri = self.storage.topic_uri(name)
        props = table_properties(self.settings) | topic_config.to_properties()
        try:
            with translate_storage_errors():
                dt = DeltaTable.create(
                    uri,
                    TOPIC_SCHEMA,
                    mode="error",
                    partition_by=["partition"],
                    name=name,
                    configuration=props,
                    storage_options=self.storage.options(),
                    raise_if_key_not_exists=False,
                )
        except Exception as exc:
            if "exists" in str(exc).lower() and self.storage.is_table(uri):
                raise TopicExistsError(name) from exc
            raise
        self._changed()
        return TopicDescription(name=name, uri=uri, config=topic_config, table_version=dt.version())

    def _changed(self) -> None:
        """Tell Spark sessions' catalogs (delta_log.spark.catalog) that topics or configs changed:
        the topic's own change is already done, so a marker that cannot be written is only logged."""
        try:
            self.storage.touch_marker(CATALOG_MARKER)
        except Exception as exc:
            log.warning("catalog change marker not written (sessions see the change at their next sync): %s", exc)

    def check_new_topic(
        self, name: str, *, partitions: int = 1, config: Mapping[str, object] | None = None
    ) -> TopicConfig:
        """What `create_topic` would create, or the error it would raise, creating nothing (a topic
        made together with something else checks first).

        Raises: as create_topic.
        """
        validate_topic_name(name)
        validate_partitions(partitions)
        values = dict(DEFAULT_CONFIG)
        values.update(validate_config(config or {}))
        _refuse_self_dead_letters(name, values)
        if name in INTERNAL_TOPICS or self.storage.is_table(self.storage.topic_uri(name)):
            raise TopicExistsError(name)
        return TopicConfig(partitions=partitions, values=values)

    def list_topics(self) -> list[str]:
        """Names of every topic under the root, sorted."""
        return [name for name in self.topic_dirs() if self.is_topic(name)]

    def topic_dirs(self) -> list[str]:
        """Names of every folder under the root's topics, sorted: one listing. A folder is a topic
        once `is_topic` says so (one more read each: a half-created or half-deleted one is not)."""
        return self.storage.list_dirs(TOPICS_DIR)

    def is_topic(self, name: str) -> bool:
        return self.storage.is_table(self.storage.topic_uri(name))

    def open_topic(self, name: str) -> DeltaTable:
        """Raises: TopicNotFoundError, InvalidTopicError."""
        validate_topic_name(name)
        try:
            return self.storage.open_table(self.storage.topic_uri(name))
        except TableNotFoundError as exc:
            raise TopicNotFoundError(name) from exc

    def describe_topic(self, name: str, table: DeltaTable | None = None) -> TopicDescription:
        """Config and table version of a topic. Raises: TopicNotFoundError."""
        dt = table or self.open_topic(name)
        with translate_storage_errors():
            props = dt.metadata().configuration
        return TopicDescription(
            name=name,
            uri=self.storage.topic_uri(name),
            config=TopicConfig.from_properties(props),
            table_version=dt.version(),
        )

    def alter_config(
        self, name: str, updates: Mapping[str, object], *, validate_only: bool = False
    ) -> TopicDescription:
        """Set config keys (Kafka names); a value of None resets the key to its default.
        `validate_only`: check them and change nothing (Kafka's validateOnly).

        Raises: TopicNotFoundError, InvalidConfigError.
        """
        resets = {k for k, v in updates.items() if v is None}
        unknown = resets - set(DEFAULT_CONFIG)
        if unknown:
            raise InvalidConfigError(f"Unknown topic config {sorted(unknown)[0]!r}.", key=sorted(unknown)[0])
        values = validate_config({k: v for k, v in updates.items() if v is not None})
        values.update({k: DEFAULT_CONFIG[k] for k in resets})
        _refuse_self_dead_letters(name, values)
        dt = self.open_topic(name)
        if validate_only:
            return self.describe_topic(name, dt)
        self._set_properties(dt, {f"topiclake.{k}": v for k, v in values.items()})
        self._changed()
        return self.describe_topic(name, dt)

    def set_delta_properties(self, name: str, properties: Mapping[str, str]) -> None:
        """Set raw Delta table properties (not the forbidden ones). Raises: InvalidConfigError."""
        bad = sorted(set(properties) & FORBIDDEN_DELTA_PROPERTIES)
        if bad:
            raise InvalidConfigError(
                f"{bad[0]} must not be set on topic tables; see ARCHITECTURE.md (table rules).", key=bad[0]
            )
        self._set_properties(self.open_topic(name), dict(properties))

    def add_partitions(self, name: str, total: int, *, validate_only: bool = False) -> TopicDescription:
        """Raise the partition count to `total` (never lower, as in Kafka); `validate_only`: check
        it and change nothing.

        Raises: TopicNotFoundError, InvalidPartitionsError.
        """
        validate_partitions(total)
        dt = self.open_topic(name)
        current = self.describe_topic(name, dt).partitions
        if total <= current:
            raise PartitionCountConflictError(
                f"Topic {name!r} has {current} partitions; the new count must be larger "
                "(partitions can only be added).",
                topic=name,
                partitions=total,
                current=current,
            )
        if validate_only:
            return self.describe_topic(name, dt)
        self._set_properties(dt, {PARTITIONS_PROPERTY: str(total)})
        self._changed()
        return self.describe_topic(name, dt)

    def delete_topic(self, name: str) -> None:
        """Remove the topic table and its files, and its upsert table if it has one. Raises:
        TopicNotFoundError."""
        validate_topic_name(name)
        uri = self.storage.topic_uri(name)
        if not self.storage.is_table(uri):
            raise TopicNotFoundError(name)
        self.storage.delete_dir(uri)
        if self.storage.is_table(self.storage.latest_uri(name)):
            self.storage.delete_dir(self.storage.latest_uri(name))
        self._changed()

    def upsert_tables(self) -> list[str]:
        """Topics that have an upsert table (`<root>/latest/<topic>`), sorted: one listing."""
        return [t for t in self.storage.list_dirs(LATEST_DIR) if self.storage.is_table(self.storage.latest_uri(t))]

    def _set_properties(self, dt: DeltaTable, props: dict[str, str]) -> None:
        for _ in range(self.settings.max_commit_attempts):
            try:
                dt.alter.set_table_properties(props, raise_if_not_exists=False)
                return
            except CommitFailedError:
                dt.update_incremental()  # a concurrent append won; metadata commits just retry
            except (DeltaError, OSError) as exc:
                raise StorageUnavailableError(f"Storage is unavailable: {exc}") from exc
        raise CommitConflictError("Could not change the topic's properties: too many concurrent commits.")


def _refuse_self_dead_letters(name: str, values: Mapping[str, str]) -> None:
    """Raises: InvalidConfigError when a topic would send its invalid records to itself."""
    if values.get("errors.deadletterqueue.topic.name") == name:
        raise InvalidConfigError(
            f"Topic {name!r} cannot be its own dead-letter topic; name another (default: {name}.dlq).",
            key="errors.deadletterqueue.topic.name",
        )
