"""A system table's commits as log entries written by its store on local disk (delta_log.table.
log_entries): measured 21 ms a fenced commit through delta-rs, most of it rebuilding what the store
already holds, against a few ms for one parquet file and its JSON entry. Used by the offsets table,
the transactions table and the consumer-protocol groups' table."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, Transaction
from deltalake.transaction import AddAction, RemoveAction

from delta_log.table import log_entries
from delta_log.table.app_transactions import transactions_written
from delta_log.table.log_entries import append_entry, checkpoint_interval, plain_protocol
from delta_log.table.storage import StorageRoot
from delta_log.table.table_state import Checkpoint, TableState

log = logging.getLogger(__name__)


def own_log_for(storage: StorageRoot, dt: DeltaTable, name: str, *, track_files: bool = False) -> OwnLog | None:
    """The OwnLog of system table `dt` (`name`), at its version: on local disk and while its
    protocol is a plain one (None: delta-rs writes its commits; a constraint, column mapping or
    another feature would need it). `track_files`: it follows the table's files (`files`), which
    a table unpartitioned keeps at its root, so that a rewrite (`rewrite`) needs no table read;
    and, where it reads the table's state from its log (delta_log.table.table_state), it writes
    the table's checkpoints itself."""
    if not (storage.is_local and plain_protocol(dt)):
        return None
    own = OwnLog(storage.fs_path(dt.table_uri), dt.version(), checkpoint_interval(dt), name)
    if track_files:
        try:
            own.state = TableState.read(own.log_dir, own.version)
        except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
            log.warning("%s table: its state not read from its log (delta-rs checkpoints it): %s", name, exc)
        if own.state is None:
            own.files = {u.rpartition("/")[2] for u in dt.file_uris()}
    return own


def new_file_name() -> str:
    """A fresh data file's name, as delta-rs names them."""
    return f"part-{uuid.uuid4()}-c000.snappy.parquet"


