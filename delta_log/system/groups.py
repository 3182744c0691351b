"""Consumer group state: the `_system/consumer_groups` Delta table.

One row per state change (generation bump, empty) and, every few seconds, a heartbeat row per
live group: group, generation, state, assignor, members (JSON: id, instance id, topics, session
timeout, assignment, last heartbeat in wall-clock ms). The latest row per group wins (highest
generation, then latest update). A restarted server, and the Spark rebalance job, read it back.

Concurrency contract: every row for group g is committed with the Delta app transaction
`group-<g>` (delta_log.table.app_transactions), and delta-rs refuses a commit when a concurrent commit carries the same app id. The
server refreshes before it writes (`save`: the server wins a race); the rebalance job writes on
the snapshot it planned from (`save_if_unchanged`: it loses to any concurrent change of the group
and plans again). `compact()` rewrites the table to one row per group; it conflicts with (and
loses to) any concurrent append.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import CommitProperties, PostCommitHookProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from delta_log.core.group_rules import MemberState
from delta_log.errors import StorageUnavailableError
from delta_log.table.app_transactions import group_transactions
from delta_log.table.storage import StorageRoot, translate_storage_errors

GROUPS_TABLE = "consumer_groups"
SERVER, HEARTBEAT, REBALANCE_JOB = "server", "heartbeat", "rebalance-job"  # the `writer` column
_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


GROUPS_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("generation", pa.int32()),
        pa.field("state", pa.string()),
        pa.field("assignor", pa.string()),
        pa.field("members", pa.string()),  # JSON list of MemberRecord
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
        pa.field("writer", pa.string()),  # "server" or "rebalance-job"
    ]
)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberRecord:
    member_id: str
    instance_id: str | None
    topics: tuple[str, ...]
    session_timeout_ms: int
    assignment: dict[str, list[int]] = field(default_factory=dict)
    last_heartbeat_ms: int = 0
    principal: str = ""
    client_id: str = ""
    client_host: str = ""

    @classmethod
    def of(cls, m: MemberState, *, last_heartbeat_ms: int) -> MemberRecord:
        return cls(
            member_id=m.member_id,
            instance_id=m.instance_id,
            topics=tuple(sorted(m.topics)),
            session_timeout_ms=m.session_timeout_ms,
            assignment=m.assignment,
            last_heartbeat_ms=last_heartbeat_ms,
            principal=m.principal,
            client_id=m.client_id,
            client_host=m.client_host,
        )

    def to_state(self, *, last_heartbeat: float) -> MemberState:
        """The live member this row describes, alive as of `last_heartbeat` (monotonic seconds)."""
        return MemberState(
            member_id=self.member_id,
            instance_id=self.instance_id,
            topics=frozenset(self.topics),
            session_timeout_ms=self.session_timeout_ms,
            last_heartbeat=last_heartbeat,
            assignment=self.assignment,
            principal=self.principal,
            client_id=self.client_id,
            client_host=self.client_host,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRecord:
    group: str
    generation: int
    state: str
    assignor: str
    members: tuple[MemberRecord, ...]
    updated_at_us: int
    writer: str = "server"

    def members_json(self) -> str:
        return json.dumps(
            [
                {
                    "member_id": m.member_id,
                    "instance_id": m.instance_id,
                    "topics": list(m.topics),
                    "session_timeout_ms": m.session_timeout_ms,
                    "assignment": m.assignment,
                    "last_heartbeat_ms": m.last_heartbeat_ms,
                    "principal": m.principal,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                }
                for m in self.members
            ]
        )


def parse_members(text: str) -> tuple[MemberRecord, ...]:
    return tuple(
        MemberRecord(
            member_id=m["member_id"],
            instance_id=m.get("instance_id"),
            topics=tuple(m["topics"]),
            session_timeout_ms=int(m["session_timeout_ms"]),
            assignment={t: list(ps) for t, ps in m.get("assignment", {}).items()},
            last_heartbeat_ms=int(m.get("last_heartbeat_ms", 0)),
            principal=str(m.get("principal", "")),
            client_id=str(m.get("client_id", "")),
            client_host=str(m.get("client_host", "")),
        )
        for m in json.loads(text or "[]")
    )


def _row_table(records: list[GroupRecord]) -> pa.Table:
    return pa.table(
        {
            "group": [r.group for r in records],
            "generation": pa.array([r.generation for r in records], pa.int32()),
            "state": [r.state for r in records],
            "assignor": [r.assignor for r in records],
            "members": [r.members_json() for r in records],
            "updated_at": pa.array(
                [r.updated_at_us or int(time.time() * 1e6) for r in records], pa.timestamp("us", tz="UTC")
            ),
            "writer": [r.writer for r in records],
        },
        schema=GROUPS_SCHEMA,
    )


def latest_per_group(rows: list[dict[str, object]]) -> dict[str, GroupRecord]:
    """The state each group is in: its row with the highest (generation, updated_at)."""
    latest: dict[str, GroupRecord] = {}
    for r in rows:
        updated = r["updated_at"]
        rec = GroupRecord(
            group=str(r["group"]),
            generation=int(r["generation"]),  # type: ignore[call-overload]
            state=str(r["state"]),
            assignor=str(r["assignor"]),
            members=parse_members(str(r["members"] or "[]")),
            updated_at_us=int(updated.timestamp() * 1e6) if updated else 0,  # type: ignore[attr-defined]
            writer=str(r["writer"] or SERVER),
        )
        prev = latest.get(rec.group)
        if prev is None or (rec.generation, rec.updated_at_us) >= (prev.generation, prev.updated_at_us):
            latest[rec.group] = rec
    return latest


class GroupStore:
    """Durable group state, latest row per group."""

    def __init__(self, storage: StorageRoot) -> None:
        self.storage = storage
        self.uri = storage.system_uri(GROUPS_TABLE)
        self._lock = threading.Lock()
        self._dt = storage.open_or_create_system_table(GROUPS_TABLE, GROUPS_SCHEMA)
        self._rows_since_compaction = 0

    @property
    def version(self) -> int:
        return int(self._dt.version())

    def _append(self, records: list[GroupRecord]) -> None:
        txns = group_transactions({r.group: r.generation for r in records})
        write_deltalake(
            self._dt,
            _row_table(records),
            mode="append",
            commit_properties=CommitProperties(app_transactions=txns, max_commit_retries=20),
            post_commithook_properties=_HOOKS,
        )
        self._rows_since_compaction += len(records)

    def save(self, records: list[GroupRecord], *, attempts: int = 5) -> None:
        """Durably append group states (one Delta commit) on the latest version: the server's path.

        Raises: StorageUnavailableError.
        """
        if not records:
            return
        with self._lock:
            for attempt in range(attempts):
                try:
                    self._dt.update_incremental()
                    self._append(records)
                    return
                except CommitFailedError as exc:  # the rebalance job changed one of these groups
                    if attempt == attempts - 1:
                        raise StorageUnavailableError(f"Could not save group state: {exc}") from exc
                except (DeltaError, OSError) as exc:
                    raise StorageUnavailableError(f"Could not save group state: {exc}") from exc

    def save_if_unchanged(self, records: list[GroupRecord]) -> bool:
        """Append on the version the last `load()` read; False if any of these groups changed since.

        Raises: StorageUnavailableError.
        """
        if not records:
            return True
        with self._lock:
            try:
                self._append(records)
            except CommitFailedError:
                return False
            except (DeltaError, OSError) as exc:
                raise StorageUnavailableError(f"Could not save group state: {exc}") from exc
        return True

    def load(self, *, refresh: bool = True) -> dict[str, GroupRecord]:
        """Latest state per group (highest generation, then latest update)."""
        with self._lock, translate_storage_errors():
            if refresh:
                self._dt.update_incremental()
            rows = self.storage.read_system_table(self._dt, GROUPS_SCHEMA).to_pylist()
        return latest_per_group(rows)

    def load_if_changed(self, since_version: int) -> tuple[int, dict[str, GroupRecord] | None]:
        """(version, latest per group) if the table moved past `since_version`, else (version, None)."""
        with self._lock, translate_storage_errors():
            self._dt.update_incremental()
            version = int(self._dt.version())
            if version == since_version:
                return version, None
            rows = self.storage.read_system_table(self._dt, GROUPS_SCHEMA).to_pylist()
        return version, latest_per_group(rows)

    def compact(self, *, min_rows: int = 256) -> bool:
        """Rewrite the table to its latest row per group once `min_rows` were appended since the last
        rewrite; old files go after the table's deleted-file retention. False when skipped or when a
        concurrent append won (the next call tries again)."""
        with self._lock:
            if self._rows_since_compaction < min_rows:
                return False
            try:
                self._dt.update_incremental()
                latest = latest_per_group(self.storage.read_system_table(self._dt, GROUPS_SCHEMA).to_pylist())
                self.storage.rewrite_system_table(self._dt, _row_table(list(latest.values())))
            except (DeltaError, OSError):  # CommitFailedError (a concurrent append won) is a DeltaError
                return False
            self._rows_since_compaction = 0
            return True
