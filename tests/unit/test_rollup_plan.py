import math

from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.rollup_plan import RUN_FACTOR, plan_rollup, size_tier
from delta_log.core.segments import SegmentInfo


def segs(sizes):
    out, off = [], 0
    for i, size in enumerate(sizes):
        out.append(SegmentInfo(path=f"f{i}", partition=0, first_offset=off, last_offset=off + 9, size_bytes=size))
        off += 10
    return out


def test_tiers():
    assert size_tier(100, base_bytes=100, fanout=8) == -1  # at the base: never rolled up
    assert size_tier(5000, base_bytes=100, fanout=8) == -1
    assert size_tier(99, base_bytes=800, fanout=8) == 1
    assert size_tier(100, base_bytes=800, fanout=8) == 0  # base / fanout exactly: the tier below the base
    assert size_tier(799, base_bytes=800, fanout=8) == 0
    assert size_tier(12, base_bytes=800, fanout=8) == 2
    assert size_tier(0, base_bytes=800, fanout=8) == 3  # an empty file: the smallest tier, no endless loop


def test_merges_runs_of_fanout_or_more_small_segments():
    runs = plan_rollup(segs([10] * 17), fanout=8, base_bytes=100, max_bytes=10_000)
    assert [[s.path for s in r] for r in runs] == [[f"f{i}" for i in range(17)]]
    runs = plan_rollup(segs([10] * 40), fanout=8, base_bytes=100, max_bytes=10_000)
    assert [len(r) for r in runs] == [8 * RUN_FACTOR, 8]
    assert plan_rollup(segs([10] * 7), fanout=8, base_bytes=100, max_bytes=10_000) == []


def test_respects_max_bytes_and_tiers():
    assert plan_rollup(segs([10] * 8), fanout=8, base_bytes=100, max_bytes=79) == []
    # a big segment in the middle breaks adjacency of the small ones
    assert plan_rollup(segs([10] * 4 + [5000] + [10] * 4), fanout=8, base_bytes=100, max_bytes=10**6) == []
    # a merged file (tier 0) is not merged again with the small ones after it (tier 1)
    assert plan_rollup(segs([80] + [10] * 7), fanout=8, base_bytes=100, max_bytes=10**6) == []


@given(st.lists(st.integers(1, 5000), max_size=80), st.integers(2, 10))
def test_runs_are_adjacent_disjoint_and_bounded(sizes, fanout):
    segments = segs(sizes)
    runs = plan_rollup(list(reversed(segments)), fanout=fanout, base_bytes=200, max_bytes=20_000)
    seen = set()
    order = {s.path: i for i, s in enumerate(segments)}
    for run in runs:
        idx = [order[s.path] for s in run]
        assert fanout <= len(idx) <= fanout * RUN_FACTOR
        assert idx == list(range(idx[0], idx[0] + len(idx)))  # adjacent by offset
        assert not seen & set(idx)
        seen |= set(idx)
        assert sum(s.size_bytes for s in run) <= 20_000
        assert all(s.size_bytes < 200 for s in run)
        assert len({size_tier(s.size_bytes, base_bytes=200, fanout=fanout) for s in run}) == 1


@given(st.sampled_from([100, 1000, 25_000, 300_000]), st.integers(1, 64), st.sampled_from([4, 8]))
def test_a_byte_is_rewritten_about_once_a_tier(size, per_pass, fanout):
    """Passes of a roll-up after each `per_pass` commits of `size` bytes: no record is rewritten more
    often than once a tier from its commit's up to the base (a run's result is in a tier of larger
    segments: `fanout` segments of a tier add up to the next)."""
    base = 4 * 1024 * 1024
    live: list[tuple[SegmentInfo, int]] = []  # a segment and how often its records were rewritten
    offset = n = 0
    for _ in range(200):
        for _ in range(per_pass):
            live.append(
                (
                    SegmentInfo(
                        path=f"f{n}", partition=0, first_offset=offset, last_offset=offset + 9, size_bytes=size
                    ),
                    0,
                )
            )
            offset, n = offset + 10, n + 1
        rewrites = {s.path: r for s, r in live}
        for run in plan_rollup([s for s, _ in live], fanout=fanout, base_bytes=base, max_bytes=64 * 1024 * 1024):
            gone = {s.path for s in run}
            merged = SegmentInfo(
                path=f"m{n}",
                partition=0,
                first_offset=run[0].first_offset,
                last_offset=run[-1].last_offset,
                size_bytes=sum(s.size_bytes for s in run),
            )
            n += 1
            live = [x for x in live if x[0].path not in gone] + [(merged, 1 + max(rewrites[p] for p in gone))]
    assert max(r for _, r in live) <= math.ceil(math.log(base / size, fanout)) + 1
