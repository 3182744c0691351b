"""The schema registry's storage: the `_system/schemas` Delta table.

An append-only event log folded into the registry's state: `version` rows (a subject's new version
with its schema id, type and text), `delete` rows (a version, or -1 for the whole subject; soft or
permanent) and `config` rows (a compatibility level for a subject, or "" for the global level;
null to remove a subject's). Every row of one change carries that change's sequence number `seq`.

Concurrency contract: a change commits with the Delta app transaction `schema-registry` (version =
its seq), and delta-rs refuses a commit when a concurrent commit carries the same app id; so
changes are serialized across gateways with no lock service: the loser reads the winner's change
and plans again (the same schema then gets the same id, a new one the next free id). Ids are never
reused, even after a permanent delete.

Readers keep a folded snapshot and refresh it when it is older than the age they accept; a server
refreshes it in the background, so produce reads it without I/O.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import CommitProperties, PostCommitHookProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from delta_log.core.dead_letters import Split, split_invalid, validation_error
from delta_log.core.topic_config import TopicConfig
from delta_log.core.value_schemas import (
    DEFAULT_COMPATIBILITY,
    SubjectSchemas,
    ValueSchema,
    compatibility_messages,
    parse_schema,
    subject_for,
)
from delta_log.errors import (
    CommitConflictError,
    IncompatibleSchemaError,
    InvalidValueSchemaError,
    SchemaNotFoundError,
    StorageUnavailableError,
    SubjectConfigNotFoundError,
    SubjectNotFoundError,
    SubjectNotSoftDeletedError,
    VersionNotFoundError,
    VersionNotSoftDeletedError,
)
from delta_log.table.storage import StorageRoot, translate_storage_errors

SCHEMAS_TABLE = "schemas"
REGISTRY_APP_ID = "schema-registry"
VERSION, DELETE, CONFIG = "version", "delete", "config"
ALL_VERSIONS = -1
MAX_VERSIONS_PER_SUBJECT = 1000
log = logging.getLogger(__name__)
_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)

SCHEMAS_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64()),
        pa.field("kind", pa.string()),
        pa.field("subject", pa.string()),
        pa.field("version", pa.int32()),
        pa.field("id", pa.int32()),
        pa.field("schema_type", pa.string()),
        pa.field("schema", pa.string()),
        pa.field("level", pa.string()),
        pa.field("permanent", pa.bool_()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One row: what a change did."""

    kind: str
    subject: str = ""
    version: int = 0
    schema_id: int = 0
    schema_type: str = ""
    schema: str = ""
    level: str | None = None
    permanent: bool = False


@dataclass(slots=True)
class SubjectVersion:
    version: int
    schema_id: int
    deleted: bool = False


