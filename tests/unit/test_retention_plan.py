import pytest
from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.retention_plan import plan_retention
from delta_log.core.segments import SegmentInfo

NOW = 1_000_000


def segs(specs):
    out, off = [], 0
    for i, (records, size, ts) in enumerate(specs):
        out.append(
            SegmentInfo(
                path=f"f{i}",
                partition=0,
                first_offset=off,
                last_offset=off + records - 1,
                size_bytes=size,
                records=records,
                max_timestamp_ms=ts,
            )
        )
        off += records
    return out


def test_time_rule_removes_expired_prefix_only():
    s = segs([(10, 100, 10), (10, 100, 20), (10, 100, NOW), (10, 100, 30)])  # the last is old but after a new one
    p = plan_retention(s, partition=0, now_ms=NOW, retention_ms=1000, retention_bytes=-1, high_watermark=40)
    assert [x.path for x in p.remove] == ["f0", "f1"] and p.log_start_offset == 20


def test_bytes_rule_like_kafka():
    s = segs([(10, 100, NOW)] * 5)
    p = plan_retention(s, partition=0, now_ms=NOW, retention_ms=-1, retention_bytes=250, high_watermark=50)
    assert len(p.remove) == 2 and p.log_start_offset == 20  # 500 -> 400 -> 300; 300 - 100 < 250 stops


def test_everything_expired_leaves_log_start_at_high_watermark():
    s = segs([(10, 100, 1), (10, 100, 2)])
    p = plan_retention(s, partition=0, now_ms=NOW, retention_ms=10, retention_bytes=-1, high_watermark=20)
    assert len(p.remove) == 2 and p.log_start_offset == 20


def test_consumer_aware():
    s = segs([(10, 100, 1), (10, 100, 2), (10, 100, 3)])
    kw = dict(partition=0, now_ms=NOW, retention_ms=10, retention_bytes=-1, high_watermark=30, lowest_committed=15)
    reported = plan_retention(s, **kw)
    assert len(reported.remove) == 3 and reported.unconsumed_records == 15 and not reported.protected
    kept = plan_retention(s, **kw, protect_unconsumed=True)
    assert [x.path for x in kept.remove] == ["f0"] and kept.protected and kept.log_start_offset == 10


@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(1, 1000), st.integers(0, 2 * NOW)), max_size=30),
    st.integers(-1, NOW),
    st.integers(-1, 20_000),
    st.none() | st.integers(0, 2000),
    st.booleans(),
)
def test_always_a_prefix_and_never_a_hole(specs, retention_ms, retention_bytes, committed, protect):
    s = segs(specs)
    hw = sum(r for r, _, _ in specs)
    p = plan_retention(
        list(reversed(s)),
        partition=0,
        now_ms=NOW,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        high_watermark=hw,
        lowest_committed=committed,
        protect_unconsumed=protect,
    )
    assert [x.path for x in p.remove] == [x.path for x in s[: len(p.remove)]]  # a prefix, in order
    assert p.log_start_offset == (s[len(p.remove)].first_offset if len(p.remove) < len(s) else hw)
    for x in p.remove:
        assert (retention_ms >= 0 and x.max_timestamp_ms < NOW - retention_ms) or retention_bytes >= 0
    if protect and committed is not None:
        assert all(x.last_offset < committed for x in p.remove)  # nothing unconsumed goes


def test_unknown_timestamps_never_expire():
    # A file without timestamp statistics must not count as old (it used to read as epoch 0).
    s = [SegmentInfo(path="f0", partition=0, first_offset=0, last_offset=9, size_bytes=100, records=10)]
    p = plan_retention(s, partition=0, now_ms=NOW, retention_ms=10, retention_bytes=-1, high_watermark=10)
    assert p.remove == () and p.log_start_offset == 0


def test_delete_records_removes_the_segments_below_and_rewrites_the_one_that_straddles():
    from delta_log.core.retention_plan import plan_delete_records
    from delta_log.errors import InvalidOffsetError

    segs = [
        SegmentInfo(path=f"s{i}", partition=0, first_offset=i * 10, last_offset=i * 10 + 9, size_bytes=1)
        for i in range(3)
    ]
    plan = plan_delete_records(segs, offset=15, high_watermark=30)
    assert [s.path for s in plan.remove] == ["s0"] and plan.straddling.path == "s1" and plan.log_start_offset == 15
    plan = plan_delete_records(segs, offset=20, high_watermark=30)
    assert [s.path for s in plan.remove] == ["s0", "s1"] and plan.straddling is None
    everything = plan_delete_records(segs, offset=-1, high_watermark=30)
    assert len(everything.remove) == 3 and everything.log_start_offset == 30
    with pytest.raises(InvalidOffsetError):
        plan_delete_records(segs, offset=31, high_watermark=30)
