import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.compaction_plan import latest_offsets, plan_merge, surviving_rows
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.core.segments import SegmentInfo

NOW = 10_000_000


def table(rows):
    n = len(rows)
    return pa.table(
        {
            "key": pa.array([r[0] for r in rows], pa.binary()),
            "value": pa.array([r[1] for r in rows], pa.binary()),
            "topic": ["t"] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([r[2] * 1000 for r in rows], pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * n, pa.int32()),
            "headers": pa.nulls(n, TOPIC_SCHEMA.field("headers").type),
        },
        schema=TOPIC_SCHEMA,
    )


rows_st = st.lists(
    st.tuples(
        st.sampled_from([None, b"a", b"b", b"c", b"d"]), st.sampled_from([None, b"v1", b"v2"]), st.integers(0, NOW)
    ),
    max_size=60,
)


@given(rows_st, st.integers(0, NOW))
def test_key_compaction_matches_a_plain_python_reference(rows, delete_retention):
    t = table(rows)
    latest = latest_offsets(t.column("key").to_pylist(), t.column("offset").to_pylist())
    got = surviving_rows(t, latest, now_ms=NOW, delete_retention_ms=delete_retention)
    # reference: the last record per key survives, unless it is a tombstone older than delete.retention.ms
    last = {}
    for i, (k, _, _) in enumerate(rows):
        if k is not None:
            last[k] = i
    expected = [
        i
        for i, (k, v, ts) in enumerate(rows)
        if k is None or (last[k] == i and not (v is None and ts < NOW - delete_retention))
    ]
    assert got.column("offset").to_pylist() == expected  # survivors keep their offsets, in order


def segs(sizes):
    out, off = [], 0
    for i, size in enumerate(sizes):
        out.append(SegmentInfo(path=f"f{i}", partition=0, first_offset=off, last_offset=off + 9, size_bytes=size))
        off += 10
    return out


def test_plan_merge_adjacent_runs_under_target():
    runs = plan_merge(segs([10, 10, 10, 500, 10, 10, 90, 10]), target_bytes=100)
    assert [[s.path for s in r] for r in runs] == [["f0", "f1", "f2"], ["f4", "f5"], ["f6", "f7"]]


@given(st.lists(st.integers(1, 300), max_size=40), st.integers(50, 1000))
def test_plan_merge_runs_are_adjacent_and_bounded(sizes, target):
    s = segs(sizes)
    index = {x.path: i for i, x in enumerate(s)}
    for run in plan_merge(list(reversed(s)), target_bytes=target):
        idx = [index[x.path] for x in run]
        assert len(idx) >= 2 and idx == list(range(idx[0], idx[0] + len(idx)))
        assert sum(x.size_bytes for x in run) <= target
