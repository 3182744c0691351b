"""Consumer-protocol (KIP-848) groups: the `_system/consumer_protocol_groups` Delta table.

One row per saved change of a group: the group, the coordinator epoch of the gateway that saved it
(claimed on the offsets table: delta_log.system.offsets), the saving process's sequence number,
the group's epoch, and its snapshot (JSON: `ConsumerGroup.snapshot`; empty when the group is gone).
The latest row per group wins: the highest coordinator epoch, then the highest sequence (the
order of rows read back is the files', not the commits'). A gateway that takes a group over (a failover, a
restart) restores it from here, so its members keep their ids, epochs and partitions, as Kafka's
coordinator loads a group from `__consumer_offsets`.

Only a group's coordinator writes it, and it checks its coordinator epoch first (as for
`_system/consumer_groups`); a row from a coordinator that lost the group meanwhile is outranked by
the new coordinator's epoch. `compact()` rewrites the table to one row per group; it loses to any
concurrent append.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, PostCommitHookProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from delta_log.errors import StorageUnavailableError
from delta_log.system.own_log import OwnLog, own_log_for
from delta_log.table.log_entries import StaleVersionError
from delta_log.table.storage import StorageRoot, translate_storage_errors

TABLE = "consumer_protocol_groups"
SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("coordinator_epoch", pa.int64()),
        pa.field("sequence", pa.int64()),
        pa.field("group_epoch", pa.int64()),
        pa.field("snapshot", pa.string()),  # "": the group is gone
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
_ATTEMPTS = 5

#: a saved snapshot: (coordinator epoch, group epoch, snapshot or None when the group is gone)
Saved = tuple[int, int, dict[str, Any] | None]


def _latest(rows: list[dict[str, Any]]) -> dict[str, tuple[tuple[int, int], dict[str, Any]]]:
    latest: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
    for r in rows:
        rank = (int(r["coordinator_epoch"]), int(r["sequence"]))
        if r["group"] not in latest or rank > latest[r["group"]][0]:
            latest[r["group"]] = (rank, r)
    return latest


def _rows(saved: Mapping[str, Saved], sequence: int) -> pa.Table:
    now = int(time.time() * 1e6)
    groups = sorted(saved)
    return pa.table(
        {
            "group": groups,
            "coordinator_epoch": pa.array([saved[g][0] for g in groups], pa.int64()),
            "sequence": pa.array([sequence] * len(groups), pa.int64()),
            "group_epoch": pa.array([saved[g][1] for g in groups], pa.int64()),
            "snapshot": [json.dumps(saved[g][2], separators=(",", ":")) if saved[g][2] else "" for g in groups],
            "updated_at": pa.array([now] * len(groups), pa.timestamp("us", tz="UTC")),
        },
        schema=SCHEMA,
    )


class ConsumerGroupSnapshots:
    """The latest snapshot of each consumer-protocol group."""

    def __init__(self, storage: StorageRoot) -> None:
        self.storage = storage
        self._lock = threading.Lock()
        self._dt = storage.open_or_create_system_table(TABLE, SCHEMA)
        self._rows_since_compaction = 0
        self._sequence = 0
        # On local disk a save writes its log entry itself (delta_log.system.own_log): a heartbeat
        # that changed its group waits for the save, and librdkafka times a heartbeat out after
        # its interval. Measured beside three busy processes: 43 ms a save through delta-rs at the
        # median, 190 ms at p99, so heartbeats waited up to 0.55 s.
        self._own: OwnLog | None = own_log_for(storage, self._dt, TABLE)

    def save(self, saved: Mapping[str, Saved]) -> None:
        """Append the groups' snapshots in one commit (a blind append: only their coordinator
        writes them, and checked its epoch first). Raises: StorageUnavailableError."""
        if not saved:
            return
        with self._lock:
            # increasing within this process (a restarted gateway saves under a new coordinator epoch)
            self._sequence = max(self._sequence + 1, time.time_ns())
            rows = _rows(saved, self._sequence)
            try:
                self._append(rows)
            except (DeltaError, OSError, ValueError) as exc:  # ValueError: a log line that is not JSON
                raise StorageUnavailableError(f"Could not save consumer group state: {exc}") from exc
            self._rows_since_compaction += len(saved)

    def _append(self, rows: pa.Table) -> None:
        """With the lock held. Raises: DeltaError, OSError, ValueError."""
        for _ in range(_ATTEMPTS):
            own = self._own
            if own is not None and own.changed:  # a metadata or protocol change: read it
                self._dt.update_incremental()
                own = self._own = own_log_for(self.storage, self._dt, TABLE)
            if own is None:
                self._dt.update_incremental()
                write_deltalake(
                    self._dt,
                    rows,
                    mode="append",
                    commit_properties=CommitProperties(max_commit_retries=20),
                    post_commithook_properties=_HOOKS,
                )
                return
            try:
                own.append(self.storage, self._dt.table_uri, rows, [])
                return
            except StaleVersionError:  # the log was cleaned under this store: read the table again
                self._dt.update_incremental()
                self._own = own_log_for(self.storage, self._dt, TABLE)
            except CommitFailedError:  # a rewrite's metadata, or many commits in between: read them
                own.catch_up()
        raise CommitFailedError("too many concurrent commits")

    def load(self, group: str | None = None) -> dict[str, dict[str, Any]]:
        """The latest snapshot of each group (of `group` only, if given) that is not gone.

        Raises: StorageUnavailableError."""
        with self._lock, translate_storage_errors():
            self._dt.update_incremental()
            rows = self.storage.read_system_table(self._dt, SCHEMA).to_pylist()
        latest = _latest([r for r in rows if group is None or r["group"] == group])
        return {g: json.loads(r["snapshot"]) for g, (_, r) in latest.items() if r["snapshot"]}

    def compact(self, *, min_rows: int = 256) -> bool:
        """Rewrite the table to its latest row per group (gone groups dropped) once `min_rows` were
        appended here since the last rewrite. False when skipped or a concurrent append won.

        The files are read without the lock (they never change), so saves, which a heartbeat's
        answer waits for, go on meanwhile: reading a few hundred one-row files takes 0.15-0.2 s on
        a loaded machine, and up to 1 s beside a busy gateway. Only the few files saved meanwhile
        are read under the lock, before the rewrite."""
        with self._lock:
            if self._rows_since_compaction < min_rows:
                return False
            try:
                self._dt.update_incremental()
                files = list(self._dt.file_uris())
            except (DeltaError, OSError):
                return False
        try:
            read = self._read(files)
        except (DeltaError, OSError):
            return False
        with self._lock:
            try:
                self._dt.update_incremental()
                current, known = self._dt.file_uris(), set(files)
                if not known <= set(current):
                    return False  # rewritten meanwhile (another gateway compacted it)
                rows = read + self._read([f for f in current if f not in known])
                kept = [r for _, r in _latest(rows).values() if r["snapshot"]]
                self.storage.rewrite_system_table(self._dt, pa.Table.from_pylist(kept, schema=SCHEMA))
            except (DeltaError, OSError):
                return False
            self._rows_since_compaction = 0
            return True

    def _read(self, uris: list[str]) -> list[dict[str, Any]]:
        return self.storage.read_data_files([self.storage.fs_path(u) for u in uris], SCHEMA).to_pylist()
