"""Transactions' durable state: the `_system/transactions` Delta table, and the staged records and
offsets of open transactions under `_system/transactions_staged/`.

The table: one row per saved change of a transactional id: the id, the coordinator epoch of the
gateway that saved it, that gateway's sequence number, the id's state (delta_log.core.transactions
`Txn.snapshot`, JSON) and, while a decision is being carried out (PrepareCommit, PrepareAbort),
the decision: the staged files it lands and the per-partition sequences it covers. The latest row
per id wins: the highest coordinator epoch, then the highest sequence. A gateway that takes an id
over (a failover, a restart) reads it back and finishes any decision it finds, so no outcome is
ever decided by memory alone.

Coordinator epochs: a gateway claims an id (`claim`) by committing its epoch + 1 as the Delta app
transaction `txn-coordinator-<id>`; every save carries that app transaction with the epoch it
holds, so a save by a gateway that lost the id (a stale view, a pause) fails on the commit rule
and is refused with NotCoordinatorError, never written.

Staging: a transactional producer's records are written, before they are acked, as one Arrow IPC
file per request and partition at `<id hash>/<pid>.<epoch>/records.<topic>.<partition>.<base sequence>.arrow`
(a retried request rewrites its own file; an HTTP producer's lane, its Producer-Id, hashed into
the name after the sequence), TxnOffsetCommit's offsets as JSON files at
`<id hash>/<pid>.<epoch>/offsets.<group>.<time>.json`, and what AddPartitionsToTxn and
AddOffsetsToTxn added at `<id hash>/<pid>.<epoch>/added.<time>.json` (an open transaction is not
saved to the table: its staging is its durable record). Topic and group names are quoted, dots
too, so a name splits at its dots. One directory a producer's transaction, no more: on local disk
a directory costs as much as a file to make and delete, and each transaction makes and deletes
its own (measured on ext4 without a journal, as on this project's machines: nested directories per topic and partition took 4 of the 7 inodes a
small transaction made, and allocating inodes 20% of the gateway's CPU). A name too long for one
file name (a topic or group of 190 bytes or so) is staged in directories, `records/<topic>/<partition>/`
or `offsets/<group>/`, as earlier versions staged every one; those are read as well, and a request
found both ways (a retry across an upgrade) lands once. On local disk a file is written beside its
place and renamed in (a reader sees all of it or nothing), as durable as the appends it stands for:
fsynced (file and directory) for a `log` topic, whose plain produce acks after an fsync; written
like a Delta table's own files otherwise (a `table` topic's records, group offsets), which a
process crash never loses and a power loss may (docs/DESIGN.md, "The write-ahead tier": what
each mode promises). On object storage a PUT. The topic tables never see them until the
coordinator lands them at commit. On local disk a decided transaction's directory is renamed `<pid>.<epoch>.n<number>` (`seal`), so the
producer's next transaction, under the same epoch, stages afresh while it lands.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from delta_log.core.transactions import Txn
from delta_log.errors import NotCoordinatorError, StorageUnavailableError
from delta_log.system.own_log import OwnLog, new_file_name, own_log_for
from delta_log.table.log_entries import StaleVersionError
from delta_log.table.storage import SYSTEM_DIR, StorageRoot, system_table_configured, translate_storage_errors

TABLE = "transactions"
STAGED_DIR = "transactions_staged"
SCHEMA = pa.schema(
    [
        pa.field("transactional_id", pa.string()),
        pa.field("coordinator_epoch", pa.int64()),
        pa.field("sequence", pa.int64()),
        pa.field("state", pa.string()),
        pa.field("snapshot", pa.string()),
        pa.field("decision", pa.string()),  # "": no decision being carried out
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
_ATTEMPTS = 10
_WRITTEN_KEPT = 8192  # rows of files written here that a compaction need not read (a few MB at most)


def coordinator_app_id(transactional_id: str) -> str:
    return f"txn-coordinator-{transactional_id}"


@dataclass(frozen=True, slots=True)
class Saved:
    """A transactional id as last saved: its state, the decision being carried out, and the
    coordinator epoch that saved it."""

    txn: Txn
    decision: Mapping[str, Any] | None
    coordinator_epoch: int


def _newest(rows: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Each id's winning row: the highest coordinator epoch, then the highest sequence."""
    ranked: dict[str, tuple[tuple[int, int], Mapping[str, Any]]] = {}
    for r in rows:
        rank = (int(r["coordinator_epoch"]), int(r["sequence"]))
        tid = r["transactional_id"]
        if tid not in ranked or rank > ranked[tid][0]:
            ranked[tid] = (rank, r)
    return {tid: r for tid, (_, r) in ranked.items()}


