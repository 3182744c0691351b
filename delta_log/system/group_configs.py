"""Group configs (delta_log.core.group_config): the `_system/group_configs` Delta table.

One row per change of a group's overrides: the group and its overrides after the change (JSON; an
empty object when none is left). The latest row per group wins. Every gateway reads it (the
coordinator of a group applies its configs from the next heartbeat), whichever gateway the change
reached.

Concurrency contract: a change is read-modify-write of one group's row, committed with the Delta
app transaction `group-config-<g>` at a version one past the last it read, so two concurrent
changes of one group never both win: the loser reads again and applies its change on top
(`alter`). Changes of different groups append side by side. The table is rewritten to one row per
group once it holds `compact_files` files.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping

import pyarrow as pa
from deltalake import CommitProperties, PostCommitHookProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from delta_log.core.group_config import GroupConfigBounds, apply_updates
from delta_log.errors import StorageUnavailableError
from delta_log.table.storage import StorageRoot, translate_storage_errors

GROUP_CONFIGS_TABLE = "group_configs"
GROUP_CONFIGS_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("configs", pa.string()),  # JSON object: key -> value (the group's overrides)
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=True)


class GroupConfigStore:
    """Every group's config overrides, durable in the root."""

    def __init__(self, storage: StorageRoot, *, attempts: int = 10, compact_files: int = 200) -> None:
        self.storage = storage
        self.attempts = attempts
        self.compact_files = compact_files
        self._lock = threading.Lock()
        self._dt = storage.open_or_create_system_table(GROUP_CONFIGS_TABLE, GROUP_CONFIGS_SCHEMA)
        self._seen = -1
        self._latest: dict[str, dict[str, str]] = {}

    def _read_locked(self) -> dict[str, dict[str, str]]:
        self._dt.update_incremental()
        version = int(self._dt.version())
        if version != self._seen:
            rows = self.storage.read_system_table(self._dt, GROUP_CONFIGS_SCHEMA).sort_by("updated_at").to_pylist()
            latest: dict[str, dict[str, str]] = {}
            for r in rows:  # oldest first: the last row of a group wins
                latest[r["group"]] = json.loads(r["configs"] or "{}")
            self._latest, self._seen = {g: c for g, c in latest.items() if c}, version
        return self._latest

    def load(self) -> tuple[int, dict[str, dict[str, str]]]:
        """(table version, every group's overrides). Raises: StorageUnavailableError."""
        with self._lock, translate_storage_errors():
            latest = self._read_locked()
            return self._seen, {g: dict(c) for g, c in latest.items()}

    def alter(self, group: str, updates: Mapping[str, str | None], bounds: GroupConfigBounds) -> dict[str, str]:
        """Apply `updates` to `group`'s overrides (None removes one) and return them.

        Raises: InvalidConfigError (delta_log.core.group_config.apply_updates), StorageUnavailableError."""
        with self._lock:
            for _ in range(self.attempts):
                with translate_storage_errors():
                    current = self._read_locked().get(group, {})
                new = apply_updates(current, updates, bounds)
                row = {
                    "group": [group],
                    "configs": [json.dumps(new, sort_keys=True)],
                    "updated_at": [time.time_ns() // 1000],
                }
                try:
                    write_deltalake(
                        self._dt,
                        pa.table(row, schema=GROUP_CONFIGS_SCHEMA),
                        mode="append",
                        # the app id's version is the table version it read: a concurrent change
                        # of the group (which carries it too) makes this commit conflict
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(f"group-config-{group}", self._seen + 1)]
                        ),
                        post_commithook_properties=_HOOKS,
                    )
                except CommitFailedError:
                    continue  # another change of this group won: read it and apply on top
                except (DeltaError, OSError) as exc:
                    raise StorageUnavailableError(f"Could not save the configs of group {group!r}: {exc}") from exc
                if len(self._dt.file_uris()) >= self.compact_files:
                    self._compact_locked()
                return new
        raise StorageUnavailableError(
            f"Could not save the configs of group {group!r}: {self.attempts} concurrent changes won; retry."
        )

    def _compact_locked(self) -> None:
        """One row per group (loses to any concurrent change, which the next compaction keeps)."""
        try:
            latest = self._read_locked()
            rows = pa.table(
                {
                    "group": list(latest),
                    "configs": [json.dumps(c, sort_keys=True) for c in latest.values()],
                    "updated_at": [time.time_ns() // 1000] * len(latest),
                },
                schema=GROUP_CONFIGS_SCHEMA,
            )
            self.storage.rewrite_system_table(self._dt, rows)
        except (DeltaError, OSError):
            self._dt.update_incremental()
