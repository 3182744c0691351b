"""Upsert tables (delta_log.maintenance.upsert): the latest value per key, exactly once, by MERGE
in offset order with the merged offsets as Delta transactions; change data feed on."""

from __future__ import annotations

import json
import random
import threading
import time

import pyarrow as pa
from deltalake import DeltaTable

from delta_log import TopicWriter, normalize_batch
from delta_log.maintenance.upsert import UPSERT_GROUP, latest_uri, upsert_topic
from delta_log.system.offsets import OffsetStore


def batch(topic, partitions, records):
    """records: (partition, key, value)"""
    return normalize_batch(
        pa.table(
            {
                "key": pa.array([k for _, k, _ in records], pa.binary()),
                "value": pa.array([v for _, _, v in records], pa.binary()),
                "partition": pa.array([p for p, _, _ in records], pa.int32()),
            }
        ),
        partitions=partitions,
        topic=topic,
        max_message_bytes=10**6,
        now_us=int(time.time() * 1e6),
        log_append_time=False,
    )


def latest(storage, topic):
    t = DeltaTable(latest_uri(storage, topic)).to_pyarrow_table(columns=["key", "value", "partition", "offset"])
    rows = t.to_pylist()
    assert len({r["key"] for r in rows}) == len(rows), "a key with two rows"
    return {r["key"]: r["value"] for r in rows}


def parser(fields):
    """A value parse of JSON values into a struct of int64 `fields` (a typed topic's, for the tests)."""
    t = pa.struct([pa.field(f, pa.int64()) for f in fields])
    return lambda values: pa.array(
        [None if v is None else {f: json.loads(v).get(f) for f in fields} for v in values.to_pylist()], t
    )


def model(log):
    """The latest value per key of a log of (key, value), in order; tombstones delete."""
    out = {}
    for k, v in log:
        if k is None:
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def test_concurrent_produce_and_runs_end_with_the_latest_value_per_key(storage, settings, topic_factory):
    topic = topic_factory(partitions=3, topiclake_table_mode="upsert")
    writer = TopicWriter(storage, topic, settings.writer)
    rng = random.Random(7)
    logs: dict[int, list] = {0: [], 1: [], 2: []}
    done = threading.Event()
    ran = threading.Condition()
    runs: list = []
    errors: list[BaseException] = []

    def a_run_ends() -> None:
        with ran:
            seen = len(runs)
            if not ran.wait_for(lambda: len(runs) > seen, timeout=120):
                raise TimeoutError("no upsert run ended in 120 s")

    def produce():
        try:
            for i in range(40):
                if i and i % 10 == 0:  # interleave: a run ends between each quarter of the log
                    a_run_ends()
                recs = []
                for _ in range(50):
                    key = b"k%d" % rng.randrange(60)
                    p = int.from_bytes(key, "big") % 3  # a key stays in its partition
                    value = None if rng.random() < 0.15 else b"v%d" % rng.randrange(10**6)
                    recs.append((p, key, value))
                recs.append((0, None, b"no key"))
                writer.append(batch(topic, 3, recs))
                for p, k, v in recs:
                    logs[p].append((k, v))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=produce)
    t.start()
    offsets = OffsetStore(storage)
    conflicts = []

    def run() -> None:  # two runs at once: a lost race commits nothing and is reported
        try:
            while not done.is_set() or not runs:
                report = upsert_topic(storage, topic, max_records=700, offsets=offsets)
                with ran:
                    runs.append(report)
                    ran.notify_all()
                if report.conflict:
                    conflicts.append(report.conflict)
        except Exception as exc:
            errors.append(exc)

    runners = [threading.Thread(target=run) for _ in range(2)]
    for r in runners:
        r.start()
    for r in runners:
        r.join()
    t.join()
    assert not errors, errors
    assert len(runs) > 3  # one before each wait of the producer's, one at least after it
    while upsert_topic(storage, topic, offsets=offsets).merged:
        pass
    expected = {}
    for p in range(3):
        expected |= model(logs[p])
    assert latest(storage, topic) == expected
    print(f"{len(runs)} runs, {len(conflicts)} lost races")
    committed = offsets.committed(UPSERT_GROUP, topic)
    assert {p: c.offset for (_, p), c in committed.items()} == {p: len(logs[p]) for p in range(3)}
    assert upsert_topic(storage, topic).merged == 0  # nothing twice


