"""Committed consumer offsets: the `_system/consumer_offsets` Delta table.

Concurrency contract
- The table is a compacted log: one row per commit per (group, topic, partition); the latest
  `commit_timestamp` wins (ties broken by table version, then by row order). Appends never
  conflict with each other (blind appends), so several servers may commit concurrently.
- `commit()` writes many offsets in ONE Delta commit and returns only after it is durable.
- `compact()` (the server calls it every few seconds) rewrites the table to one row per key once
  it has 256 files; the rewrite loses to any concurrent commit, so none is ever dropped, and a
  commit that races a rewrite is retried on the new snapshot.
- Reads are served from memory; `load()` re-reads new versions (other servers, jobs).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, PostCommitHookProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from delta_log.core.group_rules import validate_group_id
from delta_log.core.records import check_offset
from delta_log.core.topic_config import validate_topic_name
from delta_log.errors import (
    InvalidOffsetError,
    NotCoordinatorError,
    OffsetMetadataTooLargeError,
    StorageUnavailableError,
)
from delta_log.system.own_log import own_log_for
from delta_log.table.app_transactions import (
    coordinator_app_id,
    coordinator_transactions,
    read_coordinator_epoch,
)
from delta_log.table.log_entries import StaleVersionError
from delta_log.table.storage import StorageRoot, translate_storage_errors
from delta_log.table.time_travel import travel

OFFSETS_TABLE = "consumer_offsets"
#: how far back the table's log is kept (its compaction's cleanup): a group's lag history
#: (GET /groups/{g}/lag-history, the last hour by default) travels back through it
OFFSETS_HISTORY_S = 3600.0
#: Kafka's offset.metadata.max.bytes.
MAX_METADATA_BYTES = 4096
#: A deleted committed offset (DeleteGroups, OffsetDelete): the latest row of its key, read as none.
#: Compaction keeps it (as the latest row of its key), so a gateway that read the offset before
#: still learns of the delete, and replication copies it.
DELETED = -1

OFFSETS_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("metadata", pa.string()),
        pa.field("member_id", pa.string()),
        pa.field("generation", pa.int32()),
        pa.field("commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)

log = logging.getLogger(__name__)

_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
_APPEND_ATTEMPTS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommit:
    group: str
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    member_id: str = ""
    generation: int = -1
    commit_timestamp_us: int = 0

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.group, self.topic, self.partition)


def validate_commit(c: OffsetCommit) -> None:
    """Raises: InvalidGroupError, InvalidTopicError, InvalidOffsetError."""
    validate_group_id(c.group)
    validate_topic_name(c.topic)
    if c.partition < 0:
        raise InvalidOffsetError(f"Partition must be >= 0; got {c.partition}.", partition=c.partition)
    check_offset(c.offset, what="A committed offset")
    if len(c.metadata.encode("utf-8", "surrogatepass")) > MAX_METADATA_BYTES:
        raise OffsetMetadataTooLargeError(
            f"Commit metadata of {c.topic}-{c.partition} is over {MAX_METADATA_BYTES} bytes.", partition=c.partition
        )


def latest_per_key(rows: Iterable[OffsetCommit]) -> dict[tuple[str, str, int], OffsetCommit]:
    """Pure: the latest commit per (group, topic, partition) by commit timestamp, later rows win ties."""
    out: dict[tuple[str, str, int], OffsetCommit] = {}
    for row in rows:
        prev = out.get(row.key)
        if prev is None or row.commit_timestamp_us >= prev.commit_timestamp_us:
            out[row.key] = row
    return out


def _row_commit(r: dict[str, Any]) -> OffsetCommit:
    ts = r["commit_timestamp"]
    return OffsetCommit(
        group=r["group"],
        topic=r["topic"],
        partition=r["partition"],
        offset=r["offset"],
        metadata=r["metadata"] or "",
        member_id=r["member_id"] or "",
        generation=r["generation"] if r["generation"] is not None else -1,
        commit_timestamp_us=int(ts.timestamp() * 1_000_000) if ts is not None else 0,
    )


def _to_table(commits: Sequence[OffsetCommit]) -> pa.Table:
    return pa.table(
        {
            "group": [c.group for c in commits],
            "topic": [c.topic for c in commits],
            "partition": pa.array([c.partition for c in commits], pa.int32()),
            "offset": pa.array([c.offset for c in commits], pa.int64()),
            "metadata": [c.metadata for c in commits],
            "member_id": [c.member_id for c in commits],
            "generation": pa.array([c.generation for c in commits], pa.int32()),
            "commit_timestamp": pa.array([c.commit_timestamp_us for c in commits], pa.timestamp("us", tz="UTC")),
        },
        schema=OFFSETS_SCHEMA,
    )


class OffsetStore:
    """Durable committed offsets, served from memory."""

    def __init__(self, storage: StorageRoot) -> None:
        self.storage = storage
        self.uri = storage.system_uri(OFFSETS_TABLE)
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, str, int], OffsetCommit] = {}
        self._version = -1
        self._dt = storage.open_or_create_system_table(OFFSETS_TABLE, OFFSETS_SCHEMA)
        # On local disk commits write their log entry themselves (delta_log.table.log_entries):
        # measured 21 ms a fenced commit through delta-rs, most of it rebuilding what this store
        # holds; a consumer committing after each poll waits for that. `_own` is then the version
        # the next commit is planned on, and the coordinator txns seen since (`_txns`).
        self._own = own_log_for(storage, self._dt, OFFSETS_TABLE)
        self.load()

    def load(self) -> None:
        """Read versions committed since the last load (by anyone) into memory."""
        with self._lock, translate_storage_errors():
            self._dt.update_incremental()
            if self._dt.version() == self._version:
                return
            table = self.storage.read_system_table(self._dt, OFFSETS_SCHEMA)
            self._version = self._dt.version()
        rows = [_row_commit(r) for r in table.to_pylist()]
        latest = latest_per_key(rows)
        with self._lock:
            for key, row in latest.items():
                prev = self._latest.get(key)
                if prev is None or row.commit_timestamp_us >= prev.commit_timestamp_us:
                    self._latest[key] = row

    def claim_coordinator(self, group: str) -> int:
        """Take group `group` over: commit its coordinator epoch + 1 (an empty commit) and return
        it. Offset commits fenced with an older epoch are refused from now on.

        Raises: StorageUnavailableError."""
        with self._lock:
            for _ in range(_APPEND_ATTEMPTS):
                try:
                    self._dt.update_incremental()
                    epoch = read_coordinator_epoch(self._dt, group) + 1
                    write_deltalake(
                        self._dt,
                        _to_table([]),
                        mode="append",
                        commit_properties=CommitProperties(
                            app_transactions=coordinator_transactions(group, epoch), max_commit_retries=0
                        ),
                        post_commithook_properties=_HOOKS,
                    )
                    return epoch
                except CommitFailedError:
                    continue  # another claim or commit won the version: read again
                except (DeltaError, OSError) as exc:
                    raise StorageUnavailableError(f"Could not claim group {group!r}: {exc}") from exc
        raise StorageUnavailableError(f"Could not claim group {group!r}: too many concurrent commits.")

    def coordinator_epoch(self, group: str) -> int:
        """`group`'s coordinator epoch on the latest version (0: no gateway ever coordinated it).
        Raises: StorageUnavailableError."""
        with self._lock, translate_storage_errors():
            self._dt.update_incremental()
            return read_coordinator_epoch(self._dt, group)

    def check_coordinator(self, group: str, epoch: int) -> None:
        """Raises: NotCoordinatorError if `group`'s epoch on the latest version is not `epoch`
        (another gateway took it over); StorageUnavailableError."""
        with self._lock, translate_storage_errors():
            self._require_epoch(group, epoch)

    def lost_coordinators(self, held: Mapping[str, int]) -> set[str]:
        """Of the groups `held` (group -> the coordinator epoch this gateway holds), those whose
        epoch on the latest version is another (taken over): one refresh and one turn of the lock
        for them all. Raises: StorageUnavailableError."""
        lost = set()
        with self._lock, translate_storage_errors():
            for group, epoch in held.items():
                try:
                    self._require_epoch(group, epoch)
                except NotCoordinatorError:
                    lost.add(group)
        return lost

    def _app_version(self, app_id: str) -> int:
        """With the lock held: `app_id`'s Delta app transaction version on the latest version (0: none)."""
        if self._own is not None:
            return self._own.txn_version(self._dt, app_id)
        self._dt.update_incremental()
        return self._dt.transaction_version(app_id) or 0

    def _require_epoch(self, group: str, epoch: int) -> None:
        """With the lock held: refresh, then Raises NotCoordinatorError unless the epoch holds."""
        if self._own is not None:
            current = self._own.txn_version(self._dt, coordinator_app_id(group))  # the log's newest entries
        else:
            self._dt.update_incremental()
            current = read_coordinator_epoch(self._dt, group)
        if current != epoch:
            raise NotCoordinatorError(
                f"Group {group!r} was taken over by another gateway (epoch {current}, this one holds {epoch}).",
                group=group,
            )

    def commit(
        self,
        commits: Sequence[OffsetCommit],
        *,
        fence: tuple[str, int] | None = None,
        fences: Sequence[tuple[str, int]] = (),
        transaction: tuple[str, int] | None = None,
    ) -> int:
        """Durably commit many offsets in one Delta commit; return the table version.

        `fence` (group, epoch), and each of `fences`: commit only while the group's coordinator
        epoch is still `epoch` (checked on the latest version and carried in the commit, so a takeover
        racing this commit makes it fail and re-check). `transaction` (app id, version): a Delta
        app transaction the commit carries, naming the Kafka transaction whose offsets these are,
        as the topic commits that landed its records carry it (so each output version's input
        position is found by time travel); a commit whose app id already holds that version or a
        later one writes nothing (those offsets, or a later transaction's, are in).

        Raises: InvalidOffsetError, StorageUnavailableError, NotCoordinatorError (fenced).
        """
        for c in commits:
            validate_commit(c)
        return self._append(commits, [*([fence] if fence else []), *fences], transaction)

    def delete(self, group: str, keys: Iterable[tuple[str, int]], *, fence: tuple[str, int] | None = None) -> int:
        """Delete a group's committed offsets of (topic, partition) `keys` (Kafka's OffsetDelete,
        DeleteGroups): a `DELETED` row per key, fenced like a commit.

        Raises: StorageUnavailableError, NotCoordinatorError (fenced)."""
        deleted = [OffsetCommit(group=group, topic=t, partition=p, offset=DELETED) for t, p in keys]
        return self._append(deleted, [fence] if fence else [])

    def _append(
        self,
        commits: Sequence[OffsetCommit],
        fences: Sequence[tuple[str, int]],
        mark: tuple[str, int] | None = None,
    ) -> int:
        if not commits:
            return self._version
        now_us = int(time.time() * 1e6)  # an unstamped commit is as of now: the latest one wins
        commits = [c if c.commit_timestamp_us else dataclasses.replace(c, commit_timestamp_us=now_us) for c in commits]
        table = _to_table(commits)
        with self._lock:
            version, reopen, read_on = -1, False, False
            for attempt in range(_APPEND_ATTEMPTS):
                try:  # what the attempt before left to do first, then the attempt
                    if read_on and self._own is not None:
                        self._own.catch_up()
                    elif read_on:
                        self._dt.update_incremental()
                    if reopen or (self._own is not None and self._own.changed):
                        self._reopen_own()  # the log moved under us, or its metadata or protocol changed
                    reopen = read_on = False
                    txns = [] if mark is None else [Transaction(*mark)]
                    if mark is not None and self._app_version(mark[0]) >= mark[1]:
                        return self._version  # landed before (a roll-forward of a transaction)
                    for f in fences:
                        self._require_epoch(*f)  # reads the log's newest entries on our own path
                        txns += coordinator_transactions(*f)
                    if fences and self._own is not None and self._own.changed:
                        self._reopen_own()
                    if self._own is not None:
                        version = self._own.append(self.storage, self.uri, table, txns)
                        break
                    write_deltalake(
                        self._dt,
                        table,
                        mode="append",
                        commit_properties=CommitProperties(
                            app_transactions=txns or None, max_commit_retries=0 if txns else 20
                        ),
                        post_commithook_properties=_HOOKS,
                    )
                    version = self._dt.version()
                    break
                except StaleVersionError:  # the log was cleaned or made again under this store
                    if attempt == _APPEND_ATTEMPTS - 1:
                        raise StorageUnavailableError("Could not commit offsets: the table keeps moving.") from None
                    reopen = True
                except CommitFailedError as exc:
                    # A compaction rewrote the table meanwhile; delta-rs refuses the append as if
                    # it had read the rewritten files. A blind append is safe on the new snapshot.
                    # (Own entries: a claim, a metadata or protocol change in between; read them.)
                    if attempt == _APPEND_ATTEMPTS - 1:
                        raise StorageUnavailableError(f"Could not commit offsets: {exc}") from exc
                    read_on = True
                except (DeltaError, OSError, ValueError) as exc:  # ValueError: a log line that is not JSON
                    raise StorageUnavailableError(f"Could not commit offsets: {exc}") from exc
            for c in commits:
                prev = self._latest.get(c.key)
                if prev is None or c.commit_timestamp_us >= prev.commit_timestamp_us:
                    self._latest[c.key] = c
            return version

    def _reopen_own(self) -> None:
        """With the lock held: read the table again and write its entries ourselves only while its
        protocol is still plain (a constraint, column mapping or another feature: delta-rs writes).
        Raises: DeltaError, OSError."""
        self._dt.update_incremental()
        self._own = own_log_for(self.storage, self._dt, OFFSETS_TABLE) if self._own is not None else None

    def compact(self, *, min_files: int = 256) -> bool:
        """Rewrite the table to its latest row per (group, topic, partition) once it has `min_files`
        files (every commit adds one). The rewrite conflicts with, and loses to, any concurrent
        commit (max_commit_retries=0): no commit is ever dropped. False when skipped or lost.
        """
        with self._lock:
            try:
                self._dt.update_incremental()
                if len(self._dt.file_uris()) < min_files:
                    return False
                rows = self.storage.read_system_table(self._dt, OFFSETS_SCHEMA).to_pylist()
                latest = latest_per_key(_row_commit(r) for r in rows)
                self.storage.rewrite_system_table(
                    self._dt, _to_table(list(latest.values())), history_s=OFFSETS_HISTORY_S
                )
                self._version = self._dt.version()
            except (DeltaError, OSError):
                return False  # CommitFailedError (a concurrent commit won) is a DeltaError
            return True

    def committed(self, group: str, topic: str | None = None) -> dict[tuple[str, int], OffsetCommit]:
        """Latest committed offset per (topic, partition) of a group, from memory."""
        with self._lock:
            return {
                (t, p): c
                for (g, t, p), c in self._latest.items()
                if g == group and (topic is None or t == topic) and c.offset != DELETED
            }

    def groups(self) -> list[str]:
        """Groups with committed offsets."""
        with self._lock:
            return sorted({g for (g, _, _), c in self._latest.items() if c.offset != DELETED})

    def all_committed(self, *, deleted: bool = False) -> list[OffsetCommit]:
        """The latest commit of every key; with `deleted`, the deletes (`DELETED` rows) too."""
        with self._lock:
            return [c for c in self._latest.values() if deleted or c.offset != DELETED]


def committed_history(
    storage: StorageRoot, group: str, times_ms: Sequence[int]
) -> list[dict[tuple[str, int], int] | None]:
    """`group`'s committed offsets, (topic, partition) -> offset, as the offsets table held them at
    each of `times_ms` (Delta time travel to the last version committed at or before it): what
    the group had read then. Empty before the table's first version; None where its history no
    longer reaches back that far (log cleanup) or cannot be read.
    """
    with translate_storage_errors():
        dt = storage.open_table(storage.system_uri(OFFSETS_TABLE))
    out: list[dict[tuple[str, int], int] | None] = []
    for state in travel(dt, times_ms):
        if state != "loaded":
            out.append({} if state == "before" else None)
            continue
        try:  # a version whose files a compaction's vacuum removed is history no more
            table = storage.read_system_table(dt, OFFSETS_SCHEMA)
        except (OSError, DeltaError, pa.ArrowException):
            out.append(None)
            continue
        rows = [_row_commit(r) for r in table.filter(pc.equal(table["group"], group)).to_pylist()]
        out.append({(t, p): c.offset for (_, t, p), c in latest_per_key(rows).items() if c.offset != DELETED})
    return out
