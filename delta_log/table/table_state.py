"""A plain table's state followed through its log by its writer, and written as its checkpoint.

delta-rs writes a checkpoint by loading the table: it reads back every log entry since the last
checkpoint, twice (its load, then its checkpoint). Measured on `_system/transactions`, rewritten
every 256 saves: 0.3 ms an entry, 150 ms a rewrite, as much CPU as the saves themselves. A store
that commits its own log entries (delta_log.system.own_log) already reads each entry once as it
follows the log, so it keeps the state a checkpoint holds (`TableState`: protocol, metadata, app
transactions, files, tombstones) and writes the checkpoint from it in a few ms.

What is written is Delta's classic single-file checkpoint (PROTOCOL.md, "Checkpoints"): one action
a row, in the columns and types of the checkpoint the table already has (delta-rs's, so every
reader that read that one reads this), then `_last_checkpoint`. Tombstones older than the table's
`delta.deletedFileRetentionDuration` are left out, as delta-rs leaves them. A state is read
(`TableState.read`) from the latest classic checkpoint and the entries after it; a table with none,
or with a multi-part or V2 checkpoint, is not followed (None: delta-rs checkpoints it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from delta_log.table.log_entries import entries_from

LAST_CHECKPOINT = "_last_checkpoint"
#: held while `_last_checkpoint` is read and replaced
_POINTING = threading.Lock()
#: the actions a state keeps: what a plain table's checkpoint holds
_FOLLOWED = ("protocol", "metaData", "txn", "add", "remove")
_DEFAULT_TOMBSTONE_RETENTION_MS = 7 * 24 * 3600 * 1000  # Delta's default: a week
_UNIT_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}


def interval_ms(value: str | None, default: int) -> int:
    """A Delta interval property ("interval 10 seconds", "interval 1 hours") in ms."""
    m = re.fullmatch(r"\s*interval\s+(\d+)\s+([a-z]+?)s?\s*", (value or "").lower())
    if m is None or m.group(2) not in _UNIT_MS:
        return default
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def _as_json(value: Any, type_: pa.DataType) -> Any:
    """An Arrow value (as `to_pylist` gives it) in the form a log entry's JSON has it."""
    if value is None:
        return None
    if pa.types.is_struct(type_):
        out = {}
        for field in type_:
            if (v := _as_json(value.get(field.name), field.type)) is not None:
                out[field.name] = v
        return out
    if pa.types.is_map(type_):
        return {k: v for k, v in value}
    return value


def _last_checkpoint(log_dir: str) -> dict[str, Any] | None:
    """What `_last_checkpoint` says (None: no such file). Raises: OSError, ValueError."""
    try:
        with open(os.path.join(log_dir, LAST_CHECKPOINT), encoding="utf-8") as f:
            return dict(json.load(f))
    except FileNotFoundError:
        return None


