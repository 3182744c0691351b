"""Storage root adapter: table locations, opening Delta tables, translating delta-rs errors.

Concurrency contract: nothing here caches state (but the files system tables' rewrites replaced,
which are deleted later: `_Replaced`); each call opens or lists what it needs.
`<root>` is a local folder (embedded mode) or an object-store URI.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from delta_log.core.log_cleanup_plan import LogFile, plan_log_cleanup
from delta_log.errors import StorageUnavailableError, TopiclakeError, TopicNotFoundError

#: a system table's rewrite (its compaction) keeps this many log versions at least, and its log
#: entries and the files it replaced for its `history_s`: 10 s (as a topic's log cleanup), or an
#: hour for the offsets table, whose time travel (a group's lag history) reaches back that far
SYSTEM_LOG_KEEP_VERSIONS = 1000
SYSTEM_LOG_MIN_AGE_S = 10.0
#: system tables take a version and a file a save, and their rewrites remove them all: a
#: checkpoint every 1000 versions, and remove actions (tombstones) kept in checkpoints for as long
#: as the table's history needs them (`system_table_config`), not Delta's week. Measured at 150
#: saves a second with Delta's defaults: after four minutes, 35,000 tombstones, a 2.3 MB checkpoint
#: taking 330 ms and a load 140 ms, every 100 versions (bench/system_table_bench.py).
SYSTEM_CHECKPOINT_INTERVAL = "1000"
#: a rewrite lists the table (a full vacuum of what no version references and is an hour old)
#: the first time in a process and every this many times after: the files replaced by a process
#: that died before deleting them, or whose tombstones expired before a vacuum saw them
FULL_VACUUM_EVERY = 64
#: a table whose history reaches back this far has its replaced files deleted by Delta's vacuum
#: (from their tombstones); under it, by the process that rewrote (`_Replaced`)
VACUUMED_HISTORY_S = 3600.0


def _keep_s(history_s: float | None) -> float:
    return SYSTEM_LOG_MIN_AGE_S if history_s is None else history_s


def system_table_configured(dt: DeltaTable, history_s: float | None = None) -> bool:
    """Whether system table `dt` has `system_table_config`'s properties (`history_s` None: the
    default history, SYSTEM_LOG_MIN_AGE_S)."""
    configuration = dt.metadata().configuration
    return all(configuration.get(k) == v for k, v in system_table_config(_keep_s(history_s)).items())


def system_table_config(history_s: float) -> dict[str, str]:
    """The table properties of a system table whose time travel reaches back `history_s`: its
    tombstones live twice as long where vacuum deletes the replaced files (an hour and more, the
    offsets table), as long where the rewriting process does (seconds; 10 at least)."""
    tombstones_s = max(10, round(history_s * 2 if history_s >= VACUUMED_HISTORY_S else history_s))
    return {
        "delta.checkpointInterval": SYSTEM_CHECKPOINT_INTERVAL,
        "delta.deletedFileRetentionDuration": f"interval {tombstones_s} seconds",
    }


TOPICS_DIR = "topics"
SYSTEM_DIR = "_system"
LATEST_DIR = "latest"  # upsert tables: <root>/latest/<topic> (delta_log.maintenance.upsert)


def _is_uri(root: str) -> bool:
    return "://" in root and not root.startswith("file://")


def _path_of(uri: str) -> str:
    """The path of an object-store URI inside its filesystem: `s3://bucket/a/b` -> `bucket/a/b`.
    (Not `FileSystem.from_uri`, which builds a filesystem, and for S3 asks AWS for the bucket's region.)"""
    return uri.split("://", 1)[1].rstrip("/")


def storage_option(options: Mapping[str, str], *names: str) -> str | None:
    """A storage option by any of its names, in any case (delta-rs accepts both)."""
    upper = {k.upper(): v for k, v in options.items()}
    return next((upper[n] for n in names if upper.get(n)), None)


@functools.lru_cache(maxsize=16)
def _s3_filesystem(options: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem configured from the same storage options delta-rs gets (endpoint,
    region, credentials, plain http), so both see one bucket the same way."""
    opts = dict(options)
    # delayed open: a small file is one PutObject at close, not a multipart upload (create, part,
    # complete) after a HEAD of the bucket: measured 1 request per data file instead of 4
    kwargs: dict[str, object] = {
        "allow_bucket_creation": False,
        "allow_bucket_deletion": False,
        "allow_delayed_open": True,
    }
    endpoint = storage_option(opts, "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT")
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
        kwargs["scheme"] = parsed.scheme
    region = storage_option(opts, "AWS_REGION", "AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    key, secret = storage_option(opts, "AWS_ACCESS_KEY_ID"), storage_option(opts, "AWS_SECRET_ACCESS_KEY")
    if key and secret:
        kwargs.update(access_key=key, secret_key=secret, session_token=storage_option(opts, "AWS_SESSION_TOKEN"))
    return pafs.S3FileSystem(**kwargs)


@dataclass(frozen=True, slots=True)
class StorageRoot:
    """Where a topiclake deployment keeps its tables."""

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _is_uri(self.root):
            local = self.root.removeprefix("file://")
            object.__setattr__(self, "root", os.path.abspath(local))

    @property
    def is_local(self) -> bool:
        return not _is_uri(self.root)

    def topic_uri(self, topic: str) -> str:
        return f"{self.root}/{TOPICS_DIR}/{topic}"

    def latest_uri(self, topic: str) -> str:
        """The upsert table of `topic` (its latest value per key)."""
        return f"{self.root}/{LATEST_DIR}/{topic}"

    def system_uri(self, name: str) -> str:
        return f"{self.root}/{SYSTEM_DIR}/{name}"

    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) or None

    @property
    def is_s3(self) -> bool:
        return self.root.startswith(("s3://", "s3a://"))

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem (configured from `storage_options`) and the root path inside it."""
        if self.is_local:
            return pafs.LocalFileSystem(), self.root
        if self.is_s3:
            return _s3_filesystem(tuple(sorted(self.storage_options.items()))), _path_of(self.root)
        fs, path = pafs.FileSystem.from_uri(self.root)
        return fs, path

    def fs_path(self, uri: str) -> str:
        """The path of a table or file URI under this root inside `filesystem()`."""
        if self.is_local:
            return uri.removeprefix("file://")
        return _path_of(uri)

    def file_path(self, table_uri: str, relative: str) -> str:
        """Path of a data file (an add action's `path`) inside `filesystem()`."""
        rel = unquote(relative)
        if "://" in rel:
            return self.fs_path(rel)
        return f"{self.fs_path(table_uri)}/{rel}"

    def read_log_entries(self, table_uri: str, versions: range) -> list[str] | None:
        """The JSON commit entries of `versions` of a table, in order; None if any is gone (log
        cleanup) or unreadable, so the caller falls back to the table API."""
        fs, _ = self.filesystem()
        base = self.fs_path(table_uri)
        out = []
        try:
            for v in versions:
                with fs.open_input_stream(f"{base}/_delta_log/{v:020d}.json") as f:
                    out.append(f.read().decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            return None
        return out

    def touch_marker(self, name: str) -> None:
        """Rewrite `_system/markers/<name>` with a new random value: a cheap "something changed"
        that other processes read (`read_marker`) instead of listing or opening tables."""
        fs, base = self.filesystem()
        with translate_storage_errors():
            fs.create_dir(f"{base}/{SYSTEM_DIR}/markers", recursive=True)
            with fs.open_output_stream(f"{base}/{SYSTEM_DIR}/markers/{name}") as out:
                out.write(uuid.uuid4().hex.encode())

    def read_marker(self, name: str) -> str:
        """The marker's value ("" when never written)."""
        fs, base = self.filesystem()
        try:
            with fs.open_input_stream(f"{base}/{SYSTEM_DIR}/markers/{name}") as f:
                return f.read().decode("ascii", "replace")
        except (FileNotFoundError, OSError):
            return ""

    def list_dirs(self, under: str) -> list[str]:
        fs, base = self.filesystem()
        selector = pafs.FileSelector(f"{base}/{under}", allow_not_found=True)
        with translate_storage_errors():
            infos = fs.get_file_info(selector)
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def delete_dir(self, uri: str) -> None:
        fs, _ = self.filesystem()
        with translate_storage_errors():
            fs.delete_dir(self.fs_path(uri))

    def is_table(self, uri: str) -> bool:
        with translate_storage_errors():
            return DeltaTable.is_deltatable(uri, storage_options=self.options())

    def open_or_create_system_table(self, name: str, schema: pa.Schema) -> DeltaTable:
        """`<root>/_system/<name>`, created on first use (concurrent creators both succeed).

        Raises: StorageUnavailableError.
        """
        uri = self.system_uri(name)
        with translate_storage_errors():
            try:
                return DeltaTable(uri, storage_options=self.options())
            except TableNotFoundError:
                try:
                    return DeltaTable.create(
                        uri,
                        schema,
                        mode="ignore",
                        name=name,
                        configuration={"delta.checkpointInterval": "100"},
                        storage_options=self.options(),
                    )
                except DeltaError:  # created concurrently by another process
                    return DeltaTable(uri, storage_options=self.options())

    def read_system_table(self, dt: DeltaTable, schema: pa.Schema, *, files: Sequence[str] | None = None) -> pa.Table:
        """All rows of a small system table (of its `files` only, if given: add actions' paths),
        read file by file with pyarrow.

        Not `DeltaTable.to_pyarrow_table()`: its dataset scan leaves threads that abort the
        interpreter at exit ("terminate called without an active exception", delta-rs #2184);
        measured here in 12 of 15 short-lived job processes.
        """
        if files is None:
            return self.read_data_files([self.fs_path(u) for u in dt.file_uris()], schema)
        return self.read_data_files([self.file_path(dt.table_uri, f) for f in files], schema)

    def read_data_files(self, paths: Sequence[str], schema: pa.Schema) -> pa.Table:
        """The rows of data files (paths inside `filesystem()`), read with pyarrow. Data files never
        change, so no table object (nor its store's lock) is needed to read them."""
        fs, _ = self.filesystem()
        pieces = [_read_file(fs, p, schema) for p in paths]
        return pa.concat_tables(pieces) if pieces else schema.empty_table()

    def rewrite_system_table(self, dt: DeltaTable, table: pa.Table, *, history_s: float | None = None) -> None:
        """Replace a system table's rows with `table` and checkpoint it; then delete the files it
        replaced and its log entries but the newest SYSTEM_LOG_KEEP_VERSIONS versions, once older
        than `history_s` (how far back its time travel must reach). A system table takes a
        version and a file a save, and delta-rs lists the log on every load and checkpoint: at
        150 transactions a second, 36,000 entries in four minutes.

        `history_s` None: SYSTEM_LOG_MIN_AGE_S. Under an hour, the replaced files are deleted by
        this process (`_Replaced`); from an hour, by a vacuum of those replaced over an hour ago.
        The table gets `system_table_config` first where it lacks it, and a full vacuum now and
        then (FULL_VACUUM_EVERY).

        No internal retry: the rewrite loses to any commit that lands meanwhile (delta-rs raises
        CommitFailedError), so a concurrent append is never dropped. Raises: DeltaError, OSError.
        """
        from deltalake import CommitProperties, PostCommitHookProperties, write_deltalake

        if not system_table_configured(dt, history_s):
            dt.alter.set_table_properties(system_table_config(_keep_s(history_s)), raise_if_not_exists=False)
        replaced = [self.fs_path(u) for u in dt.file_uris()]
        write_deltalake(
            dt,
            table,
            mode="overwrite",
            commit_properties=CommitProperties(max_commit_retries=0),
            post_commithook_properties=PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False),
        )
        self.after_system_rewrite(dt.table_uri, replaced, load=lambda: dt, history_s=history_s)

    def after_system_rewrite(
        self,
        table_uri: str,
        replaced: Sequence[str],
        *,
        load: Callable[[], DeltaTable],
        history_s: float | None = None,
        checkpointed: bool = False,
    ) -> None:
        """What follows a rewrite of a system table (`rewrite_system_table`, or a store's own, see
        delta_log.system.own_log): checkpoint the table (at the rewrite's version or after; not
        where `checkpointed`, by a store that writes its own), delete the files it `replaced`
        (paths inside `filesystem()`) and its old log entries, as `rewrite_system_table` says.
        `load`: the table, loaded only for a checkpoint or a vacuum. Raises: DeltaError, OSError."""
        keep_s = _keep_s(history_s)
        # of the rewrite, its few files: what a load starts from once the log is cleaned. Skipped
        # when its listing raced a concurrent commit (delta-kernel: "Expected contiguous commit
        # files"): the rewrite stands, and the next one's or the interval's checkpoint follows.
        dt = None if checkpointed else load()
        if dt is not None:
            with contextlib.suppress(DeltaError):
                dt.create_checkpoint()
        vacuumed = keep_s >= VACUUMED_HISTORY_S
        vacuum_h = max(1, math.ceil(keep_s / 3600))
        due, full = _REPLACED.add(table_uri, [] if vacuumed else list(replaced), keep_s)
        fs, _ = self.filesystem()
        for path in due:
            with contextlib.suppress(OSError):  # gone already (a full vacuum)
                fs.delete_file(path)
        if vacuumed or full:
            dt = dt or load()
            if vacuumed:  # the files replaced over vacuum_h hours ago, from their tombstones
                dt.vacuum(retention_hours=vacuum_h, enforce_retention_duration=False, dry_run=False)
            if full:  # unreferenced (tombstones expired, or never committed) and vacuum_h hours old
                dt.vacuum(retention_hours=vacuum_h, enforce_retention_duration=False, dry_run=False, full=True)
        self.cleanup_log(table_uri, keep_versions=SYSTEM_LOG_KEEP_VERSIONS, min_age_s=keep_s)

    def cleanup_log(self, table_uri: str, *, keep_versions: int, min_age_s: float) -> int:
        """Delete the table's log files `plan_log_cleanup` allows (delta_log.maintenance.log_cleanup
        says why); how many went."""
        fs, _ = self.filesystem()
        base = self.fs_path(table_uri)
        infos = fs.get_file_info(pafs.FileSelector(f"{base}/_delta_log", allow_not_found=True))
        files = [
            LogFile(i.base_name, i.mtime.timestamp() if i.mtime else 0.0) for i in infos if i.type == pafs.FileType.File
        ]
        doomed = plan_log_cleanup(files, keep_versions=keep_versions, min_age_s=min_age_s, now_s=time.time())
        for name in doomed:
            with contextlib.suppress(OSError):  # someone else cleaned it
                fs.delete_file(f"{base}/_delta_log/{name}")
        return len(doomed)

    def open_table(self, uri: str) -> DeltaTable:
        """Raises: TableNotFoundError (deltalake's) if absent; StorageUnavailableError on I/O."""
        with translate_storage_errors(passthrough=(TableNotFoundError,)):
            return DeltaTable(uri, storage_options=self.options())

    def open_topic(self, topic: str) -> DeltaTable:
        """The topic's table at its latest version. Raises: TopicNotFoundError, StorageUnavailableError."""
        try:
            return self.open_table(self.topic_uri(topic))
        except TableNotFoundError as exc:
            raise TopicNotFoundError(topic) from exc


@contextmanager
def translate_storage_errors(passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn I/O failures from delta-rs or pyarrow into StorageUnavailableError."""
    try:
        yield
    except TopiclakeError:
        raise
    except passthrough:
        raise
    except (DeltaError, OSError) as exc:
        raise StorageUnavailableError(f"Storage is unavailable: {exc}") from exc


def _read_file(fs: pafs.FileSystem, path: str, schema: pa.Schema) -> pa.Table:
    """One file of a system table as `schema`: read as it is when it was written with it (a
    quarter of `pq.read_table`'s time, measured 0.4 against 2.0 ms a one-row file; a compaction
    reads every file), otherwise through a dataset that fills the columns added since."""
    with fs.open_input_file(path) as f:
        table = pq.ParquetFile(f).read()
    if table.schema.equals(schema):
        return table
    return pq.read_table(path, filesystem=fs, schema=schema)


class _Replaced:
    """The files each system table's rewrites replaced in this process, deleted once the table's
    `history_s` passed (a reader still holding the snapshot before a rewrite reads them meanwhile)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, collections.deque[tuple[float, list[str]]]] = {}
        self._rewrites: collections.Counter[str] = collections.Counter()

    def add(self, uri: str, paths: list[str], keep_s: float) -> tuple[list[str], bool]:
        """Note a rewrite of `uri` that replaced `paths`: the paths now due for deletion, and
        whether a full vacuum is (the first rewrite here, and every FULL_VACUUM_EVERY after)."""
        now = time.monotonic()
        with self._lock:
            pending = self._pending.setdefault(uri, collections.deque())
            pending.append((now, paths))
            due: list[str] = []
            while pending and now - pending[0][0] >= keep_s:
                due += pending.popleft()[1]
            self._rewrites[uri] += 1
            return due, self._rewrites[uri] % FULL_VACUUM_EVERY == 1


_REPLACED = _Replaced()
