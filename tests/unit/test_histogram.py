from delta_log.core.histogram import Histogram


def test_counts_are_cumulative_per_bound_and_the_copy_stands_apart():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 2.0):
        h.observe(v)
    snapshot = h.copy()
    h.observe(0.01)
    assert snapshot.counts == [1, 2] and snapshot.count == 3
    assert snapshot.lines("x") == [
        'x_bucket{le="0.1"} 1',
        'x_bucket{le="1.0"} 2',
        'x_bucket{le="+Inf"} 3',
        "x_sum 2.550000",
        "x_count 3",
    ]
    assert h.counts == [2, 3] and h.count == 4
