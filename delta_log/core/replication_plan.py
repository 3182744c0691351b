"""Replication planning (pure): per partition, which source segments to copy and which replica
segments to drop, by offset (the replica's high watermark says how far it was copied)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from delta_log.core.segments import SegmentInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionCopy:
    """What one run does to one partition of the replica."""

    partition: int
    source_hw: int
    replica_hw: int
    copy_whole: list[SegmentInfo] = field(default_factory=list)
    copy_tail: list[SegmentInfo] = field(default_factory=list)  # copy records >= replica_hw only
    remove: list[SegmentInfo] = field(default_factory=list)  # below the source's log start offset
    skipped_records: int = 0  # removed by the source's retention before they were replicated


def plan_replication(
    partitions: int,
    source_segments: Mapping[int, list[SegmentInfo]],
    source_hw: Mapping[int, int],
    replica_segments: Mapping[int, list[SegmentInfo]],
    replica_hw: Mapping[int, int],
) -> list[PartitionCopy]:
    """Per partition: which source segments to copy (whole or their tail) and which replica
    segments to drop to mirror the source's retention. Pure."""
    plans = []
    for p in range(partitions):
        src = sorted(source_segments.get(p, []), key=lambda s: s.first_offset)
        hw_src, hw_rep = source_hw.get(p, 0), replica_hw.get(p, 0)
        log_start = src[0].first_offset if src else hw_src
        whole = [s for s in src if s.first_offset >= hw_rep]
        tail = [s for s in src if s.first_offset < hw_rep <= s.last_offset]
        remove = [s for s in replica_segments.get(p, []) if s.last_offset < log_start]
        plans.append(
            PartitionCopy(
                partition=p,
                source_hw=hw_src,
                replica_hw=hw_rep,
                copy_whole=whole,
                copy_tail=tail,
                remove=remove,
                skipped_records=max(0, log_start - hw_rep) if hw_src > hw_rep else 0,
            )
        )
    return plans
