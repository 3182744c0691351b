"""Segments: a topic table's data files as seen through the Delta snapshot's add actions.

Pure: the adapter (delta_log.table.segment_files.segments_of) hands in the add actions. One parser
for everyone who needs them (reader index, roll-up, retention, compaction), so a file
whose statistics are missing is treated the same everywhere: an unknown newest timestamp is
UNKNOWN_TIMESTAMP_MS, which no retention deadline reaches and no timestamp lookup skips.
"""

from __future__ import annotations

import datetime as dt_
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa

#: An unknown newest timestamp: never "expired", never skipped when looking up a time.
UNKNOWN_TIMESTAMP_MS = 2**62

#: path -> (first offset, last offset, newest timestamp in ms or None), read from the file itself.
StatsFallback = Callable[[str], tuple[int, int, int | None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentInfo:
    """One data file of one partition."""

    path: str
    partition: int
    first_offset: int
    last_offset: int
    size_bytes: int
    records: int = 0
    max_timestamp_ms: int = UNKNOWN_TIMESTAMP_MS


def epoch_ms(value: object) -> int | None:
    """A stats timestamp (datetime, or epoch microseconds from parquet) in epoch ms; None if unknown."""
    if value is None:
        return None
    if isinstance(value, dt_.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt_.UTC)
        return int(value.timestamp() * 1000)
    if isinstance(value, int):
        return value // 1000
    return None


def parse_add_actions(
    actions: pa.Table, *, stats_fallback: StatsFallback | None = None
) -> dict[int, list[SegmentInfo]]:
    """Every data file of a topic table by partition, from its snapshot's flattened add actions.

    Files without offset statistics are read with `stats_fallback`, or left out without one
    (planners leave such files alone).
    """
    out: dict[int, list[SegmentInfo]] = {}
    if not actions.num_rows:
        return out
    names = ["path", "size_bytes", "min.offset", "max.offset", "partition.partition", "num_records", "max.timestamp"]
    cols = actions.select([n for n in names if n in actions.column_names]).to_pydict()
    n = actions.num_rows
    for path, size, lo, hi, part, records, max_ts in zip(
        cols["path"],
        cols["size_bytes"],
        cols["min.offset"],
        cols["max.offset"],
        cols["partition.partition"],
        cols.get("num_records", [0] * n),
        cols.get("max.timestamp", [None] * n),
        strict=True,
    ):
        seg = _segment(path, int(part), size, lo, hi, records, epoch_ms(max_ts), stats_fallback)
        if seg is not None:
            out.setdefault(seg.partition, []).append(seg)
    return out


def _segment(
    path: str,
    partition: int,
    size: object,
    lo: object,
    hi: object,
    records: object,
    max_timestamp_ms: int | None,
    stats_fallback: StatsFallback | None,
) -> SegmentInfo | None:
    """One file's segment from its statistics; without offset statistics, from `stats_fallback`
    (None without one)."""
    if lo is None or hi is None:
        if stats_fallback is None:
            return None
        lo, hi, max_timestamp_ms = stats_fallback(path)
    return SegmentInfo(
        path=path,
        partition=partition,
        first_offset=int(lo),  # type: ignore[call-overload]
        last_offset=int(hi),  # type: ignore[call-overload]
        size_bytes=int(size or 0),  # type: ignore[call-overload]
        records=int(records or 0),  # type: ignore[call-overload]
        max_timestamp_ms=max_timestamp_ms if max_timestamp_ms is not None else UNKNOWN_TIMESTAMP_MS,
    )


def segment_of_add(add: Mapping[str, object], stats_fallback: StatsFallback | None = None) -> SegmentInfo | None:
    """The segment an `add` action of a commit entry describes (the JSON object, as in the Delta
    log), as `parse_add_actions` reads it from a snapshot; None for a file outside any partition, or
    without offset statistics and no `stats_fallback`.

    Raises: ValueError for statistics this parser cannot read (the caller reads the snapshot instead)."""
    values = add.get("partitionValues")
    part = values.get("partition") if isinstance(values, Mapping) else None
    if part is None:
        return None
    raw = add.get("stats")
    stats = json.loads(raw) if isinstance(raw, str) and raw else {}
    lows, highs = stats.get("minValues") or {}, stats.get("maxValues") or {}
    return _segment(
        str(add["path"]),
        int(part),
        add.get("size"),
        lows.get("offset"),
        highs.get("offset"),
        stats.get("numRecords"),
        _stats_timestamp_ms(highs.get("timestamp")),
        stats_fallback,
    )


def _stats_timestamp_ms(value: object) -> int | None:
    """A timestamp in Delta's JSON stats (ISO 8601: "2026-11-26T19:04:57.123Z", or with an offset,
    as Spark writes) in epoch ms, floored as the snapshot's are. Raises: ValueError."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"timestamp statistic {value!r} is not a string")
    return epoch_ms(dt_.datetime.fromisoformat(value))