def _last_version(log_dir: str) -> int:
    """The version `_last_checkpoint` names (-1: none, or unreadable)."""
    try:
        last = _last_checkpoint(log_dir)
        return -1 if last is None else int(last["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


class TableState:
    """A table's actions at `version`, as a checkpoint holds them, each in its log-entry JSON form."""

    def __init__(self, version: int, schema: pa.Schema) -> None:
        self.version = version
        self.schema = schema  # the checkpoint's columns, as the table's latest one has them
        self.protocol: dict[str, Any] | None = None
        self.metadata: dict[str, Any] | None = None
        self.txns: dict[str, dict[str, Any]] = {}
        self.adds: dict[str, dict[str, Any]] = {}  # by path, unquoted
        self.removes: dict[str, dict[str, Any]] = {}

    @classmethod
    def read(cls, log_dir: str, version: int) -> TableState | None:
        """The state at `version` (which must be in the log): from the latest classic checkpoint
        at or before it, then its entries. None: no such checkpoint (delta-rs checkpoints the
        table), or one this module does not read (multi-part, V2). Raises: OSError, ValueError."""
        if (last := _last_checkpoint(log_dir)) is None:
            return None
        at = int(last["version"])
        if at > version or last.get("parts") or "v2Checkpoint" in last:
            return None
        path = os.path.join(log_dir, f"{at:020d}.checkpoint.parquet")
        try:
            table = pq.read_table(path)
        except FileNotFoundError:
            return None
        kinds = [k for k in _FOLLOWED if k in table.column_names]
        if any(table.column(k).null_count < table.num_rows for k in table.column_names if k not in _FOLLOWED):
            return None  # actions this module does not keep (domain metadata, sidecars, V2's)
        state = cls(at, table.schema)
        for kind in kinds:
            column = table.column(kind)
            type_ = column.type
            for value in column.to_pylist():
                if value is not None:
                    state._apply_action(kind, _as_json(value, type_))
        if state.protocol is None or state.metadata is None:
            return None
        state.apply(entries_from(log_dir, at + 1, limit=version - at))
        return state if state.version == version else None

    def apply(self, entries: Iterable[str]) -> None:
        """Follow commit entries, each the version after `version`."""
        for entry in entries:
            for line in entry.splitlines():
                if line.strip():
                    for kind, action in json.loads(line).items():
                        self._apply_action(kind, action)
            self.version += 1

    def _apply_action(self, kind: str, action: dict[str, Any]) -> None:
        if kind == "add":
            path = unquote(action["path"])
            self.adds[path] = action
            self.removes.pop(path, None)
        elif kind == "remove":
            path = unquote(action["path"])
            self.adds.pop(path, None)
            self.removes[path] = action
        elif kind == "txn":
            self.txns[action["appId"]] = action
        elif kind == "metaData":
            self.metadata = action
        elif kind == "protocol":
            self.protocol = action

    @property
    def files(self) -> set[str]:
        return set(self.adds)

    def checkpoint(self, now_ms: int) -> Checkpoint:
        """The checkpoint of `version` (its rows: the actions are shared, never changed after).
        Tombstones past retention are forgotten."""
        assert self.protocol is not None and self.metadata is not None
        retention = interval_ms(
            (self.metadata.get("configuration") or {}).get("delta.deletedFileRetentionDuration"),
            _DEFAULT_TOMBSTONE_RETENTION_MS,
        )
        self.removes = {p: r for p, r in self.removes.items() if r.get("deletionTimestamp", 0) >= now_ms - retention}
        rows: list[dict[str, Any]] = [{"protocol": self.protocol}, {"metaData": self.metadata}]
        rows += [{"txn": t} for t in self.txns.values()]
        rows += [{"add": a} for a in self.adds.values()]
        rows += [{"remove": r} for r in self.removes.values()]
        return Checkpoint(self.version, rows, self.schema, len(self.adds))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    version: int
    rows: list[dict[str, Any]]
    schema: pa.Schema
    adds: int

    def write(self, log_dir: str) -> None:
        """Write it and point `_last_checkpoint` at it, unless that names a newer one (both renamed
        into place: a reader sees all of either or nothing). A checkpoint of its version already
        there is left as it is. Raises: OSError."""
        path = os.path.join(log_dir, f"{self.version:020d}.checkpoint.parquet")
        if os.path.exists(path):
            return
        table = pa.Table.from_pylist(self.rows, schema=self.schema)
        tmp = os.path.join(log_dir, f"_checkpoint_{uuid.uuid4().hex}.parquet.tmp")
        try:
            pq.write_table(table, tmp, compression="snappy")
            with contextlib.suppress(FileExistsError):  # another writer's, of the same state
                os.link(tmp, path)
            last = {
                "version": self.version,
                "size": table.num_rows,
                "sizeInBytes": os.path.getsize(tmp),
                "numOfAddFiles": self.adds,
            }
            with open(tmp + ".last", "w", encoding="utf-8") as f:
                json.dump(last, f)
            with _POINTING:  # never back to an older one (two of this process's writers)
                if _last_version(log_dir) < self.version:
                    os.replace(tmp + ".last", os.path.join(log_dir, LAST_CHECKPOINT))
        finally:
            for name in (tmp, tmp + ".last"):
                with contextlib.suppress(OSError):
                    os.unlink(name)
