"""The write-ahead log of `log` topics (`topiclake.ack.mode=log`): where a produce is durable before
the topic's Delta table holds it.

Layout: `<root>/_wal/<gateway id>/<sequence>.wal`, one directory per gateway process. Each write is
one frame: magic, payload length, CRC32C (of the segment file's salt and the payload) and the salt
(8 random bytes drawn each time a file starts a segment), then an Arrow IPC stream of the records
it acks (TOPIC_SCHEMA, every topic and partition of that write together, offsets already assigned)
with the idempotent producers' ranges and each topic's Delta table id in its schema metadata. On local disk frames are written to a segment file and fsynced
(`os.fdatasync`) before the write returns; the segment rolls at `segment_bytes`, and starts again
over its own file (a new salt, from the first byte) once every record in it is in its table. On an
object store every write is one object (one PUT), durable when the PUT returns.

Reading (`decode_frames`) stops at the first torn or corrupt frame, or at a frame with another salt
than the file's first: a write that did not complete was never acked. A segment is released
once every record in it is in its topic's table durably (`in_tables`: on local disk after a `syncfs`
of the root that began once the table's commit was visible; delta-rs does not fsync a local table's
files). Local segment files are zero-filled to `segment_bytes` before frames go in (the next one on
a thread of its own, paced), so that no write's fdatasync extends a file. On local disk a released file is kept
(up to `_RECYCLED` of them, renamed `free-<n>` once its first header is zeroed: a crash before the
next segment's first frame leaves a file with no frame) and written over by a later segment, as
databases recycle their WAL files: writing into pages the page cache holds costs a tenth of the CPU of new
ones here (2.3 against 0.22 ms per MB, docs/BENCHMARKS.md), and an overwrite's fdatasync changes no
file size. What is left of the old content after the new frames carries the old salt, so no
reader takes it for this segment's (and no producer can forge a frame in it: a record's bytes
cannot know the salt, as SQLite's WAL salts its frames). All gateways of a root must read the frame
format they write: upgrade them together (docs/OPERATIONS.md).
Whoever replays a log (a restarted gateway, a gateway taking partitions over) reads every segment
of every gateway directory and keeps the records at or past each partition's table high watermark,
so a replay writes nothing twice.

Concurrency contract: one writer thread per WriteAheadLog (`append`); `in_tables` and `release` may
be called from other threads (a lock guards the segment bookkeeping). Segments are keyed by
(topic key, partition), the key naming one topic handle (`LogTopic.key`): a topic made again under
its name starts its offsets again.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from delta_log.core.histogram import Histogram
from delta_log.core.producer import ProducerSequence
from delta_log.table.storage import StorageRoot

log = logging.getLogger(__name__)

WAL_DIR = "_wal"
_MAGIC = b"TLW3"
_HEADER = struct.Struct(">4sII8s")  # magic, payload bytes, crc32c of (salt, payload), the file's salt
#: the same header with zlib's crc32: written before the CRC became crc32c (which the CPU computes:
#: 0.04 against 0.25 ms per MB, 3% of a `log` topic's gateway CPU at 1 KB records); still read
_ZLIB_MAGIC = b"TLW2"
_CRCS: dict[bytes, Callable[[Any, int], int]] = {_MAGIC: crc32c.crc32c, _ZLIB_MAGIC: zlib.crc32}
_OLD_MAGIC = b"TLW1"  # before recycling: no salt (such files are never recycled)
_OLD_HEADER = struct.Struct(">4sII")
#: released segment files kept for reuse per log (each up to segment_bytes on disk)
_RECYCLED = 2
#: the first segment file of a log is zero-filled up to this size before its first frame (later
#: ones are written ahead, paced, by the spare thread: `WriteAheadLog._spare_loop`)
_FIRST_FILE_BYTES = 4 * 1024 * 1024
#: a spare file is zero-filled in chunks this large, each fdatasynced, with a pause as long as the
#: chunk took after each: a burst of tens of MB queued on the disk would stall the acks' fdatasync
_SPARE_CHUNK = 1024 * 1024
#: a spare is written only for a segment that took this long to fill half way (`append`)
_SPARE_AFTER_S = 2.0
#: on local disk, the records the tables hold are made durable (one `syncfs`) at most this often
#: before the segments that held them are released (`WriteAheadLog.in_tables`)
RELEASE_SYNC_S = 1.0
#: the largest frame a reader accepts (a write is bounded by the writer's batch long before this)
MAX_FRAME_BYTES = 1 << 31
#: upper bounds (seconds) of the durable-write histogram (`WriteAheadLog.sync_histogram`)
SYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True, slots=True)
class ProducerRange:
    """An idempotent producer's request in a frame, for its txns when the frame is flushed."""

    topic: str
    partition: int
    producer_id: str
    sequence: int
    base_offset: int


