"""Tail cache: the most recent committed records of each partition, contiguous by offset.

Fed by this process's writer (`add`, from its commit listener) so a consumer at the end of the log
is served from memory. Only committed data ever enters it. A gap (another writer appended in
between) starts the partition's tail again; above `max_bytes` per partition the oldest batches go.

Concurrency contract: thread-safe (one lock per cache); tables are immutable Arrow tables.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa


@dataclass(slots=True)
class _Tail:
    first_offset: int = 0
    end_offset: int = 0  # exclusive
    tables: deque[tuple[int, pa.Table]] = field(default_factory=deque)
    nbytes: int = 0


class TailCache:
    """Recent records per partition of one topic."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._tails: dict[int, _Tail] = {}

    def add(self, records: pa.Table) -> None:
        """Add committed records (TOPIC_SCHEMA, sorted by partition then offset)."""
        parts = records.column("partition").to_numpy()
        if not len(parts) or self.max_bytes <= 0:
            return
        starts = np.flatnonzero(np.concatenate([[True], parts[1:] != parts[:-1]]))
        ends = np.concatenate([starts[1:], [len(parts)]])
        with self._lock:
            for s, e in zip(starts, ends, strict=True):
                p = int(parts[s])
                piece = records.slice(int(s), int(e - s))
                base = int(piece.column("offset")[0].as_py())
                tail = self._tails.get(p)
                if tail is None or tail.end_offset != base:
                    tail = self._tails[p] = _Tail(first_offset=base, end_offset=base)
                tail.tables.append((base, piece))
                tail.end_offset = base + piece.num_rows
                tail.nbytes += piece.nbytes
                while tail.nbytes > self.max_bytes and len(tail.tables) > 1:
                    _, old = tail.tables.popleft()
                    tail.nbytes -= old.nbytes
                    tail.first_offset = tail.tables[0][0]

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
        for base, table in tables:
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
