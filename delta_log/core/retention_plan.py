"""Retention planning (pure): which oldest segments of a partition to drop.

A PREFIX of a partition's segments, never a hole (invariant 7), by Kafka's rules: a segment goes
when its newest record is older than retention.ms, or while the partition without it is still at
least retention.bytes. Consumer-aware: records at or above the lowest committed offset of any
consumer group are counted as unconsumed, and kept when `protect_unconsumed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from delta_log.core.segments import SegmentInfo
from delta_log.errors import InvalidOffsetError


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRetention:
    partition: int
    remove: tuple[SegmentInfo, ...]
    log_start_offset: int  # after the removal
    unconsumed_records: int  # removed (or kept, when protected) records no group has consumed yet
    protected: bool  # stopped early to keep unconsumed records

    @property
    def records(self) -> int:
        return sum(s.records for s in self.remove)

    @property
    def bytes(self) -> int:
        return sum(s.size_bytes for s in self.remove)


def plan_retention(
    segments: Sequence[SegmentInfo],
    *,
    partition: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    high_watermark: int,
    lowest_committed: int | None = None,
    protect_unconsumed: bool = False,
) -> PartitionRetention:
    """Which oldest segments of one partition to drop (pure). -1 disables a limit, as in Kafka."""
    ordered = sorted(segments, key=lambda s: s.first_offset)
    total = sum(s.size_bytes for s in ordered)
    remove: list[SegmentInfo] = []
    unconsumed = 0
    protected = False
    for seg in ordered:
        expired = retention_ms >= 0 and seg.max_timestamp_ms < now_ms - retention_ms
        too_big = retention_bytes >= 0 and total - seg.size_bytes >= retention_bytes
        if not (expired or too_big):
            break
        if lowest_committed is not None and seg.last_offset >= lowest_committed:
            at_risk = seg.last_offset - max(seg.first_offset, lowest_committed) + 1
            if protect_unconsumed:
                unconsumed += at_risk
                protected = True
                break
            unconsumed += at_risk
        remove.append(seg)
        total -= seg.size_bytes
    rest = ordered[len(remove) :]
    lso = rest[0].first_offset if rest else high_watermark
    return PartitionRetention(
        partition=partition,
        remove=tuple(remove),
        log_start_offset=lso,
        unconsumed_records=unconsumed,
        protected=protected,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRecordsPlan:
    """Kafka's DeleteRecords on one partition: the segments wholly below the new log start offset
    go; the one that straddles it (if any) is rewritten with only its records at or above it."""

    remove: tuple[SegmentInfo, ...]
    straddling: SegmentInfo | None
    log_start_offset: int


def plan_delete_records(segments: Sequence[SegmentInfo], *, offset: int, high_watermark: int) -> DeleteRecordsPlan:
    """Delete the records of a partition below `offset` (-1: the high watermark). Pure.

    Raises: InvalidOffsetError (an offset above the high watermark, or below -1)."""
    target = high_watermark if offset == -1 else offset
    if not 0 <= target <= high_watermark:
        raise InvalidOffsetError(
            f"DeleteRecords offset {offset} is outside [0, {high_watermark}] (the high watermark); "
            "use -1 for everything written so far.",
            offset=offset,
            high_watermark=high_watermark,
        )
    ordered = sorted(segments, key=lambda s: s.first_offset)
    remove = tuple(s for s in ordered if s.last_offset < target)
    straddling = next((s for s in ordered if s.first_offset < target <= s.last_offset), None)
    return DeleteRecordsPlan(remove=remove, straddling=straddling, log_start_offset=target)
