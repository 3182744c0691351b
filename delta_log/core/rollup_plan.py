"""Segment roll-up planning (pure): which runs of small adjacent segments to merge.

Size-tiered, like an LSM. Only segments below `base_bytes` take part (larger ones are the Spark
compaction job's), and among them one tier per factor of `fanout`: tier 0 just below `base_bytes`,
tier 1 below base/fanout, and so on down. A run is `fanout` or more ADJACENT segments (by offset)
of one tier, up to `RUN_FACTOR` x fanout of them, whose merged size stays under `max_bytes`. Its
result lands in a tier of larger segments (fanout segments of a tier add up to the next), so a
byte is rewritten about once per tier between the size it was written at and `base_bytes`:
log_fanout(base / commit size) times.

Tiers below the base matter for small commits. Were every size below it one tier, a merged file
and the small ones after it would share it, and each pass would rewrite the growing file with a
few new ones. Simulated over 1,000 passes of 32 commits (tests/unit/test_rollup_plan.py checks
the bound), a byte is rewritten 3.5 times for 100 B and 1 KB commits against 500 and 65 that
way, 2.0 times for 25 KB (a 100-record transaction's partition) against 4.4.
"""

from __future__ import annotations

from collections.abc import Sequence

from delta_log.core.segments import SegmentInfo

#: a run merges up to this many times `fanout` segments: a pass after `rollup_every_commits` (32)
#: commits finds up to 32 new small segments a partition, merged into one file, not four
RUN_FACTOR = 4


def size_tier(size_bytes: int, *, base_bytes: int, fanout: int) -> int:
    """A segment's tier: -1 at `base_bytes` or more (never rolled up); below it 0 for sizes of at
    least base/fanout, 1 for at least base/fanout**2, and so on (integers: no rounding at a
    boundary)."""
    if size_bytes >= base_bytes:
        return -1
    tier, scaled = 0, max(size_bytes, 1) * fanout
    while scaled < base_bytes:
        tier += 1
        scaled *= fanout
    return tier


def plan_rollup(
    segments: Sequence[SegmentInfo], *, fanout: int, base_bytes: int, max_bytes: int
) -> list[tuple[SegmentInfo, ...]]:
    """Runs of `fanout` to RUN_FACTOR x `fanout` adjacent segments of one partition and one tier
    below `base_bytes` to merge (pure).

    Only segments below `base_bytes` are merged (measured: re-merging ~1 MB flush files took 44% of
    the server's busy time under Arrow load); larger ones are the Spark compaction job's.
    `segments` are one partition's files in any order; runs never overlap; a run's merged size is
    <= `max_bytes`.
    """
    ordered = sorted(segments, key=lambda s: s.first_offset)
    tiers = [size_tier(s.size_bytes, base_bytes=base_bytes, fanout=fanout) for s in ordered]
    longest = fanout * RUN_FACTOR
    runs: list[tuple[SegmentInfo, ...]] = []
    i = 0
    while i + fanout <= len(ordered):
        end, size = i, 0
        while (
            end < len(ordered)
            and end - i < longest
            and tiers[end] == tiers[i] >= 0
            and size + ordered[end].size_bytes <= max_bytes
        ):
            size += ordered[end].size_bytes
            end += 1
        if end - i >= fanout:
            runs.append(tuple(ordered[i:end]))
            i = end
        else:
            i += 1
    return runs
