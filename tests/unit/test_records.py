import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.records import (
    BATCH_SCHEMA,
    CREATE_TIME,
    LOG_APPEND_TIME,
    count_by_partition,
    normalize_batch,
    offsets_for_rows,
    plan_offsets,
    record_sizes,
)
from delta_log.errors import (
    InvalidRecordError,
    InvalidSchemaError,
    PartitionNotFoundError,
    RecordTooLargeError,
)

NOW = 1_700_000_000_000_000


def norm(table, partitions=3, max_bytes=1000, log_append_time=False):
    return normalize_batch(
        table,
        partitions=partitions,
        topic="t",
        max_message_bytes=max_bytes,
        now_us=NOW,
        log_append_time=log_append_time,
    )


requests_st = st.lists(st.dictionaries(st.integers(0, 5), st.integers(0, 50), max_size=6), max_size=20)
hws_st = st.dictionaries(st.integers(0, 5), st.integers(0, 10**12), max_size=6)


@given(requests_st, hws_st)
def test_plan_offsets_contiguous_unique_monotonic(requests, hws):
    plans, new_hws = plan_offsets(requests, hws)
    per_partition: dict[int, list[int]] = {}
    for plan in plans:
        for r in plan:
            per_partition.setdefault(r.partition, []).extend(range(r.base_offset, r.base_offset + r.count))
    for p, offsets in per_partition.items():
        start = hws.get(p, 0)
        assert offsets == list(range(start, start + len(offsets)))  # gap-free, increasing, unique
        assert new_hws[p] == start + len(offsets)
    assert set(new_hws) == set(per_partition)


@given(st.lists(st.integers(0, 4), max_size=300), hws_st)
def test_offsets_for_rows_agrees_with_plan(parts, hws):
    arr = np.array(parts, dtype=np.int32)
    order, offsets = offsets_for_rows(arr, hws)
    assert sorted(order.tolist()) == list(range(len(parts)))
    sorted_parts = arr[order]
    assert (np.diff(sorted_parts) >= 0).all()
    # rows of one partition keep arrival order and get hw, hw+1, ...
    for p in set(parts):
        mine = offsets[sorted_parts == p]
        assert mine.tolist() == list(range(hws.get(p, 0), hws.get(p, 0) + len(mine)))
        assert (np.diff(order[sorted_parts == p]) > 0).all()


def test_normalize_fills_defaults_and_timestamp_types():
    ts = pa.array([None, 5_000_000], pa.timestamp("us", tz="UTC"))
    out = norm(pa.table({"value": [b"a", b"b"], "partition": pa.array([0, 2], pa.int32()), "timestamp": ts}))
    assert out.schema == BATCH_SCHEMA
    assert out.column("key").null_count == 2
    assert out.column("timestampType").to_pylist() == [LOG_APPEND_TIME, CREATE_TIME]
    assert out.column("timestamp").cast(pa.int64()).to_pylist() == [NOW, 5_000_000]


def test_log_append_time_overrides_producer_timestamps():
    ts = pa.array([5_000_000], pa.timestamp("us", tz="UTC"))
    out = norm(
        pa.table({"value": [b"a"], "partition": pa.array([0], pa.int32()), "timestamp": ts}),
        log_append_time=True,
    )
    assert out.column("timestampType").to_pylist() == [LOG_APPEND_TIME]
    assert out.column("timestamp").cast(pa.int64()).to_pylist() == [NOW]


def test_partition_out_of_range_names_index():
    with pytest.raises(PartitionNotFoundError) as e:
        norm(pa.table({"value": [b"a", b"b"], "partition": pa.array([0, 3], pa.int32())}))
    assert e.value.code == "UNKNOWN_PARTITION" and e.value.details["index"] == 1


def test_record_too_large_names_index():
    with pytest.raises(RecordTooLargeError) as e:
        norm(pa.table({"value": [b"a", b"x" * 2000], "partition": pa.array([0, 0], pa.int32())}))
    assert e.value.details["index"] == 1 and e.value.code == "RECORD_TOO_LARGE"


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (pa.table({"partition": pa.array([0], pa.int32())}), InvalidSchemaError),
        (pa.table({"value": [b"a"]}), InvalidSchemaError),
        (
            pa.table({"value": [b"a"], "partition": pa.array([0], pa.int32()), "bogus": [1]}),
            InvalidSchemaError,
        ),
        (
            pa.table({"value": [b"a"], "partition": pa.array([0], pa.int32()), "timestamp": [[1]]}),
            InvalidSchemaError,
        ),
        (pa.table({"value": [b"a", b"b"], "partition": pa.array([0, None], pa.int32())}), InvalidRecordError),
        (
            pa.table({"value": pa.array([], pa.binary()), "partition": pa.array([], pa.int32())}),
            InvalidRecordError,
        ),
    ],
)
def test_bad_batches(table, error):
    with pytest.raises(error):
        norm(table)


def test_record_sizes_counts_headers():
    headers = pa.array([[{"key": "ab", "value": b"xyz"}], None], BATCH_SCHEMA.field("headers").type)
    t = pa.table({"key": [b"k", None], "value": [b"vv", b"v"], "headers": headers})
    assert record_sizes(t).tolist() == [1 + 2 + 2 + 3, 1]


def test_count_by_partition_counts_in_ascending_partition_order():
    parts = np.array([3, 0, 3, 7, 0, 3], dtype=np.int32)
    assert list(count_by_partition(parts).items()) == [(0, 2), (3, 3), (7, 1)]
    assert count_by_partition(np.array([], dtype=np.int32)) == {}
    assert count_by_partition(np.array([9999], dtype=np.int32)) == {9999: 1}


@pytest.mark.parametrize("run_bytes", [1, 1 << 40], ids=["runs sliced", "rows taken"])
def test_group_by_partition_keeps_each_partitions_order_either_way(monkeypatch, run_bytes):
    from delta_log.core import records

    monkeypatch.setattr(records, "SLICED_RUN_BYTES", run_bytes)
    parts = np.array([2, 2, 0, 1, 1, 0, 2, 0], np.int32)
    table = pa.table({"partition": parts, "arrival": np.arange(len(parts))})
    grouped = records.group_by_partition(pa.concat_tables([table.slice(0, 3), table.slice(3)]), parts)
    assert grouped.column("partition").to_pylist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert grouped.column("arrival").to_pylist() == [2, 5, 7, 3, 4, 0, 1, 6]
    ordered = table.take(pa.array(np.argsort(parts, kind="stable")))
    assert records.group_by_partition(ordered, np.sort(parts)) is ordered  # grouped already: as it is