def _id_stats(ids: Sequence[str]) -> dict[str, Any]:
    """A file's statistics of the ids it holds (Delta's), which `_files_holding` reads."""
    if not ids:
        return {"nullCount": {"transactional_id": 0}}
    return {
        "minValues": {"transactional_id": min(ids)},
        "maxValues": {"transactional_id": max(ids)},
        "nullCount": {"transactional_id": 0},
    }


def _kept(
    rows: Sequence[Mapping[str, Any]], expire_before_ms: int | None, keep: frozenset[str]
) -> list[Mapping[str, Any]]:
    """What a compaction keeps of `rows`: each id's winning row, but the ids idle since
    `expire_before_ms` (no transaction open or deciding, not in `keep`)."""
    return [
        r
        for r in _newest(rows).values()
        if expire_before_ms is None
        or r["transactional_id"] in keep
        or (txn := _saved(r).txn).open
        or txn.updated_ms >= expire_before_ms
    ]


def _files_holding(dt: DeltaTable, transactional_id: str) -> list[str]:
    """The table's files that may hold rows of `transactional_id`: by their statistics, each
    file's least and greatest id, where they have them (the rest are read). A greatest value that
    delta-rs truncated to a prefix still counts as holding the ids it begins."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    if "min.transactional_id" not in actions.column_names:
        return [str(p) for p in actions.column("path").to_pylist()]
    out = []
    for path, low, high in zip(
        actions.column("path").to_pylist(),
        actions.column("min.transactional_id").to_pylist(),
        actions.column("max.transactional_id").to_pylist(),
        strict=True,
    ):
        if (
            low is None
            or high is None
            or (low <= transactional_id and (transactional_id <= high or transactional_id.startswith(high)))
        ):
            out.append(str(path))
    return out


def _saved(row: Mapping[str, Any]) -> Saved:
    decision = json.loads(row["decision"]) if row["decision"] else None
    return Saved(Txn.of(json.loads(row["snapshot"])), decision, int(row["coordinator_epoch"]))


class TransactionStore:
    """The `_system/transactions` table (thread-safe; every call is blocking I/O)."""

    def __init__(self, storage: StorageRoot) -> None:
        self.storage = storage
        self._lock = threading.Lock()
        self._dt = storage.open_or_create_system_table(TABLE, SCHEMA)
        self._sequence = 0
        self._rows_since_compaction = 0
        self._compacting = False
        # On local disk a save writes its log entry itself (delta_log.system.own_log): measured
        # 15.7 ms a save through delta-rs, three saves a transaction.
        self._own: OwnLog | None = own_log_for(storage, self._dt, TABLE, track_files=True)
        # the rows of the files this store wrote (`save`) since the last compaction, by file name,
        # so that a compaction reads only the files others wrote: measured two thirds of its
        # time, reading every one-row file back
        self._written: dict[str, dict[str, Any]] = {}

    def _epoch(self, transactional_id: str) -> int:
        return self._dt.transaction_version(coordinator_app_id(transactional_id)) or 0

    def coordinator_epoch(self, transactional_id: str) -> int:
        """The id's coordinator epoch on the latest version (0: never claimed)."""
        with self._lock, translate_storage_errors():
            self._dt.update_incremental()
            return self._epoch(transactional_id)

    def claim(self, transactional_id: str) -> int:
        """Coordinate `transactional_id` from here: commit its coordinator epoch + 1 and return it.
        Saves with an older epoch are refused from now on. Raises: StorageUnavailableError."""
        with self._lock:
            for _ in range(_ATTEMPTS):
                try:
                    self._dt.update_incremental()
                    epoch = self._epoch(transactional_id) + 1
                    write_deltalake(
                        self._dt,
                        SCHEMA.empty_table(),
                        mode="append",
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(coordinator_app_id(transactional_id), epoch)],
                            max_commit_retries=0,
                        ),
                        post_commithook_properties=_HOOKS,
                    )
                    return epoch
                except CommitFailedError:
                    continue  # another claim or save won the version: read again
                except (DeltaError, OSError) as exc:
                    raise StorageUnavailableError(
                        f"Could not claim transactional id {transactional_id!r}: {exc}"
                    ) from exc
        raise StorageUnavailableError(f"Could not claim transactional id {transactional_id!r}: too many commits.")

    def save(self, txn: Txn, epoch: int, decision: Mapping[str, Any] | None = None) -> None:
        """Save the id's state (and the decision being carried out) durably, while `epoch` is still
        its coordinator epoch. Raises: NotCoordinatorError (another gateway claimed the id),
        StorageUnavailableError."""
        tid = txn.transactional_id
        with self._lock:
            self._sequence = max(self._sequence + 1, time.time_ns())
            row = pa.table(
                {
                    "transactional_id": [tid],
                    "coordinator_epoch": pa.array([epoch], pa.int64()),
                    "sequence": pa.array([self._sequence], pa.int64()),
                    "state": [txn.state],
                    "snapshot": [json.dumps(txn.snapshot(), separators=(",", ":"))],
                    "decision": [json.dumps(decision, separators=(",", ":")) if decision else ""],
                    "updated_at": pa.array([int(time.time() * 1e6)], pa.timestamp("us", tz="UTC")),
                },
                schema=SCHEMA,
            )
            fence = [Transaction(coordinator_app_id(tid), epoch)]
            for _ in range(_ATTEMPTS):
                try:
                    own = self._own
                    if own is not None and own.changed:  # a metadata or protocol change: read it
                        self._dt.update_incremental()
                        own = self._own = own_log_for(self.storage, self._dt, TABLE, track_files=True)
                    if own is not None:
                        current = own.txn_version(self._dt, coordinator_app_id(tid))
                    else:
                        self._dt.update_incremental()
                        current = self._epoch(tid)
                    if current != epoch:
                        raise NotCoordinatorError(
                            f"Transactional id {tid!r} was taken over by another gateway "
                            f"(epoch {current}, this one holds {epoch}).",
                            transactional_id=tid,
                        )
                    if own is not None:  # the claim's txn in it: a claim since makes it conflict
                        name = new_file_name()
                        own.append(self.storage, self._dt.table_uri, row, fence, _id_stats([tid]), name=name)
                        if len(self._written) >= _WRITTEN_KEPT:  # compactions failing: read the oldest
                            del self._written[next(iter(self._written))]
                        self._written[name] = row.to_pylist()[0]
                    else:
                        write_deltalake(
                            self._dt,
                            row,
                            mode="append",
                            commit_properties=CommitProperties(app_transactions=fence, max_commit_retries=0),
                            post_commithook_properties=_HOOKS,
                        )
                    self._rows_since_compaction += 1
                    return
                except StaleVersionError:  # the log was cleaned under this store: read the table again
                    self._dt.update_incremental()
                    self._own = (
                        own_log_for(self.storage, self._dt, TABLE, track_files=True) if self._own is not None else None
                    )
                except CommitFailedError:  # (after its subclass above)
                    continue  # a concurrent commit: read the epoch again
                except (DeltaError, OSError, ValueError) as exc:  # ValueError: a log line that is not JSON
                    raise StorageUnavailableError(f"Could not save transactional id {tid!r}: {exc}") from exc
        raise StorageUnavailableError(f"Could not save transactional id {tid!r}: too many concurrent commits.")

    def compact(
        self, *, min_rows: int = 256, expire_before_ms: int | None = None, keep: frozenset[str] = frozenset()
    ) -> bool:
        """Rewrite the table to its latest row per id once `min_rows` were saved here since the last
        rewrite, dropping the ids idle (no transaction open or deciding, none in `keep`) since
        `expire_before_ms` (Kafka's transactional.id.expiration.ms: a producer of such an id starts
        anew). False when skipped, or when a concurrent save or claim won (the rewrite never drops
        one)."""
        with self._lock:
            if self._rows_since_compaction < min_rows or self._compacting:
                return False
            counted = self._rows_since_compaction
            own = self._own
            if own is None or own.changed or own.files is None or not system_table_configured(self._dt):
                return self._compact_through_delta_rs(counted, expire_before_ms, keep)
            try:
                own.catch_up()
            except (OSError, ValueError):
                return False
            read_version, paths = own.version, {f: os.path.join(own.table_dir, f) for f in own.files}
            # (files another gateway's rewrite removed are not read again: forget their rows)
            self._written = {f: row for f, row in self._written.items() if f in paths}
            cached = dict(self._written)
            self._compacting = True
        # Without the lock: saves go on meanwhile (measured: a rewrite held them up to 250 ms), and
        # their files, newer than every row read here, stay (`OwnLog.rewrite`).
        try:
            try:
                rows = self._rows_of(paths, cached)
                table = pa.Table.from_pylist(_kept(rows, expire_before_ms, keep), schema=SCHEMA)
                add = own.write_file(table, new_file_name(), _id_stats(table.column("transactional_id").to_pylist()))
            except (DeltaError, OSError):
                return False
            with self._lock:
                if self._own is not own:  # the table was read anew meanwhile: its files may differ
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(own.table_dir, add.path))
                    return False
                try:  # (a rewrite refused deletes its file)
                    own.rewrite(self.storage, self._dt.table_uri, add, read_version, set(paths))
                except (DeltaError, OSError):  # a concurrent rewrite or metadata change won
                    return False
                for f in paths:
                    self._written.pop(f, None)
                self._rows_since_compaction -= counted
                checkpoint = own.checkpoint()  # of the state the log's store follows, if it does
        finally:
            self._compacting = False
        uri = self._dt.table_uri
        if checkpoint is not None:  # without the lock
            try:
                checkpoint.write(own.log_dir)
            except (OSError, pa.ArrowException):  # delta-rs's, then
                checkpoint = None
        # delta-rs's checkpoint on a table object of its own (a load); refused, the rewrite stands
        # and the next one's checkpoint and cleanup follow
        with contextlib.suppress(DeltaError, OSError):
            self.storage.after_system_rewrite(
                uri,
                list(paths.values()),
                load=lambda: DeltaTable(uri, storage_options=self.storage.options()),
                checkpointed=checkpoint is not None,
            )
        return True

    def _compact_through_delta_rs(self, counted: int, expire_before_ms: int | None, keep: frozenset[str]) -> bool:
        """`compact` with the lock held throughout, through delta-rs: on an object store, and where
        the table lacks `system_table_config` (which this rewrite sets)."""
        try:
            self._dt.update_incremental()
            # every file is at the table's root: its name is its add action's path
            paths = {p.rpartition("/")[2]: p for p in (self.storage.fs_path(u) for u in self._dt.file_uris())}
            kept = _kept(self._rows_of(paths, self._written), expire_before_ms, keep)
            self.storage.rewrite_system_table(self._dt, pa.Table.from_pylist(kept, schema=SCHEMA))
        except (DeltaError, OSError):
            return False
        for f in paths:
            self._written.pop(f, None)
        self._rows_since_compaction -= counted
        if self._own is not None:  # from the rewrite's checkpoint: its own from now on
            with contextlib.suppress(DeltaError, OSError):
                self._dt.update_incremental()
                self._own = own_log_for(self.storage, self._dt, TABLE, track_files=True)
        return True

    def _rows_of(self, paths: Mapping[str, str], saved: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows of the table's files (`paths`: name -> path inside the storage's filesystem):
        from `saved` (this store's saves, kept in memory) where it has them, the others read."""
        unread = [p for f, p in paths.items() if f not in saved]
        return [*(saved[f] for f in paths if f in saved), *self.storage.read_data_files(unread, SCHEMA).to_pylist()]

    def load(self, transactional_id: str | None = None) -> dict[str, Saved]:
        """The latest saved state of each id (of `transactional_id` only, if given: read from the
        files whose statistics say they may hold it, so a gateway taking an id over reads its
        rows, not every id's saved since the last compaction).

        Raises: StorageUnavailableError."""
        with self._lock, translate_storage_errors():
            self._dt.update_incremental()
            files = None if transactional_id is None else _files_holding(self._dt, transactional_id)
            rows = self.storage.read_system_table(self._dt, SCHEMA, files=files).to_pylist()
        if transactional_id is not None:
            rows = [r for r in rows if r["transactional_id"] == transactional_id]
        return {tid: _saved(r) for tid, r in _newest(rows).items()}


# -- staging ------------------------------------------------------------------------------------
def _quote(name: str) -> str:
    """`name` as one part of a staged file's name: quoted, dots too (the parts' separator)."""
    return urllib.parse.quote(name, safe="").replace(".", "%2E")


#: the longest flat staged file name: its temporary name (`_put`) adds 37 bytes, and a file name
#: has 255 at most (ext4 and most file systems)
_FLAT_NAME_MAX = 200


def _staged_path(directory: str, flat: str, nested: str) -> str:
    """A staged file's path: flat in the producer's directory, or, where its name would be too long
    (a topic or group name of 190 bytes or so), in the nested directories earlier versions wrote
    (`records/<topic>/<partition>/<sequence>.arrow`, `offsets/<group>/<time>.json`)."""
    return f"{directory}/{flat}" if len(flat.encode()) <= _FLAT_NAME_MAX else f"{directory}/{nested}"


@dataclass(frozen=True, slots=True)
class StagedRecords:
    """One staged file of a transaction's records: a request's batches for one partition."""

    topic: str
    partition: int
    base_sequence: int
    path: str  # relative to the producer's staging directory
    size: int = 0  # its bytes, as listed (0: not known)


@dataclass(frozen=True, slots=True)
class StagedOffsets:
    group: str
    path: str


@dataclass(frozen=True, slots=True)
class Staged:
    records: tuple[StagedRecords, ...]
    offsets: tuple[StagedOffsets, ...]
    #: when the oldest of them was written (ms since the epoch; -1: none)
    oldest_ms: int = -1
    #: what AddPartitionsToTxn and AddOffsetsToTxn added (`record_added`), as paths to read
    added: tuple[str, ...] = ()


class TransactionStaging:
    """The staged records and offsets of transactions, by producer id and epoch (blocking I/O)."""

    def __init__(self, storage: StorageRoot) -> None:
        self.storage = storage
        self.fs, base = storage.filesystem()
        self.base = f"{base}/{SYSTEM_DIR}/{STAGED_DIR}"

    def _dir(self, transactional_id: str, producer_id: int, epoch: int, sealed: int | None = None) -> str:
        """The producer's staging: under its transactional id (hashed: any characters), so records
        staged under one id can never be landed by another id's transaction; `sealed`: its
        transaction of that number, once decided (`seal`)."""
        return f"{self.base}/{self.name(transactional_id, producer_id, epoch)}" + (
            "" if sealed is None else f".n{sealed}"
        )

    @staticmethod
    def name(transactional_id: str, producer_id: int, epoch: int) -> str:
        """The producer's staging directory, relative to the staging root (as `unsealed` lists it)."""
        tid = hashlib.blake2b(transactional_id.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
        return f"{tid}/{producer_id}.{epoch}"

    def unsealed(self) -> set[str]:
        """Every producer's staging not set apart under a decided transaction (`name`s): what open
        transactions, or decisions not carried out yet on an object store, staged. Raises:
        StorageUnavailableError."""
        with translate_storage_errors():
            ids = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
            out = set()
            for d in ids:
                if d.type != pafs.FileType.Directory:
                    continue
                for p in self.fs.get_file_info(pafs.FileSelector(d.path, allow_not_found=True)):
                    if p.type == pafs.FileType.Directory and ".n" not in p.base_name:
                        out.add(f"{d.base_name}/{p.base_name}")
            return out

    def seal(self, transactional_id: str, producer_id: int, epoch: int, number: int) -> int | None:
        """Set what the producer staged apart as its transaction `number` (decided), so that its
        next transaction stages afresh while this one lands: the number to read it by, or None
        where staging cannot be moved (an object store: read it where it is). Sealing again (a
        decision taken again after a crash) moves what was staged since into it. Raises:
        StorageUnavailableError."""
        if not self.storage.is_local:
            return None
        src, dst = (
            self._dir(transactional_id, producer_id, epoch),
            self._dir(transactional_id, producer_id, epoch, number),
        )
        with translate_storage_errors():
            try:
                os.rename(src, dst)
            except FileNotFoundError:  # nothing staged, or sealed before and nothing since
                pass
            except OSError:  # sealed before (a decision taken again): move in what came since
                for directory, _, files in os.walk(src):
                    for name in files:
                        rel = os.path.relpath(os.path.join(directory, name), src)
                        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
                        os.replace(os.path.join(src, rel), os.path.join(dst, rel))
                shutil.rmtree(src, ignore_errors=True)
        return number

    def _put(self, path: str, data: bytes, *, sync: bool) -> None:
        """Write `data` at `path` atomically (a reader sees all of it or nothing): on local disk
        beside it, renamed in (`sync`: the file and its directory fsynced); on an object store one
        PUT. Raises: StorageUnavailableError."""
        with translate_storage_errors():
            if not self.storage.is_local:
                with self.fs.open_output_stream(path) as out:
                    out.write(data)
                return
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"  # never listed (`staged`)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
            if sync:
                fd = os.open(os.path.dirname(path), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def write_records(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        topic: str,
        partition: int,
        base_sequence: int,
        batch: pa.Table,
        *,
        lane: str = "",
        sync: bool = True,
    ) -> None:
        """Keep one request's records of one partition until the transaction is decided; `lane`
        names a producer's sequence space when it has several (HTTP's Producer-Id), so two lanes'
        requests with one sequence do not take one name; `sync`: fsynced on local disk (a `log`
        topic's records). Raises: StorageUnavailableError."""
        sink = io.BytesIO()
        with ipc.new_stream(sink, batch.schema) as writer:
            writer.write_table(batch)
        suffix = f".{hashlib.blake2b(lane.encode(), digest_size=6).hexdigest()}" if lane else ""
        sequence = f"{base_sequence:010d}{suffix}.arrow"
        path = _staged_path(
            self._dir(transactional_id, producer_id, epoch),
            f"records.{_quote(topic)}.{partition}.{sequence}",
            f"records/{topic}/{partition}/{sequence}",
        )
        self._put(path, sink.getvalue(), sync=sync)

    def stage_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group: str, offsets: Sequence[Mapping[str, Any]]
    ) -> None:
        """Keep a TxnOffsetCommit's offsets until the transaction is decided (later ones win), as
        durable as the offsets table's own commits. Raises: StorageUnavailableError."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        path = _staged_path(
            self._dir(transactional_id, producer_id, epoch),
            f"offsets.{_quote(group)}.{name}",
            f"offsets/{_quote(group)}/{name}",
        )
        self._put(path, json.dumps(list(offsets), separators=(",", ":")).encode(), sync=False)

    def record_added(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Sequence[tuple[str, int]],
        groups: Sequence[str],
    ) -> None:
        """Keep what an AddPartitionsToTxn / AddOffsetsToTxn added to the producer's open
        transaction (as durable as a save of the state table), so that a gateway taking the id over
        finds the transaction open with them (`read_added`). Raises: StorageUnavailableError."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        path = f"{self._dir(transactional_id, producer_id, epoch)}/added.{name}"
        body = {"partitions": sorted([t, p] for t, p in partitions), "groups": sorted(groups)}
        self._put(path, json.dumps(body, separators=(",", ":")).encode(), sync=False)

    def read_added(
        self, transactional_id: str, producer_id: int, epoch: int, staged: Staged
    ) -> tuple[list[tuple[str, int]], list[str]]:
        """The partitions and groups `record_added` kept in `staged` (the producer's staging, as
        listed). Raises: StorageUnavailableError."""
        data = self._read(transactional_id, producer_id, epoch, staged.added, None) or []
        partitions: list[tuple[str, int]] = []
        groups: list[str] = []
        for d in data:
            body = json.loads(d)
            partitions += [(str(t), int(p)) for t, p in body["partitions"]]
            groups += [str(g) for g in body["groups"]]
        return partitions, groups

    def staged(self, transactional_id: str, producer_id: int, epoch: int, *, sealed: int | None = None) -> Staged:
        """Everything staged for the producer (`sealed`: for its transaction of that number), in
        the order it lands (by topic, partition, sequence; offsets by the time they were staged).
        Raises: StorageUnavailableError."""
        root = self._dir(transactional_id, producer_id, epoch, sealed)
        with translate_storage_errors():
            infos = self.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        # by (topic, partition, sequence and lane): one file a request, the flat one where a retry
        # of a request staged in directories (before an upgrade, unacked) wrote it again flat
        flat_records: dict[tuple[str, int, str], StagedRecords] = {}
        nested_records: dict[tuple[str, int, str], StagedRecords] = {}
        offsets: list[tuple[str, str, str]] = []  # group, name (from the time staged), path
        added: list[str] = []
        oldest = -1
        for info in infos:
            if info.type != pafs.FileType.File or info.path.endswith(".tmp"):
                continue
            written = (info.mtime_ns or time.time_ns()) // 1_000_000
            oldest = written if oldest < 0 else min(oldest, written)
            rel = info.path[len(root) + 1 :]
            parts = rel.split("/")
            if len(parts) == 1:  # records.<topic>.<partition>.<sequence>[.<lane>].arrow, offsets.<group>.<time>.json
                kind, _, rest = rel.partition(".")
                if kind == "records":
                    topic, partition, sequence = rest.split(".", 2)
                    name = urllib.parse.unquote(topic)
                    flat_records[(name, int(partition), sequence)] = StagedRecords(
                        name, int(partition), int(sequence.split(".")[0]), rel, info.size or 0
                    )
                elif kind == "offsets":
                    group, _, name = rest.partition(".")
                    offsets.append((urllib.parse.unquote(group), name, rel))
                elif kind == "added":
                    added.append(rel)
            elif parts[0] == "records" and len(parts) == 4:  # directories: a long name's, or an earlier version's
                nested_records[(parts[1], int(parts[2]), parts[3])] = StagedRecords(
                    parts[1], int(parts[2]), int(parts[3].split(".")[0]), rel, info.size or 0
                )
            elif parts[0] == "offsets" and len(parts) == 3:
                offsets.append((urllib.parse.unquote(parts[1]), parts[2], rel))
            elif parts[0] == "added" and len(parts) == 2:
                added.append(rel)
        records = [*flat_records.values(), *(r for k, r in nested_records.items() if k not in flat_records)]
        records.sort(key=lambda r: (r.topic, r.partition, r.base_sequence, r.path))
        offsets.sort()  # by group, then the time staged
        found = tuple(StagedOffsets(group, rel) for group, _, rel in offsets)
        return Staged(tuple(records), found, oldest, tuple(sorted(added)))

    def _read(
        self, transactional_id: str, producer_id: int, epoch: int, paths: Sequence[str], sealed: int | None
    ) -> list[bytes] | None:
        """The staged files' bytes; None when one is gone (the staging was dropped: a decision
        carried out before, its records landed). Raises: StorageUnavailableError."""
        root = self._dir(transactional_id, producer_id, epoch, sealed)
        out = []
        with translate_storage_errors():
            for path in paths:
                try:
                    with self.fs.open_input_stream(f"{root}/{path}") as f:
                        out.append(f.read())
                except FileNotFoundError:
                    return None
        return out

    def read_records(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        staged: Sequence[StagedRecords],
        *,
        sealed: int | None = None,
    ) -> list[pa.Table] | None:
        """The staged requests' records, in order; None when a file is gone (as `_read`)."""
        data = self._read(transactional_id, producer_id, epoch, [s.path for s in staged], sealed)
        return None if data is None else [ipc.open_stream(d).read_all() for d in data]

    def read_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        staged: Sequence[StagedOffsets],
        *,
        sealed: int | None = None,
    ) -> list[dict[str, Any]] | None:
        """The offsets staged, in order (a later commit of a partition after an earlier one); None
        when a file is gone (as `_read`)."""
        data = self._read(transactional_id, producer_id, epoch, [s.path for s in staged], sealed)
        if data is None:
            return None
        return [{"group": s.group, **o} for s, d in zip(staged, data, strict=True) for o in json.loads(d)]

    def holds_offsets(self, transactional_id: str, producer_id: int, epoch: int) -> bool:
        """Whether offsets staged by the producer under `epoch` are still kept (in its staging, or
        a transaction's sealed from it): not landed or dropped yet. Raises: StorageUnavailableError."""
        parent, _, name = self._dir(transactional_id, producer_id, epoch).rpartition("/")
        with translate_storage_errors():
            children = self.fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
            mine = [c.path for c in children if c.base_name == name or c.base_name.startswith(f"{name}.n")]
            return any(
                f.base_name == "offsets"
                or f.base_name.startswith("offsets.")  # (a directory: as earlier versions staged)
                for path in mine
                for f in self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            )

    def drop(self, transactional_id: str, producer_id: int, epoch: int, *, sealed: int | None = None) -> None:
        """Delete everything staged for the producer (`sealed`: for its transaction of that
        number). Raises: StorageUnavailableError."""
        with translate_storage_errors(), contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self._dir(transactional_id, producer_id, epoch, sealed))
