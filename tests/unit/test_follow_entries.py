import json

from delta_log.core.segments import SegmentInfo
from delta_log.core.topic_config import TopicConfig
from delta_log.log.index import PartitionIndex, TopicSnapshot, follow_entries


def _stats(lo, hi, n):
    return json.dumps({"numRecords": n, "minValues": {"offset": lo}, "maxValues": {"offset": hi}})


def _add(path, part, lo, hi):
    return json.dumps(
        {
            "add": {
                "path": path,
                "partitionValues": {"partition": str(part)},
                "size": 100,
                "stats": _stats(lo, hi, hi - lo + 1),
            }
        }
    )


def _remove(path):
    return json.dumps({"remove": {"path": path, "deletionTimestamp": 1, "dataChange": False}})


def _hw(part, hw):
    return json.dumps({"txn": {"appId": f"hw-{part}", "version": hw}})


def _snapshot():
    seg = SegmentInfo(
        path="partition=0/a.parquet", partition=0, first_offset=0, last_offset=9, size_bytes=100, records=10
    )
    return TopicSnapshot(
        table_version=5,
        table_id="00000000-0000-0000-0000-000000000005",
        config=TopicConfig.from_properties({}),
        partitions={0: PartitionIndex.of([seg])},
        high_watermarks={0: 10},
        loaded_at=0.0,
    )


def _never(path):
    raise AssertionError(f"no stats fallback expected for {path}")


def test_adds_removes_and_high_watermarks_are_applied_in_order():
    entries = [
        "\n".join([_add("partition=0/b.parquet", 0, 10, 19), _hw(0, 20)]),
        "\n".join(
            [
                _add("partition=0/ab.parquet", 0, 0, 19),
                _remove("partition=0/a.parquet"),
                _remove("partition=0/b.parquet"),
            ]
        ),
        "\n".join([_add("partition=1/c.parquet", 1, 0, 4), _hw(1, 5)]),
    ]
    snap = follow_entries(_snapshot(), entries, stats_fallback=_never, now=1.0)
    assert snap is not None and snap.table_version == 8 and snap.loaded_at == 1.0
    assert [s.path for s in snap.partitions[0].segments] == ["partition=0/ab.parquet"]
    assert [s.path for s in snap.partitions[1].segments] == ["partition=1/c.parquet"]
    assert snap.high_watermarks == {0: 20, 1: 5}


def test_what_the_entries_cannot_say_reads_the_table():
    base = _snapshot()
    for entry in (
        json.dumps({"metaData": {"id": "x"}}),  # config or partitions changed
        _remove("partition=0/unknown.parquet"),  # a file the index does not hold
        _add("partition=0/a.parquet", 0, 0, 9),  # an add of a held path: a replacement
        _add("partition=0/caf%C3%A9.parquet", 0, 10, 12),  # percent-encoded: delta-rs decodes it
        json.dumps({"add": {"path": "partition=0/d.parquet", "partitionValues": {"partition": "0"}, "stats": "{"}}),
        "[1, 2]",  # not an action
    ):
        assert follow_entries(base, [entry], stats_fallback=_never, now=1.0) is None, entry