@dataclass(slots=True)
class RegistryState:
    """The registry as of change `seq`: subjects' versions (oldest first), schemas by id,
    compatibility levels."""

    seq: int = 0
    subjects: dict[str, list[SubjectVersion]] = field(default_factory=dict)
    schemas: dict[int, ValueSchema] = field(default_factory=dict)
    ids: dict[tuple[str, str], int] = field(default_factory=dict)  # (type, canonical) -> id
    levels: dict[str, str] = field(default_factory=dict)  # "" is the global level
    next_id: int = 1

    @property
    def global_level(self) -> str:
        return self.levels.get("", DEFAULT_COMPATIBILITY)

    def level_of(self, subject: str) -> str:
        return self.levels.get(subject, self.global_level)

    def versions(self, subject: str, *, deleted: bool = False) -> list[SubjectVersion]:
        """A subject's versions, oldest first (soft-deleted ones too with `deleted`).

        Raises: SubjectNotFoundError when there are none.
        """
        versions = [v for v in self.subjects.get(subject, []) if deleted or not v.deleted]
        if not versions:
            raise SubjectNotFoundError(f"Subject {subject!r} not found.", subject=subject)
        return versions

    def live(self, subject: str) -> list[SubjectVersion]:
        return [v for v in self.subjects.get(subject, []) if not v.deleted]

    def apply(self, seq: int, event: Event) -> None:
        self.seq = max(self.seq, seq)
        if event.kind == VERSION:
            if event.schema_id not in self.schemas:
                try:
                    schema = parse_schema(event.schema_type, event.schema)
                except InvalidValueSchemaError as exc:  # stored by a version whose rules were looser
                    log.warning(
                        "schema id %s of %s is unreadable now (%s); skipped", event.schema_id, event.subject, exc
                    )
                    self.next_id = max(self.next_id, event.schema_id + 1)
                    return
                self.schemas[event.schema_id] = schema
                self.ids[(schema.schema_type, schema.canonical)] = event.schema_id
            self.subjects.setdefault(event.subject, []).append(SubjectVersion(event.version, event.schema_id))
            self.next_id = max(self.next_id, event.schema_id + 1)
        elif event.kind == DELETE:
            versions = self.subjects.get(event.subject, [])
            hit = [v for v in versions if event.version in (ALL_VERSIONS, v.version)]
            for v in hit:
                v.deleted = True
            if event.permanent:
                self.subjects[event.subject] = [v for v in versions if v not in hit]
                if not self.subjects[event.subject]:
                    del self.subjects[event.subject]
        elif event.kind == CONFIG:
            if event.level is None:
                self.levels.pop(event.subject, None)
            else:
                self.levels[event.subject] = event.level

    def subject_schemas(self, subject: str) -> SubjectSchemas | None:
        """What produce checks a topic's values against (None: the subject has no live version)."""
        live = self.live(subject)
        if not live:
            return None
        every = self.subjects[subject]
        return SubjectSchemas(subject, live[-1].schema_id, {v.schema_id: self.schemas[v.schema_id] for v in every})


def _rows(seq: int, events: list[Event]) -> pa.Table:
    now = int(time.time() * 1_000_000)
    return pa.table(
        {
            "seq": pa.array([seq] * len(events), pa.int64()),
            "kind": [e.kind for e in events],
            "subject": [e.subject for e in events],
            "version": pa.array([e.version for e in events], pa.int32()),
            "id": pa.array([e.schema_id for e in events], pa.int32()),
            "schema_type": [e.schema_type for e in events],
            "schema": [e.schema for e in events],
            "level": [e.level for e in events],
            "permanent": [e.permanent for e in events],
            "at": pa.array([now] * len(events), pa.timestamp("us", tz="UTC")),
        },
        schema=SCHEMAS_SCHEMA,
    )


def _same(state: RegistryState, v: SubjectVersion, schema: ValueSchema) -> bool:
    found = state.schemas[v.schema_id]
    return found.schema_type == schema.schema_type and found.canonical == schema.canonical


def find_version(state: RegistryState, subject: str, schema: ValueSchema, *, deleted: bool = False) -> SubjectVersion:
    """The subject's version holding `schema`. Raises: SubjectNotFoundError, SchemaNotFoundError."""
    for v in state.versions(subject, deleted=deleted):
        if _same(state, v, schema):
            return v
    raise SchemaNotFoundError(f"The schema is not registered under subject {subject!r}.", subject=subject)


def version_of(state: RegistryState, subject: str, version: int | None, *, deleted: bool = False) -> SubjectVersion:
    """A subject's version by number (None: the latest).

    Raises: SubjectNotFoundError, VersionNotFoundError.
    """
    versions = state.versions(subject, deleted=deleted)
    if version is None:
        return versions[-1]
    for v in versions:
        if v.version == version:
            return v
    raise VersionNotFoundError(f"Version {version} of subject {subject!r} not found.", subject=subject)


