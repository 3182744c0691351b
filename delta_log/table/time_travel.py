"""Delta time travel over a table's history: the table as it was at given times.

I/O adapter (delta-rs). Used where the past is the question: a group's lag over time is its
committed offsets (the offsets table) against the topics' high watermarks (their `hw-<p>` txns),
both as of the same moments.
"""

from __future__ import annotations

import datetime as dt_
from collections.abc import Iterator, Sequence
from typing import Literal

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from delta_log.table.app_transactions import read_high_watermarks

State = Literal["before", "loaded", "gone"]


def travel(dt: DeltaTable, times_ms: Sequence[int]) -> Iterator[State]:
    """Load `dt` as of each of `times_ms` in turn (the last version committed at or before it) and
    say how that went: "loaded" (read `dt` now), "before" (earlier than the table's creation: it
    held nothing yet), or "gone" (delta-rs could not load it: the log no longer reaches back that
    far, or it could not be read). Each costs one snapshot load, whatever the table's age."""
    try:
        created: int | None = dt.metadata().created_time
    except DeltaError:
        created = None
    for at_ms in times_ms:
        if created is not None and at_ms < created:
            yield "before"
            continue
        try:
            dt.load_as_version(dt_.datetime.fromtimestamp(at_ms / 1000, dt_.UTC))
        except (DeltaError, OSError, ValueError):
            yield "gone"
            continue
        yield "loaded"


def high_watermark_history(dt: DeltaTable, partitions: int, times_ms: Sequence[int]) -> list[dict[int, int] | None]:
    """A topic table's high watermark per partition at each of `times_ms` (None: unknown then)."""
    return [
        read_high_watermarks(dt, partitions) if state == "loaded" else ({} if state == "before" else None)
        for state in travel(dt, times_ms)
    ]


#: commitInfo keys of a topic writer's commits: the records and file bytes each appended
THROUGHPUT_RECORDS = "topiclake.records"
THROUGHPUT_BYTES = "topiclake.bytes"


def appended_history(dt: DeltaTable, commits: int) -> list[tuple[int, int, int]]:
    """(commit time ms, records, bytes) of the table's last `commits` commits that say what they
    appended (a topic writer's), oldest first. Roll-ups, compactions and config changes append
    nothing new and are left out."""
    try:
        history = dt.history(commits)
    except DeltaError:
        return []
    out = []
    for h in history:
        records = h.get(THROUGHPUT_RECORDS)
        if records is not None and "timestamp" in h:
            out.append((int(h["timestamp"]), int(records), int(h.get(THROUGHPUT_BYTES, 0))))
    return sorted(out)