def test_change_feed_shows_inserts_updates_and_deletes_in_offset_order(storage, settings, topic_factory):
    topic = topic_factory(partitions=1, topiclake_table_mode="upsert")
    writer = TopicWriter(storage, topic, settings.writer)
    writer.append(batch(topic, 1, [(0, b"a", b"1"), (0, b"b", b"1")]))
    upsert_topic(storage, topic)
    writer.append(batch(topic, 1, [(0, b"a", b"2"), (0, b"b", None), (0, b"a", b"3")]))
    upsert_topic(storage, topic)
    cdf = pa.table(DeltaTable(latest_uri(storage, topic)).load_cdf(starting_version=0).read_all()).to_pylist()
    changes = sorted(
        (r["_commit_version"], r["_change_type"], r["key"], r["value"], r["offset"])
        for r in cdf
        if r["_change_type"] != "update_preimage"
    )
    versions = sorted({c[0] for c in changes})
    first, second = versions[0], versions[-1]
    assert changes == [
        (first, "insert", b"a", b"1", 0),
        (first, "insert", b"b", b"1", 1),
        (second, "delete", b"b", b"1", 1),
        (second, "update_postimage", b"a", b"3", 4),  # the last of a's two updates in the batch
    ]
    assert latest(storage, topic) == {b"a": b"3"}
    # a deleted key comes back: in the feed's commit order, each key's changes follow its offsets
    writer.append(batch(topic, 1, [(0, b"b", b"4")]))
    upsert_topic(storage, topic)
    cdf = pa.table(DeltaTable(latest_uri(storage, topic)).load_cdf(starting_version=0).read_all()).to_pylist()
    b_changes = [
        (r["_change_type"], r["offset"])
        for r in sorted(cdf, key=lambda r: r["_commit_version"])
        if r["key"] == b"b" and r["_change_type"] != "update_preimage"
    ]
    assert b_changes == [("insert", 1), ("delete", 1), ("insert", 5)]
    assert latest(storage, topic) == {b"a": b"3", b"b": b"4"}


def test_a_new_schema_version_adds_columns_and_keeps_the_table_id(storage, settings, topic_factory):
    """Readers of the change feed (Spark streams) stop if the table's id changes: new fields are
    added with ALTER TABLE ADD COLUMNS, never by a MERGE's schema evolution."""
    topic = topic_factory(partitions=1, topiclake_table_mode="upsert")
    writer = TopicWriter(storage, topic, settings.writer)

    writer.append(batch(topic, 1, [(0, b"a", b'{"x": 1}')]))
    upsert_topic(storage, topic, parse=parser(["x"]))
    table_id = DeltaTable(latest_uri(storage, topic)).metadata().id
    writer.append(batch(topic, 1, [(0, b"b", b'{"x": 2, "y": 3}')]))
    upsert_topic(storage, topic, parse=parser(["x", "y"]))
    dt = DeltaTable(latest_uri(storage, topic))
    assert dt.metadata().id == table_id
    rows = sorted(pa.table(dt.to_pyarrow_table(columns=["key", "x", "y"])).to_pylist(), key=lambda r: r["key"])
    assert rows == [{"key": b"a", "x": 1, "y": None}, {"key": b"b", "x": 2, "y": 3}]


def test_a_run_that_adds_columns_after_another_run_merged_writes_nothing_older(
    storage, settings, topic_factory, monkeypatch
):
    """Adding a new schema version's columns refreshes the table: a MERGE another run committed
    after this run read its offsets is then in the table, and this run's older records must not
    overwrite it (nor move the merged offsets back)."""
    from delta_log.maintenance import upsert

    topic = topic_factory(partitions=1, topiclake_table_mode="upsert")
    writer = TopicWriter(storage, topic, settings.writer)

    writer.append(batch(topic, 1, [(0, b"a", b'{"x": 1}')]))
    upsert_topic(storage, topic, parse=parser(["x"]))
    writer.append(batch(topic, 1, [(0, b"c", b'{"x": 2}')]))  # new keys only: the other run's MERGE
    original = upsert._aligned
    other_ran = []

    def aligned_after_another_run(target, source):
        if not other_ran:  # between this run's read of its offsets and its ALTER TABLE: another run
            other_ran.append(True)
            writer.append(batch(topic, 1, [(0, b"b", b'{"x": 3}')]))  # inserts, so the ALTER does not conflict
            assert upsert_topic(storage, topic, parse=parser(["x"])).merged == 2
        return original(target, source)

    monkeypatch.setattr(upsert, "_aligned", aligned_after_another_run)
    late = upsert_topic(storage, topic, parse=parser(["x", "y"]))  # a new version: columns added
    assert late.conflict.startswith("another upsert run committed first") and other_ran
    assert late.merged == late.upserted_keys == 0  # nothing it read was written
    dt = DeltaTable(latest_uri(storage, topic))
    assert dt.transaction_version("upsert-0") == 3  # not moved back to 2
    rows = sorted(pa.table(dt.to_pyarrow_table(columns=["key", "x"])).to_pylist(), key=lambda r: r["key"])
    assert rows == [{"key": b"a", "x": 1}, {"key": b"b", "x": 3}, {"key": b"c", "x": 2}]
    # an update by the other run instead: its MERGE rewrote a file the ALTER read, which refuses
    writer.append(batch(topic, 1, [(0, b"a", b'{"x": 4}')]))
    other_ran.clear()
    original_writer_append = writer.append

    def update_a(records):
        return original_writer_append(batch(topic, 1, [(0, b"a", b'{"x": 5}')]))

    monkeypatch.setattr(writer, "append", update_a)
    late = upsert_topic(storage, topic, parse=parser(["x", "y", "z"]))
    assert late.conflict and other_ran  # reported, not raised: the next run merges
    monkeypatch.setattr(upsert, "_aligned", original)
    upsert_topic(storage, topic, parse=parser(["x", "y", "z"]))
    dt = DeltaTable(latest_uri(storage, topic))
    assert dt.transaction_version("upsert-0") == 5
    rows = sorted(pa.table(dt.to_pyarrow_table(columns=["key", "x"])).to_pylist(), key=lambda r: r["key"])
    assert rows == [{"key": b"a", "x": 5}, {"key": b"b", "x": 3}, {"key": b"c", "x": 2}]