class SchemaStore:
    """The registry's durable state and a folded snapshot of it."""

    def __init__(self, storage: StorageRoot, *, max_age_s: float = 1.0, attempts: int = 20) -> None:
        self.storage = storage
        self.max_age_s = max_age_s
        self.attempts = attempts
        self._lock = threading.Lock()
        self._dt = storage.open_or_create_system_table(SCHEMAS_TABLE, SCHEMAS_SCHEMA)
        self._state = RegistryState()
        self._version = -1
        self._read_at = 0.0
        self.state(max_age_s=0)

    @classmethod
    def open_if_exists(cls, storage: StorageRoot) -> SchemaStore | None:
        """The root's registry, or None when no schema was ever registered there."""
        return cls(storage) if storage.is_table(storage.system_uri(SCHEMAS_TABLE)) else None

    def _refresh(self) -> RegistryState:
        """Fold the table again if it moved (caller holds the lock)."""
        with translate_storage_errors():
            self._dt.update_incremental()
            version = int(self._dt.version())
            if version != self._version:
                rows = self.storage.read_system_table(self._dt, SCHEMAS_SCHEMA).to_pylist()
                state = RegistryState()
                for r in sorted(rows, key=lambda r: r["seq"]):
                    state.apply(int(r["seq"]), _event_of(r))
                self._state, self._version = state, version
        self._read_at = time.monotonic()
        return self._state

    def state(self, *, max_age_s: float | None = None) -> RegistryState:
        """The registry as of at most `max_age_s` ago (default: the store's); 0 reads the table now.
        Callers treat it as read-only."""
        age = self.max_age_s if max_age_s is None else max_age_s
        with self._lock:
            if time.monotonic() - self._read_at >= age or self._version < 0:
                return self._refresh()
            return self._state

    def cached(self) -> RegistryState:
        """The last state read, without I/O (a server refreshes it every `max_age_s`)."""
        return self._state

    def change(self, plan: Callable[[RegistryState], tuple[list[Event], object]]) -> object:
        """Apply one change: `plan` reads the latest state and returns the events to append and
        the answer to give; on a concurrent change it runs again on the newer state. `plan` raises
        to refuse (not found, incompatible) and returns no events when there is nothing to write.

        Raises: what `plan` raises; CommitConflictError after `attempts` lost races;
        StorageUnavailableError.
        """
        with self._lock:
            for _ in range(self.attempts):
                state = self._refresh()
                events, answer = plan(state)
                if not events:
                    return answer
                seq = state.seq + 1
                try:
                    write_deltalake(
                        self._dt,
                        _rows(seq, events),
                        mode="append",
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(REGISTRY_APP_ID, seq)], max_commit_retries=0
                        ),
                        post_commithook_properties=_HOOKS,
                    )
                except CommitFailedError:
                    continue  # another gateway changed the registry: plan again on its state
                except (DeltaError, OSError) as exc:
                    raise StorageUnavailableError(f"Could not write the schema registry: {exc}") from exc
                with contextlib.suppress(StorageUnavailableError):
                    self._refresh()  # this gateway's produce sees the change at once
                return answer
        raise CommitConflictError("The schema registry kept changing under this request.")

    def register(self, subject: str, schema: ValueSchema) -> SubjectVersion:
        """The subject's version holding `schema`: the existing one, or a new one checked against the
        subject's compatibility level (a schema already registered anywhere keeps its id).

        Raises: IncompatibleSchemaError naming what breaks; CommitConflictError; StorageUnavailableError.
        """

        def plan(state: RegistryState) -> tuple[list[Event], object]:
            live = state.live(subject)
            for v in live:
                if _same(state, v, schema):
                    return [], v
            level = state.level_of(subject)
            messages = compatibility_messages(level, schema, [state.schemas[v.schema_id] for v in live])
            if messages:
                raise IncompatibleSchemaError(
                    f"The schema is incompatible with subject {subject!r} at level {level}: "
                    f"{'; '.join(messages[:10])}.",
                    subject=subject,
                    messages=messages[:50],
                )
            if len(state.subjects.get(subject, [])) >= MAX_VERSIONS_PER_SUBJECT:
                raise InvalidValueSchemaError(
                    f"Subject {subject!r} has {MAX_VERSIONS_PER_SUBJECT} versions, the limit; delete old ones "
                    "(soft, then permanently) first."
                )
            schema_id = state.ids.get((schema.schema_type, schema.canonical), state.next_id)
            version = max((v.version for v in state.subjects.get(subject, [])), default=0) + 1
            event = Event(
                kind=VERSION,
                subject=subject,
                version=version,
                schema_id=schema_id,
                schema_type=schema.schema_type,
                schema=schema.text,
            )
            return [event], SubjectVersion(version, schema_id)

        return self.change(plan)  # type: ignore[return-value]

    def delete_subject(self, subject: str, *, permanent: bool) -> list[int]:
        """Soft-delete every version (ids stay readable), or, once soft-deleted, remove them.

        Raises: SubjectNotFoundError, SubjectNotSoftDeletedError.
        """

        def plan(state: RegistryState) -> tuple[list[Event], object]:
            versions = state.subjects.get(subject, [])
            if not versions or (not permanent and all(v.deleted for v in versions)):
                raise SubjectNotFoundError(f"Subject {subject!r} not found.", subject=subject)
            if permanent and any(not v.deleted for v in versions):
                raise SubjectNotSoftDeletedError(f"Subject {subject!r} was not deleted first.", subject=subject)
            numbers = [v.version for v in versions if permanent or not v.deleted]
            return [Event(kind=DELETE, subject=subject, version=ALL_VERSIONS, permanent=permanent)], numbers

        return self.change(plan)  # type: ignore[return-value]

    def delete_version(self, subject: str, version: int | None, *, permanent: bool) -> int:
        """Soft-delete one version (None: the latest), or, once soft-deleted, remove it.

        Raises: SubjectNotFoundError, VersionNotFoundError, VersionNotSoftDeletedError.
        """

        def plan(state: RegistryState) -> tuple[list[Event], object]:
            v = version_of(state, subject, version, deleted=permanent)
            if permanent and not v.deleted:
                raise VersionNotSoftDeletedError(f"Version {v.version} of {subject!r} was not deleted first.")
            return [Event(kind=DELETE, subject=subject, version=v.version, permanent=permanent)], v.version

        return self.change(plan)  # type: ignore[return-value]

    def set_level(self, subject: str, level: str | None) -> str | None:
        """Set a subject's compatibility level ("" for the global one); None removes a subject's
        own level and returns what it was. Raises: SubjectConfigNotFoundError (nothing to remove)."""

        def plan(state: RegistryState) -> tuple[list[Event], object]:
            if level is None and subject not in state.levels:
                raise SubjectConfigNotFoundError(f"Subject {subject!r} has no compatibility level of its own.")
            return [Event(kind=CONFIG, subject=subject, level=level)], level or state.levels.get(subject)

        return self.change(plan)  # type: ignore[return-value]


