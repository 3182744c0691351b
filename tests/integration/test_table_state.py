"""A table's state followed through its log and written as its checkpoint
(delta_log.table.table_state), on real Delta tables: delta-rs reads back from it exactly the table
it loads from the log alone."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from delta_log.core import transactions as rules
from delta_log.system.transactions import TABLE, TransactionStore
from delta_log.table.table_state import LAST_CHECKPOINT, TableState, interval_ms


def _log_dir(uri: str) -> str:
    return os.path.join(uri.removeprefix("file://"), "_delta_log")


def _last(log_dir: str) -> dict:
    with open(os.path.join(log_dir, LAST_CHECKPOINT)) as f:
        return json.load(f)


def test_a_store_checkpoints_its_table_itself_and_delta_rs_reads_the_same_table(storage):
    """The transactions store, rewriting its table every 256 saves, checkpoints it from the state
    its log follows (no delta-rs load): the files, app transactions and rows delta-rs reads through
    that checkpoint are those it reads from the log alone, and older versions still load."""
    store = TransactionStore(storage)
    epochs = {tid: store.claim(tid) for tid in ("app", "other")}
    for i in range(1, 769):  # the last rewrite, the last commit: the checkpoint holds it all
        tid = "app" if i % 3 else "other"
        store.save(rules.Txn(transactional_id=tid, producer_id=i, producer_epoch=0, timeout_ms=60_000), epochs[tid])
        if i % 256 == 0:
            assert store.compact(min_rows=256)
    uri = storage.system_uri(TABLE)
    log_dir = _log_dir(DeltaTable(uri).table_uri)
    last = _last(log_dir)
    # the second rewrite's checkpoint is the store's own (the first, which sets the table's
    # properties, is delta-rs's): written from the state followed, at the version it reached
    version = DeltaTable(uri).version()
    assert last == {"version": version, "size": last["size"], "sizeInBytes": last["sizeInBytes"], "numOfAddFiles": 1}
    followed = TableState.read(log_dir, version)
    assert followed is not None
    os.unlink(os.path.join(log_dir, LAST_CHECKPOINT))  # delta-rs from the log alone ...
    for name in os.listdir(log_dir):
        if name.endswith(".checkpoint.parquet"):
            os.rename(os.path.join(log_dir, name), os.path.join(log_dir, name + ".aside"))
    from_log = DeltaTable(uri)
    plain = (
        sorted(u.rpartition("/")[2] for u in from_log.file_uris()),
        {t: from_log.transaction_version(f"txn-coordinator-{t}") for t in epochs},
        sorted(from_log.to_pyarrow_table().column("sequence").to_pylist()),
    )
    for name in os.listdir(log_dir):  # ... and through the store's checkpoint
        if name.endswith(".aside"):
            os.rename(os.path.join(log_dir, name), os.path.join(log_dir, name.removesuffix(".aside")))
    with open(os.path.join(log_dir, LAST_CHECKPOINT), "w") as f:
        json.dump(last, f)
    checkpointed = DeltaTable(uri)
    assert (
        sorted(u.rpartition("/")[2] for u in checkpointed.file_uris()),
        {t: checkpointed.transaction_version(f"txn-coordinator-{t}") for t in epochs},
        sorted(checkpointed.to_pyarrow_table().column("sequence").to_pylist()),
    ) == plain
    assert sorted(followed.files) == plain[0]
    assert {t: followed.txns[f"txn-coordinator-{t}"]["version"] for t in epochs} == epochs
    assert store.load()["app"].txn.producer_id == 767  # the newest save of each id wins
    assert DeltaTable(uri, version=last["version"] - 1).version() == last["version"] - 1


def _table_with_tombstones(path: str) -> DeltaTable:
    """A real Delta table (delta-rs) whose overwrite left tombstones, with a checkpoint."""
    rows = pa.table({"x": pa.array([1, 2], pa.int64())})
    write_deltalake(path, rows, configuration={"delta.deletedFileRetentionDuration": "interval 1 hours"})
    write_deltalake(path, rows, mode="append")
    write_deltalake(path, rows, mode="overwrite")
    dt = DeltaTable(path)
    dt.create_checkpoint()
    write_deltalake(path, rows, mode="append")
    return DeltaTable(path)


def test_tombstones_past_retention_are_left_out_and_last_checkpoint_never_goes_back(tmp_path):
    path = str(tmp_path / "t")
    dt = _table_with_tombstones(path)
    log_dir = os.path.join(path, "_delta_log")
    state = TableState.read(log_dir, dt.version())
    assert state is not None and len(state.removes) == 2 and len(state.adds) == 2
    now_ms = int(time.time() * 1000)
    state.checkpoint(now_ms).write(log_dir)
    kept = pq.read_table(os.path.join(log_dir, f"{dt.version():020d}.checkpoint.parquet")).column("remove")
    assert kept.null_count == len(kept) - 2  # within the hour: both kept
    assert _last(log_dir)["version"] == dt.version()
    assert sorted(DeltaTable(path).to_pyarrow_table().column("x").to_pylist()) == [1, 1, 2, 2]

    write_deltalake(path, pa.table({"x": pa.array([3], pa.int64())}), mode="append")
    later = TableState.read(log_dir, dt.version() + 1)
    assert later is not None
    later.checkpoint(now_ms + 2 * 3600 * 1000).write(log_dir)  # two hours on: the tombstones expired
    assert later.removes == {}  # and forgotten
    assert (
        pq.read_table(os.path.join(log_dir, f"{dt.version() + 1:020d}.checkpoint.parquet")).column("remove").null_count
        == len(later.adds) + len(later.txns) + 2
    )
    state.checkpoint(now_ms).write(log_dir)  # an older state's: there already, and not pointed at
    assert _last(log_dir)["version"] == dt.version() + 1
    assert sorted(DeltaTable(path).to_pyarrow_table().column("x").to_pylist()) == [1, 1, 2, 2, 3]


def test_a_table_without_a_checkpoint_or_with_actions_it_does_not_keep_is_not_followed(tmp_path):
    """No checkpoint, one holding actions a state does not keep (domain metadata), or a multi-part
    one: not followed (None), so delta-rs checkpoints the table and nothing is left out."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": pa.array([1], pa.int64())}))
    log_dir = os.path.join(path, "_delta_log")
    assert TableState.read(log_dir, 0) is None  # delta-rs checkpoints it
    DeltaTable(path).create_checkpoint()
    assert TableState.read(log_dir, 0) is not None
    checkpoint = os.path.join(log_dir, f"{0:020d}.checkpoint.parquet")
    plain = pq.read_table(checkpoint)
    domain = {"domainMetadata": {"domain": "d", "configuration": "{}", "removed": False}}
    pq.write_table(pa.concat_tables([plain, pa.Table.from_pylist([domain], schema=plain.schema)]), checkpoint)
    assert TableState.read(log_dir, 0) is None
    pq.write_table(plain, checkpoint)
    assert TableState.read(log_dir, 0) is not None
    with open(os.path.join(log_dir, LAST_CHECKPOINT), "w") as f:
        json.dump({"version": 0, "size": 3, "parts": 2}, f)
    assert TableState.read(log_dir, 0) is None


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("interval 10 seconds", 10_000),
        ("interval 1 hours", 3_600_000),
        ("INTERVAL 2 DAYS", 172_800_000),
        ("interval 1 week", 604_800_000),
        ("10 seconds", -1),
        (None, -1),
    ],
)
def test_interval_properties(value, ms):
    assert interval_ms(value, -1) == ms
