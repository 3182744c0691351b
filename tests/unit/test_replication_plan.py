"""plan_replication: copy by offset (whole segments or their tail), mirror retention, count what expired."""

from delta_log.core.replication_plan import plan_replication
from delta_log.core.segments import SegmentInfo


def seg(p, first, last, path=None):
    return SegmentInfo(path=path or f"p{p}-{first}", partition=p, first_offset=first, last_offset=last, size_bytes=10)


def test_first_run_copies_every_segment_whole():
    src = {0: [seg(0, 0, 9), seg(0, 10, 19)]}
    [plan] = plan_replication(1, src, {0: 20}, {}, {})
    assert [s.first_offset for s in plan.copy_whole] == [0, 10] and plan.copy_tail == [] and plan.remove == []
    assert plan.skipped_records == 0


def test_incremental_run_copies_only_newer_segments():
    src = {0: [seg(0, 0, 9), seg(0, 10, 19), seg(0, 20, 24)]}
    [plan] = plan_replication(1, src, {0: 25}, {0: [seg(0, 0, 9), seg(0, 10, 19)]}, {0: 20})
    assert [s.first_offset for s in plan.copy_whole] == [20] and plan.copy_tail == []


def test_a_segment_the_source_merged_across_the_replica_watermark_is_copied_from_its_tail():
    src = {0: [seg(0, 0, 24)]}  # the source rolled [0..9], [10..19] and [20..24] into one file
    [plan] = plan_replication(1, src, {0: 25}, {0: [seg(0, 0, 19)]}, {0: 20})
    assert plan.copy_whole == [] and [s.first_offset for s in plan.copy_tail] == [0]


def test_source_retention_is_mirrored_as_a_prefix_and_expired_unreplicated_records_are_counted():
    src = {0: [seg(0, 30, 39)]}
    replica = {0: [seg(0, 0, 9), seg(0, 10, 19)]}
    [plan] = plan_replication(1, src, {0: 40}, replica, {0: 20})
    assert [s.first_offset for s in plan.remove] == [0, 10]
    assert plan.skipped_records == 10  # offsets 20..29 expired before this run
    assert [s.first_offset for s in plan.copy_whole] == [30]


def test_up_to_date_partition_does_nothing():
    src = {0: [seg(0, 0, 9)], 1: []}
    plans = plan_replication(2, src, {0: 10, 1: 0}, {0: [seg(0, 0, 9)]}, {0: 10})
    assert all(not (p.copy_whole or p.copy_tail or p.remove or p.skipped_records) for p in plans)
