"""Compaction planning and key-compaction filtering (pure).

- Merge: maximal runs of >= 2 ADJACENT segments (by offset) whose total stays under a target size.
- Key compaction (Kafka's log cleaner): keep the latest record of each key; a tombstone that is the
  latest for its key is kept until it is older than delete.retention.ms; records without a key stay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from delta_log.core.segments import SegmentInfo


def plan_merge(segments: Sequence[SegmentInfo], *, target_bytes: int) -> list[tuple[SegmentInfo, ...]]:
    """Maximal runs of >= 2 adjacent segments whose total size stays <= target_bytes (pure)."""
    ordered = sorted(segments, key=lambda s: s.first_offset)
    runs: list[tuple[SegmentInfo, ...]] = []
    current: list[SegmentInfo] = []
    size = 0
    for seg in ordered:
        if current and size + seg.size_bytes > target_bytes:
            if len(current) >= 2:
                runs.append(tuple(current))
            current, size = [], 0
        if seg.size_bytes >= target_bytes:
            continue
        current.append(seg)
        size += seg.size_bytes
    if len(current) >= 2:
        runs.append(tuple(current))
    return runs


def latest_offsets(keys: Sequence[bytes | None], offsets: Sequence[int]) -> dict[bytes, int]:
    """Highest offset of every non-null key (pure)."""
    latest: dict[bytes, int] = {}
    for k, o in zip(keys, offsets, strict=True):
        if k is not None and o > latest.get(k, -1):
            latest[k] = o
    return latest


def surviving_rows(table: pa.Table, latest: Mapping[bytes, int], *, now_ms: int, delete_retention_ms: int) -> pa.Table:
    """Rows of `table` that key compaction keeps (pure)."""
    keys = table.column("key").to_pylist()
    offsets = table.column("offset").to_pylist()
    values_null = pc.is_null(table.column("value")).to_pylist()
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    keep = np.zeros(table.num_rows, dtype=bool)
    horizon_us = (now_ms - delete_retention_ms) * 1000
    for i, (k, o) in enumerate(zip(keys, offsets, strict=True)):
        if k is None:
            keep[i] = True
        elif latest.get(k) == o:
            keep[i] = not (values_null[i] and ts[i] is not None and ts[i] < horizon_us)
    return table.filter(pa.array(keep))