@dataclass(frozen=True, slots=True)
class Frame:
    records: pa.Table  # TOPIC_SCHEMA, sorted by (topic, partition, offset)
    producers: tuple[ProducerRange, ...]
    #: topic -> the id of the Delta table the records were acked for (frames written before
    #: 2026-11-27 have none): a topic deleted and made again under its name has another
    tables: Mapping[str, str] = field(default_factory=dict)


#: given, so that a write does not read the environment for pyarrow's legacy-format default
_IPC_OPTIONS = pa.ipc.IpcWriteOptions()


def encode_frame(
    records: pa.Table, producers: list[ProducerRange], tables: Mapping[str, str] | None = None
) -> pa.Buffer:
    """One write's payload (WriteAheadLog.append frames it for its segment); `tables`: each
    topic's table id (`Frame.tables`)."""
    ranges = [[p.topic, p.partition, p.producer_id, p.sequence, p.base_offset] for p in producers]
    meta = {b"producers": json.dumps(ranges).encode()}
    if tables:
        meta[b"tables"] = json.dumps(tables).encode()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, records.schema.with_metadata(meta), options=_IPC_OPTIONS) as w:
        w.write_table(records)
    return sink.getvalue()


def frame_header(payload: pa.Buffer, salt: bytes) -> bytes:
    """The header of `payload`'s frame in a file whose segment drew `salt`."""
    return _HEADER.pack(_MAGIC, payload.size, crc32c.crc32c(payload, crc32c.crc32c(salt)), salt)


def decode_frames(data: bytes | pa.Buffer) -> Iterator[Frame]:
    """The complete frames of a segment file, in order. Stops at a torn or corrupt frame, and at a
    frame with another salt than the file's first (what is left of a recycled file's old content);
    a file that starts in today's format has no frame of the old one."""
    view = memoryview(data)
    pos = 0
    salt: bytes | None = None  # the file's, from its first frame (None: the old format)
    while pos + _OLD_HEADER.size <= len(view):
        magic = bytes(view[pos : pos + 4])
        if magic in _CRCS and (pos == 0 or salt is not None):
            if pos + _HEADER.size > len(view):
                return  # a torn header: never acked
            _, size, crc, frame_salt = _HEADER.unpack_from(view, pos)
            if salt is not None and frame_salt != salt:
                return  # an earlier life of a recycled file: its records were all in their tables
            salt, start, crc_of = frame_salt, pos + _HEADER.size, _CRCS[magic]
            seed = crc_of(frame_salt, 0)
        elif magic == _OLD_MAGIC and salt is None:
            _, size, crc = _OLD_HEADER.unpack_from(view, pos)
            start, seed, crc_of = pos + _OLD_HEADER.size, 0, zlib.crc32
        else:
            # the rest of a recycled file's old content (or damage): nothing acked is past here
            log.debug("write-ahead segment: no frame at byte %d; the rest is ignored", pos)
            return
        end = start + size
        if size > MAX_FRAME_BYTES or end > len(view) or crc_of(view[start:end], seed) != crc:
            if end < len(view) and salt is None:
                log.warning("write-ahead segment: a corrupt frame at byte %d; the rest is ignored", pos)
            return
        reader = pa.ipc.open_stream(pa.py_buffer(view[start:end]))
        records = reader.read_all()
        meta = reader.schema.metadata or {}
        raw = json.loads(meta.get(b"producers", b"[]"))
        producers = tuple(ProducerRange(str(t), int(p), str(pid), int(s), int(b)) for t, p, pid, s, b in raw)
        tables = {str(t): str(i) for t, i in json.loads(meta.get(b"tables", b"{}")).items()}
        yield Frame(records=records.replace_schema_metadata(None), producers=producers, tables=tables)
        pos = end


@dataclass(slots=True)
class _Segment:
    sequence: int
    path: str
    salt: bytes = field(default_factory=lambda: os.urandom(8))
    nbytes: int = 0
    #: (topic key, partition) -> one past the highest offset the segment holds
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    #: the file's zero-filled size: frames within it change no file size (0: a growing file)
    capacity: int = 0
    started: float = field(default_factory=time.monotonic)  # when its first frame came