def _values(table: pa.Table) -> list[bytes | None] | None:
    """The request's values as bytes, or None when they are missing or of a type normalize_batch
    refuses (it says so)."""
    if "value" not in table.column_names:
        return None
    try:
        return table.column("value").cast(pa.binary()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def check_values(store: SchemaStore, topic: str, table: pa.Table, config: TopicConfig) -> Split | None:
    """Check a request's values against the topic's value schema (if it has one; the registry as
    last read, and read again when a value fails: I/O, so not on the event loop). None: every
    value is valid (or there is no schema); a Split: some are not and the topic sends them to its
    dead-letter topic (errors.tolerance=all).

    Raises: SchemaValidationError naming the bad records (errors.tolerance=none: nothing is written).
    """
    subject = subject_for(topic)
    schemas = store.cached().subject_schemas(subject)
    if schemas is None:
        return None
    values = _values(table)
    if values is None:
        return None
    reasons = schemas.invalid(values)
    if reasons:  # maybe a version registered through another gateway since the last read: read now
        fresh = store.state(max_age_s=0).subject_schemas(subject)
        reasons = fresh.invalid(values) if fresh is not None else {}
    if not reasons:
        return None
    if config.dead_letter_topic(topic) is None:
        raise validation_error(topic, subject, table.num_rows, reasons)
    return split_invalid(table, reasons, topic=topic, subject=subject)


def _event_of(row: dict[str, object]) -> Event:
    return Event(
        kind=str(row["kind"]),
        subject=str(row["subject"] or ""),
        version=int(row["version"] or 0),  # type: ignore[call-overload]
        schema_id=int(row["id"] or 0),  # type: ignore[call-overload]
        schema_type=str(row["schema_type"] or ""),
        schema=str(row["schema"] or ""),
        level=None if row["level"] is None else str(row["level"]),
        permanent=bool(row["permanent"]),
    )
