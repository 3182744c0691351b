"""Consumer group state: the `_system/consumer_groups` Delta table.

One row per state change (generation bump, empty): group, generation, state, assignor, members
(JSON: id, instance id, topics, session timeout, assignment). The latest row per group wins.
A restarted server, and the Spark rebalance job, read it back.

Concurrency contract: blind appends (never conflict); `load()` reads new versions by anyone.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import CommitProperties, PostCommitHookProperties, write_deltalake
from deltalake.exceptions import DeltaError

from delta_log.errors import StorageUnavailableError
from delta_log.storage import StorageRoot, translate_storage_errors

GROUPS_TABLE = "consumer_groups"

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
        )
        for m in json.loads(text or "[]")
    )


class GroupStore:
    """Durable group state, latest row per group."""

    def __init__(self, storage: StorageRoot) -> None:
        self.storage = storage
        self.uri = storage.system_uri(GROUPS_TABLE)
        self._lock = threading.Lock()
        self._dt = storage.open_or_create_system_table(GROUPS_TABLE, GROUPS_SCHEMA)

    def save(self, records: list[GroupRecord]) -> None:
        """Durably append group states (one Delta commit). Raises: StorageUnavailableError."""
        if not records:
            return
        table = pa.table(
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
        with self._lock:
            try:
                write_deltalake(
                    self._dt,
                    table,
                    mode="append",
                    commit_properties=CommitProperties(max_commit_retries=20),
                    post_commithook_properties=PostCommitHookProperties(
                        create_checkpoint=True, cleanup_expired_logs=False
                    ),
                )
            except (DeltaError, OSError) as exc:
                raise StorageUnavailableError(f"Could not save group state: {exc}") from exc

    def load(self) -> dict[str, GroupRecord]:
        """Latest state per group (highest generation, then latest update)."""
        with self._lock, translate_storage_errors():
            self._dt.update_incremental()
            rows = self._dt.to_pyarrow_table().to_pylist()
        latest: dict[str, GroupRecord] = {}
        for r in rows:
            rec = GroupRecord(
                group=r["group"],
                generation=r["generation"],
                state=r["state"],
                assignor=r["assignor"],
                members=parse_members(r["members"]),
                updated_at_us=int(r["updated_at"].timestamp() * 1e6) if r["updated_at"] else 0,
                writer=r["writer"] or "server",
            )
            prev = latest.get(rec.group)
            if prev is None or (rec.generation, rec.updated_at_us) >= (prev.generation, prev.updated_at_us):
                latest[rec.group] = rec
        return latest