class WriteAheadLog:
    """One gateway's write-ahead log under the storage root.

    Threads: the writer's (`append`); on local disk two of its own, started with it. `_sync_loop`
    releases segments once what their records' tables hold is on disk (`in_tables`); `_spare_loop`
    writes a zero-filled file ahead of the segment being written, so that a roll finds one and no
    ack's fdatasync extends a file."""

    def __init__(
        self, storage: StorageRoot, owner: str, *, segment_bytes: int = 64 * 1024 * 1024, spares: bool = True
    ) -> None:
        """`spares`: write files ahead of the segment (False: only released files are written over)."""
        self.storage = storage
        self.owner = owner
        self.segment_bytes = segment_bytes
        self.fs, base = storage.filesystem()
        self.dir = f"{base}/{WAL_DIR}/{owner}"
        self.local = storage.is_local
        if self.local:
            os.makedirs(self.dir, exist_ok=True)
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._next = 0
        #: the segment being written was all in its tables at this size (None: it was not): if no
        #: frame came since, the next write starts the segment again over the same file
        self._reuse_at: int | None = None
        self._fd: int | None = None
        self._free: list[str] = []  # zero-filled or released files to write over (local disk)
        self._freed = 0
        self.writes = 0
        self.bytes_written = 0
        #: the seconds each write took to be durable: every ack of a `log` topic waits for one, and
        #: a disk's stalls show here first
        self._syncs = Histogram(SYNC_BUCKETS)
        #: (topic key, partition) -> the table's high watermark, durable: what `release` is given
        self._durable: dict[tuple[str, int], int] = {}
        #: the same, visible in the tables but maybe not on disk yet (local disk): the next sync's
        self._visible: dict[tuple[str, int], int] = {}
        self._wake = threading.Condition()
        self._spare_wanted = False
        self._reports = self._settled = 0  # `in_tables` calls so far; of them, released
        self._closing = threading.Event()
        self.release_syncs = 0
        self._threads = (
            [
                threading.Thread(target=self._sync_loop, name="write-ahead-sync", daemon=True),
                threading.Thread(target=self._spare_loop, name="write-ahead-spare", daemon=True),
            ][: 2 if spares else 1]
            if self.local
            else []
        )
        for t in self._threads:
            t.start()

    # -- writing --------------------------------------------------------------------------------
    def append(self, payload: pa.Buffer, ends: Mapping[tuple[str, int], int]) -> None:
        """Write one frame (`encode_frame`'s payload) durably (fsynced, or PUT); `ends` says which
        offsets it holds, per (topic key, partition): one past the highest. Raises: OSError."""
        size = _HEADER.size + payload.size
        with self._lock:
            seg = self._current(size)
        pieces = [frame_header(payload, seg.salt), payload]
        start = time.perf_counter()
        if self.local:
            assert self._fd is not None
            if os.pwritev(self._fd, [memoryview(p) for p in pieces], seg.nbytes) != size:
                raise OSError(f"write-ahead segment {seg.path}: a short write")
            os.fdatasync(self._fd)
        else:
            with self.fs.open_output_stream(seg.path) as out:
                for p in pieces:
                    out.write(p)
        seconds = time.perf_counter() - start
        with self._lock:
            seg.nbytes += size
            for key, end in ends.items():
                seg.ends[key] = max(seg.ends.get(key, 0), end)
            self._syncs.observe(seconds)
            self.writes += 1
            # half way through the segment and no file to roll to: the spare thread writes one,
            # unless the log fills segments fast (its writes are large: a file extended under them
            # costs little beside them, and zero-filling spares would add a third of the log's
            # disk writes at 100 MB/s)
            want = (
                len(self._threads) > 1
                and not self._free
                and seg.nbytes * 2 >= (seg.capacity or self.segment_bytes)
                and time.monotonic() - seg.started >= _SPARE_AFTER_S
            )
        self.bytes_written += size
        if want and not self._spare_wanted:
            with self._wake:
                self._spare_wanted = True
                self._wake.notify_all()

    def sync_histogram(self) -> Histogram:
        """The seconds of each durable write so far (its `pwritev` and `fdatasync`, or its PUT)."""
        with self._lock:
            return self._syncs.copy()

    def _current(self, size: int) -> _Segment:
        """The segment the next frame goes to (a new one per write on an object store)."""
        seg = self._segments[-1] if self._segments else None
        reuse, self._reuse_at = self._reuse_at, None
        if seg is not None and self.local and self._fd is not None:  # (no fd: the last roll failed)
            if reuse is not None and reuse == seg.nbytes:
                # Every record in it is in its table and no frame came since: start the segment
                # again from the file's first byte, under a new salt (what is left of the old
                # frames is no frame of the new one: `decode_frames`). No rename, no new file, no
                # directory fsync; and the file grows only past its largest cycle, so the writes'
                # fdatasync changes no file size and commits no filesystem journal (a growing
                # file's did, at 500 small acks/s: tens to hundreds of ms, docs/BENCHMARKS.md).
                seg.salt, seg.nbytes, seg.ends, seg.started = os.urandom(8), 0, {}, time.monotonic()
                return seg
            end = seg.nbytes + size
            if seg.nbytes == 0 or end <= seg.capacity or (end <= self.segment_bytes and not self._free):
                return seg  # within its zero-filled bytes; or it grows, with no file written ahead
        seq, self._next = self._next, self._next + 1
        seg = _Segment(sequence=seq, path=f"{self.dir}/{seq:020d}.wal")
        if self.local:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None  # until the next file is open: a failure here leaves no stale fd
            fd = self._open_segment(seg.path, first=seq == 0)
            try:
                seg.capacity = os.fstat(fd).st_size
                _fsync_dir(self.dir)  # the new file's name is durable too
            except OSError:
                os.close(fd)  # no segment is written at another's position: the next write rolls again
                raise
            self._fd = fd
        self._segments.append(seg)
        return seg

    def _open_segment(self, path: str, *, first: bool) -> int:
        """A zero-filled or released file renamed to `path`, written over from its start (no
        O_APPEND, no truncation); else a new file, zero-filled first when it is the log's first.
        Raises: OSError."""
        while self._free:
            free = self._free.pop()
            try:
                os.rename(free, path)
                return os.open(path, os.O_WRONLY)
            except OSError as exc:  # gone meanwhile: the next one, or a new file
                log.debug("write-ahead: cannot reuse %s: %s", free, exc)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)  # written at each frame's position
        if first:
            try:
                _zero_fill(fd, min(self.segment_bytes, _FIRST_FILE_BYTES))
            except OSError:
                os.close(fd)
                raise
        return fd

    # -- releasing ------------------------------------------------------------------------------
    def in_tables(self, high_watermarks: Mapping[tuple[str, int], int]) -> None:
        """The tables now hold these records (per (topic key, partition): below the offset), as
        a reader sees them. On an object store that is durable (each commit is a PUT): the
        segments that held only them are released at once. On local disk the table's new files
        and log entry may still be in the page cache: they are released after the next `syncfs`
        of the root, at most `RELEASE_SYNC_S` from now (a power loss would otherwise take acked
        records from both the table and the log)."""
        if not high_watermarks:
            return
        if not self.local:
            self._release_durable(high_watermarks)
            return
        with self._wake:
            _merge(self._visible, high_watermarks)
            self._reports += 1
            self._wake.notify_all()

    def settle(self, timeout: float) -> bool:
        """Wait until what `in_tables` was told so far is released (or kept, when a segment holds
        records not yet in their tables); False at the timeout."""
        deadline = time.monotonic() + timeout
        with self._wake:
            target = self._reports
            while self._settled < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        return True

    def _sync_loop(self) -> None:
        last = float("-inf")
        while True:
            with self._wake:
                while not self._visible and not self._closing.is_set():
                    self._wake.wait()
                while not self._closing.is_set() and (left := last + RELEASE_SYNC_S - time.monotonic()) > 0:
                    self._wake.wait(left)
                if self._closing.is_set():
                    return
                visible, self._visible = self._visible, {}
                reports = self._reports
            last = time.monotonic()
            try:
                sync_filesystem(self.dir)  # everything committed before this call is on disk after it
                self.release_syncs += 1
                self._release_durable(visible)
            except Exception as exc:  # the thread must go on: what was not released is kept
                log.warning("write-ahead: syncing the root or releasing segments failed (%s); they are kept", exc)
                with self._wake:
                    _merge(self._visible, visible)
                continue
            with self._wake:
                self._settled = reports
                self._wake.notify_all()

    def _release_durable(self, high_watermarks: Mapping[tuple[str, int], int]) -> None:
        """The tables hold these records durably: release what no longer needs the log."""
        with self._lock:
            _merge(self._durable, high_watermarks)
            durable = dict(self._durable)
        self.release(durable)

    def release(self, flushed: Mapping[tuple[str, int], int]) -> int:
        """Delete the segments (but the one being written) whose every record is in its table,
        durably: `flushed` holds each (topic key, partition)'s table high watermark (missing:
        nothing flushed since this log began). Returns how many segments went."""
        with self._lock:
            # (a segment with no byte yet is being written: on an object store its PUT may be
            # running, its `ends` not filled in yet)
            written = [s for s in (self._segments[:-1] if self.local else self._segments) if s.nbytes]
            gone = [s for s in written if all(flushed.get(k, -1) >= end for k, end in s.ends.items())]
            for s in gone:
                self._segments.remove(s)
            current = self._segments[-1] if self.local and self._segments else None
            if current is not None and current.nbytes and all(flushed.get(k, -1) >= e for k, e in current.ends.items()):
                self._reuse_at = current.nbytes  # so the log stays about as large as what its tables lack
            # forget what no segment holds (a topic closed, or deleted and made again under its
            # name: its next frames' offsets are released by its next flushes)
            held = {k for s in self._segments for k in s.ends}
            self._durable = {k: v for k, v in self._durable.items() if k in held}
        for s in gone:
            try:
                if self.local and self._keep(s.path):
                    continue
                self.fs.delete_file(s.path)
            except (OSError, FileNotFoundError):
                log.warning("could not delete write-ahead segment %s; it is replayed harmlessly", s.path)
        return len(gone)

    def _keep(self, path: str) -> bool:
        """Keep a released segment file for a later segment to write over (`free-<n>`: no reader
        lists it); False when enough are kept, or the file is under half a segment (it would roll
        early, or grow). Raises: OSError."""
        with self._lock:
            if len(self._free) >= _RECYCLED:
                return False
            free = self._free_path_locked()
        fd = os.open(path, os.O_WRONLY)
        try:  # its first frame is no frame any more (its salt would be taken for the next segment's)
            if os.fstat(fd).st_size * 2 < self.segment_bytes:
                return False
            os.pwrite(fd, bytes(_HEADER.size), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.rename(path, free)
        with self._lock:
            self._free.append(free)
        return True

    def _free_path_locked(self) -> str:
        """A new name for a file to be written over (`free-<n>`: no reader lists it)."""
        self._freed += 1
        return f"{self.dir}/free-{self._freed}"

    def _spare_loop(self) -> None:
        while True:
            with self._wake:
                while not self._spare_wanted and not self._closing.is_set():
                    self._wake.wait()
                if self._closing.is_set():
                    return
            with self._lock:
                path = self._free_path_locked()
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    done = _zero_fill(fd, self.segment_bytes, paced=self._closing)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("write-ahead: could not write a spare segment file (%s); segments grow instead", exc)
                done = False
            with self._lock:
                if done:
                    self._free.append(path)
            if not done:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                self._closing.wait(1.0)  # (a full disk: not again at once)
            with self._wake:
                self._spare_wanted = False

    def pending_bytes(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._segments)

    def close(self) -> None:
        self._closing.set()
        with self._wake:
            self._wake.notify_all()
        for t in self._threads:
            t.join(10)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _merge(into: dict[tuple[str, int], int], high_watermarks: Mapping[tuple[str, int], int]) -> None:
    for key, hw in high_watermarks.items():
        into[key] = max(into.get(key, 0), hw)


def _zero_fill(fd: int, size: int, *, paced: threading.Event | None = None) -> bool:
    """Write zeros over the file's first `size` bytes and make them durable; `paced`: in
    `_SPARE_CHUNK`s with a pause as long as each took, stopping (False) once the event is set."""
    zeros = memoryview(bytes(min(size, _SPARE_CHUNK)))
    pos = 0
    while pos < size:
        n = min(len(zeros), size - pos)
        start = time.monotonic()
        os.pwrite(fd, zeros[:n], pos)
        pos += n
        if paced is not None:
            os.fdatasync(fd)
            if paced.wait(time.monotonic() - start):
                return False
    os.fsync(fd)
    return True


try:  # Linux's; elsewhere `sync_filesystem` syncs every filesystem
    _syncfs: Any = ctypes.CDLL(None, use_errno=True).syncfs
except (OSError, AttributeError, TypeError):
    _syncfs = None


def sync_filesystem(path: str) -> None:
    """Write the page cache of the filesystem that holds `path` to disk (Linux's `syncfs`; `sync`
    elsewhere). Raises: OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _syncfs is None:
            os.sync()
        elif _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- replay -------------------------------------------------------------------------------------
def log_dirs(storage: StorageRoot) -> list[str]:
    """Every gateway's write-ahead directory under the root (full filesystem paths)."""
    fs, base = storage.filesystem()
    root = f"{base}/{WAL_DIR}"
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError:
        return []
    return sorted(i.path for i in infos if i.type == pafs.FileType.Directory)


def read_dir(storage: StorageRoot, path: str) -> Iterator[tuple[str, Frame]]:
    """(segment path, frame) of one gateway's log, oldest first."""
    fs, _ = storage.filesystem()
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    for info in sorted((i for i in infos if i.path.endswith(".wal")), key=lambda i: i.path):
        try:
            with fs.open_input_file(info.path) as f:
                data = f.read_buffer()
        except (OSError, FileNotFoundError):
            continue  # released meanwhile: its records are in the table
        for frame in decode_frames(data):
            yield info.path, frame


def delete_dir(storage: StorageRoot, path: str) -> None:
    fs, _ = storage.filesystem()
    try:
        fs.delete_dir(path)
    except (OSError, FileNotFoundError):
        log.warning("could not delete write-ahead directory %s", path)


def collect(
    storage: StorageRoot,
    *,
    skip: Callable[[str], bool],
    topic: str | None = None,
    table_id: Callable[[str], str | None] = lambda topic: None,
) -> tuple[dict[str, list[pa.Table]], dict[str, list[tuple[ProducerSequence, int, int]]], list[str]]:
    """Every write-ahead record under the root (of `topic` only, if given), per topic in log order,
    with the producers' ranges; and the directories read. `skip(name)`: a directory not to read.
    `table_id(topic)`: the id of the topic's table now (None: unknown); records acked for another
    table of that name (deleted since, and made again) are left out."""
    records: dict[str, list[pa.Table]] = {}
    producers: dict[str, list[tuple[ProducerSequence, int, int]]] = {}
    ids: dict[str, str | None] = {}

    def current(name: str, frame: Frame) -> bool:
        if name not in frame.tables:
            return True  # (a frame from before the ids)
        if name not in ids:
            ids[name] = table_id(name)
        if ids[name] is None or ids[name] == frame.tables[name]:
            return True
        log.info("write-ahead replay: records of topic %s acked for a table deleted since are left out", name)
        return False

    dirs = [d for d in log_dirs(storage) if not skip(d.rsplit("/", 1)[-1])]
    for d in dirs:
        for _path, frame in read_dir(storage, d):
            names = frame.records.column("topic").unique().to_pylist()
            kept = {
                name for name in (names if topic is None else [topic] if topic in names else []) if current(name, frame)
            }
            for name in kept:
                records.setdefault(name, []).append(frame.records.filter(pc.equal(frame.records["topic"], name)))
            for r in frame.producers:
                if r.topic in kept:
                    seq = ProducerSequence(producer_id=r.producer_id, sequence=r.sequence)
                    producers.setdefault(r.topic, []).append((seq, r.partition, r.base_offset))
    return records, producers, dirs


def latest_per_offset(tables: list[pa.Table]) -> pa.Table:
    """The records sorted by (partition, offset), an offset written twice kept as written last (a
    write whose ack was withheld, its offsets then given to the next write)."""
    records = pa.concat_tables(tables)
    parts, offsets = records.column("partition").to_numpy(), records.column("offset").to_numpy()
    order = np.lexsort((np.arange(len(parts)), offsets, parts))
    p, o = parts[order], offsets[order]
    last = np.concatenate([(p[1:] != p[:-1]) | (o[1:] != o[:-1]), [True]]) if len(order) else np.zeros(0, bool)
    return records.take(pa.array(order[last]))


def read_topic(
    storage: StorageRoot, topic: str, *, skip: Callable[[str], bool], table_id: str | None = None
) -> tuple[list[pa.Table], list[tuple[ProducerSequence, int, int]]]:
    """`topic`'s records in every write-ahead log under the root (but the directories `skip`
    names), in log order, with its producers' ranges; only those acked for the table `table_id`
    (when given)."""
    records, producers, _ = collect(storage, skip=skip, topic=topic, table_id=lambda name: table_id)
    return records.get(topic, []), producers.get(topic, [])