class OwnLog:
    """A system table's commits written as log entries by its store (local disk): the version the
    next one is planned on, and the txns (app id -> version) of the entries read since the table
    object's snapshot. Used under the store's lock."""

    def __init__(self, table_dir: str, version: int, interval: int, name: str) -> None:
        self.table_dir = table_dir
        self.name = name  # the table's, in log lines and the checkpoint thread's name
        self.log_dir = os.path.join(table_dir, "_delta_log")
        self.version = version
        self.interval = interval
        self._txns: dict[str, int] = {}  # app id -> txn version, from entries after the snapshot
        self._checkpointing = False
        #: an entry read since changed the table's metadata or protocol (the store re-reads it)
        self.changed = False
        #: the table's files at `version`, where followed (`own_log_for`'s track_files) without `state`
        self._files: set[str] | None = None
        #: the table's state at `version`, where followed: its checkpoints are written from it
        self.state: TableState | None = None

    @property
    def files(self) -> set[str] | None:
        """The table's files at `version` (None: not followed)."""
        return self.state.files if self.state is not None else self._files

    @files.setter
    def files(self, files: set[str]) -> None:
        self._files = files

    def catch_up(self) -> None:
        """Read the entries committed after `version` (by anyone: this store, claims, compaction,
        other gateways) for their txns."""
        entries = log_entries.entries_from(self.log_dir, self.version + 1)
        self._txns.update(transactions_written(entries))
        if self.state is not None:
            self.state.apply(entries)
        elif self._files is not None:
            log_entries.apply_files(entries, self._files)
        if log_entries.conflicts(entries, frozenset()) is not None:  # with no txns of ours: metadata, protocol
            self.changed = True
        self.version += len(entries)

    def txn_version(self, dt: DeltaTable, app_id: str) -> int:
        """`app_id`'s txn version on the newest version (0: never written). `dt` is at or after
        the snapshot the txns were first read from, and never past the log: an app id no entry
        since changed holds there what it holds now."""
        self.catch_up()
        if app_id in self._txns:
            return self._txns[app_id]
        return dt.transaction_version(app_id) or 0

    def append(
        self,
        storage: StorageRoot,
        uri: str,
        table: pa.Table,
        txns: list[Transaction],
        stats: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """One parquet file (`name`, relative to the table, as its add action names it: a fresh
        one if None) and its log entry, on the version after `version` or (a blind append)
        past commits in between that wrote none of `txns`' app ids, nor metadata or protocol;
        returns its version. `stats`: the file's column statistics (Delta's minValues, maxValues,
        nullCount), beside its record count. Raises: CommitFailedError (one did: the caller reads
        them and checks the epoch again), StaleVersionError, OSError."""
        name = name or new_file_name()
        add = self.write_file(table, name, stats)
        entry = append_entry([add], txns, {}, partition_by=[])
        return self._commit(storage, uri, entry, name, self.version, frozenset(t.app_id for t in txns))

    def write_file(self, table: pa.Table, name: str, stats: Mapping[str, Any] | None = None) -> AddAction:
        """Write `table` as the table's data file `name` (not committed yet): its add action."""
        path = os.path.join(self.table_dir, name)
        pq.write_table(table, path, compression="snappy")
        return AddAction(
            name,
            os.path.getsize(path),
            {},
            int(time.time() * 1000),
            True,
            json.dumps({"numRecords": table.num_rows, **(stats or {})}),
        )

    def rewrite(self, storage: StorageRoot, uri: str, add: AddAction, read_version: int, replaced: set[str]) -> int:
        """Commit `add` (a file `write_file` wrote) in place of the files `replaced`, which the
        table held at `read_version`: a rewrite of its rows. Commits since that only added files
        (appends: their rows are newer) do not conflict, so a store may write the file without its
        lock and commit with it; one that removed a replaced file, or changed the metadata or
        protocol, does (CommitFailedError; the file is deleted). Returns its version. Raises:
        CommitFailedError, StaleVersionError, OSError."""
        now = int(time.time() * 1000)
        removes = [RemoveAction(f, True, now) for f in sorted(replaced)]
        entry = append_entry([*removes, add], [], {}, partition_by=[], mode="Overwrite")
        return self._commit(storage, uri, entry, add.path, read_version, frozenset(), removed=frozenset(replaced))

    def _commit(
        self,
        storage: StorageRoot,
        uri: str,
        entry: bytes,
        name: str,
        read_version: int,
        app_ids: frozenset[str],
        *,
        removed: frozenset[str] = frozenset(),
    ) -> int:
        """Commit `entry` (adding the file `name`) after `read_version`; catch up to it."""
        try:
            version = log_entries.commit(self.log_dir, read_version, entry, app_ids, removed=removed)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.table_dir, name))
            raise
        try:  # the commit is durable: what follows may not fail it
            before = self.version
            self.catch_up()  # to `version`: the entries it skipped (others') and its own
            if log_entries.crosses_checkpoint(before, version, self.interval):
                self._checkpoint(storage, uri)
        except Exception as exc:
            log.warning(
                "%s table: reading the log after version %d failed (read again next time): %s", self.name, version, exc
            )
        return version

    def checkpoint(self) -> Checkpoint | None:
        """The table's checkpoint at `version`, to write (`Checkpoint.write`, which needs no lock);
        None where its state is not followed, or an entry since changed its metadata or protocol
        (the store reads the table anew; delta-rs checkpoints whatever the protocol asks)."""
        if self.state is None or self.changed:
            return None
        return self.state.checkpoint(int(time.time() * 1000))

    def _checkpoint(self, storage: StorageRoot, uri: str) -> None:
        """Every `delta.checkpointInterval` versions, as delta-rs's hook would, on a thread of its
        own (tens of ms) with a table object of its own; or written from the state followed."""
        if (own := self.checkpoint()) is not None:
            try:
                own.write(self.log_dir)
            except (OSError, pa.ArrowException) as exc:  # the next interval's covers it
                log.warning("checkpoint of the %s table failed: %s", self.name, exc)
            return
        if self._checkpointing:
            return
        self._checkpointing = True

        def run() -> None:
            try:
                DeltaTable(uri, storage_options=storage.options()).create_checkpoint()
            except Exception as exc:  # the next interval's covers it
                log.warning("checkpoint of the %s table failed: %s", self.name, exc)
            finally:
                self._checkpointing = False

        threading.Thread(target=run, name=f"{self.name}-checkpoint", daemon=True).start()
