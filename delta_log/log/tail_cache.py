"""Tail cache: the most recent committed records of each partition, contiguous by offset.

Fed by this process's writer (`add`, from its commit listener) so a consumer at the end of the log
is served from memory. Only committed data ever enters it: of a `log` topic, records durable in the
write-ahead log, which stay (`hold`) until `flushed` says the table has them, so readers see acks
at once and never lose sight of one. A gap (another writer appended in between) starts the
partition's tail again; above `max_bytes` per partition the oldest (flushed) batches go.

Concurrency contract: thread-safe (one lock per cache); tables are immutable Arrow tables.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from delta_log.core.records import CODEC_KEY, binary_offsets, partition_runs


@dataclass(slots=True)
class _Tail:
    first_offset: int = 0
    end_offset: int = 0  # exclusive
    tables: deque[tuple[int, pa.Table, int]] = field(default_factory=deque)  # (base offset, records, bytes)
    nbytes: int = 0


class TailCache:
    """Recent records per partition of one topic."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._tails: dict[int, _Tail] = {}
        #: a `log` topic's: partition -> the table's high watermark (batches below it may go)
        self._flushed: dict[int, int] | None = None

    def hold(self) -> None:
        """Keep every record until `flushed` says the table holds it (a `log` topic's tail)."""
        with self._lock:
            if self._flushed is None:
                self._flushed = {}

    def flushed(self, high_watermarks: dict[int, int]) -> None:
        with self._lock:
            if self._flushed is not None:
                for p, hw in high_watermarks.items():
                    self._flushed[p] = max(self._flushed.get(p, 0), hw)
                    tail = self._tails.get(p)
                    if tail is not None:
                        self._evict(p, tail)

    def _evict(self, partition: int, tail: _Tail) -> None:
        held = None if self._flushed is None else self._flushed.get(partition, 0)
        while tail.nbytes > self.max_bytes and len(tail.tables) > 1:
            base, old, nbytes = tail.tables[0]
            if held is not None and base + old.num_rows > held:
                return  # not in the table yet
            tail.tables.popleft()
            tail.nbytes -= nbytes
            tail.first_offset = tail.tables[0][0]

    def add(self, records: pa.Table, codecs: Mapping[int, str] | None = None) -> None:
        """Add committed records (TOPIC_SCHEMA, sorted by partition then offset); `codecs`:
        partition -> its producers' codec, kept as the partition's tables' `CODEC_KEY` metadata."""
        parts = records.column("partition").to_numpy()
        n = len(parts)
        if not n or (self.max_bytes <= 0 and self._flushed is None):
            return
        offsets = records.column("offset").to_numpy()
        runs = partition_runs(parts)
        sizes = _run_bytes(records, runs)
        with self._lock:
            for (p, s, e), nbytes in zip(runs, sizes, strict=True):
                piece = records.slice(s, e - s)
                if codecs and (codec := codecs.get(p, "none")) != "none":
                    piece = piece.replace_schema_metadata({CODEC_KEY: codec})
                base = int(offsets[s])
                tail = self._tails.get(p)
                if tail is None or tail.end_offset != base:
                    tail = self._tails[p] = _Tail(first_offset=base, end_offset=base)
                tail.tables.append((base, piece, nbytes))
                tail.end_offset = base + piece.num_rows
                tail.nbytes += nbytes
                self._evict(p, tail)

    def end_offset(self, partition: int) -> int:
        """One past the newest cached offset of `partition` (0 if none is cached)."""
        tail = self._tails.get(partition)
        return tail.end_offset if tail else 0

    def read(self, partition: int, offset: int, limit: int) -> pa.Table | None:
        """Up to `limit` records from `offset`, or None when the cache does not hold `offset`."""
        tail = self._tails.get(partition)
        if tail is None or not tail.first_offset <= offset < tail.end_offset:
            return None
        out: list[pa.Table] = []
        with self._lock:
            tables = list(tail.tables)
        for base, table, _ in tables:
            end = base + table.num_rows
            if end <= offset:
                continue
            start = max(offset - base, 0)
            take = min(table.num_rows - start, limit)
            out.append(table.slice(start, take))
            limit -= take
            offset = base + start + take
            if limit <= 0:
                break
        return pa.concat_tables(out) if out else None


def _run_bytes(records: pa.Table, runs: list[tuple[int, int, int]]) -> list[int]:
    """Each run's share of the records' buffers: its values' bytes (from the value column's
    offsets, when it is one chunk), and of the rest a share by its rows. A slice's exact `nbytes`
    cost 21 us a partition on the write-ahead thread, and released the GIL it then waited for
    again; by rows alone, a partition of large values beside one of small ones was under-counted."""
    n = records.num_rows
    total = records.get_total_buffer_size()
    values = records.column("value")
    if values.num_chunks != 1 or values.type != pa.binary():
        return [total * (e - s) // n for _, s, e in runs]
    ends = binary_offsets(values.chunk(0))
    value_bytes = [int(ends[e] - ends[s]) for _, s, e in runs]
    rest = max(total - int(ends[-1] - ends[0]), 0)
    return [v + rest * (e - s) // n for v, (_, s, e) in zip(value_bytes, runs, strict=True)]
