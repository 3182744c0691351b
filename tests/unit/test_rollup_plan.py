from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.rollup_plan import plan_rollup, size_tier
from delta_log.core.segments import SegmentInfo


def segs(sizes):
    out, off = [], 0
    for i, size in enumerate(sizes):
        out.append(SegmentInfo(path=f"f{i}", partition=0, first_offset=off, last_offset=off + 9, size_bytes=size))
        off += 10
    return out


def test_tiers():
    assert size_tier(10, base_bytes=100, fanout=8) == 0
    assert size_tier(100, base_bytes=100, fanout=8) == 1
    assert size_tier(799, base_bytes=100, fanout=8) == 1
    assert size_tier(800, base_bytes=100, fanout=8) == 2


def test_merges_runs_of_fanout_small_segments():
    runs = plan_rollup(segs([10] * 17), fanout=8, base_bytes=100, max_bytes=10_000)
    assert [[s.path for s in r] for r in runs] == [[f"f{i}" for i in range(8)], [f"f{i}" for i in range(8, 16)]]


def test_respects_max_bytes_and_tiers():
    assert plan_rollup(segs([10] * 8), fanout=8, base_bytes=100, max_bytes=79) == []
    # a big segment in the middle breaks adjacency of the small ones
    assert plan_rollup(segs([10] * 4 + [5000] + [10] * 4), fanout=8, base_bytes=100, max_bytes=10**6) == []


@given(st.lists(st.integers(1, 5000), max_size=80), st.integers(2, 10))
def test_runs_are_adjacent_disjoint_and_bounded(sizes, fanout):
    segments = segs(sizes)
    runs = plan_rollup(list(reversed(segments)), fanout=fanout, base_bytes=200, max_bytes=20_000)
    seen = set()
    order = {s.path: i for i, s in enumerate(segments)}
    for run in runs:
        idx = [order[s.path] for s in run]
        assert idx == list(range(idx[0], idx[0] + fanout))  # adjacent by offset
        assert not seen & set(idx)
        seen |= set(idx)
        assert sum(s.size_bytes for s in run) <= 20_000
        assert len({size_tier(s.size_bytes, base_bytes=200, fanout=fanout) for s in run}) == 1
