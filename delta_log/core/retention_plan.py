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
