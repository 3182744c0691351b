"""Consumer-protocol groups' snapshots in `_system/consumer_protocol_groups`: the last save of a
group wins whatever the order its files are read in, a coordinator that took the group over
outranks a late save of the one before, a gone group is restored by no one, and compaction keeps
exactly what a load gives."""

import threading

from delta_log.core.consumer_group import ConsumerGroup, Heartbeat, Topics
from delta_log.system.consumer_protocol_groups import SCHEMA, ConsumerGroupSnapshots

TOPICS = Topics(1, {"orders": 6})


def _group_after(joins: int) -> ConsumerGroup:
    g = ConsumerGroup(group_id="g", session_timeout_ms=45_000, heartbeat_interval_ms=5_000)
    for i in range(joins):
        g.heartbeat(Heartbeat(member_id=f"m{i}", epoch=0, rebalance_timeout_ms=30_000, topics=("orders",)), 0.0, TOPICS)
    return g


def test_the_last_save_wins_and_a_newer_coordinator_outranks_a_late_save(storage):
    store = ConsumerGroupSnapshots(storage)
    snapshots = [_group_after(n).snapshot() for n in range(1, 9)]
    for s in snapshots:  # one commit (one file) each
        store.save({"g": (1, int(s["epoch"]), s), "other": (1, 1, snapshots[0])})
    reader = ConsumerGroupSnapshots(storage)  # another gateway
    assert reader.load("g") == {"g": snapshots[-1]}
    assert reader.load()["other"] == snapshots[0]
    store.save({"g": (2, 3, snapshots[2])})  # the group's new coordinator saves
    store.save({"g": (1, 9, snapshots[-1])})  # and the one before, late, fenced by its epoch
    assert reader.load("g") == {"g": snapshots[2]}
    store.save({"g": (2, -1, None)})  # gone (emptied into a classic group, or deleted)
    assert reader.load("g") == {}
    restored = ConsumerGroup.restore(
        "other", reader.load("other")["other"], now=0.0, session_timeout_ms=45_000, heartbeat_interval_ms=5_000
    )
    assert restored.snapshot() == snapshots[0]


def test_compaction_keeps_what_a_load_gives(storage):
    store = ConsumerGroupSnapshots(storage)
    for n in range(1, 6):
        s = _group_after(n).snapshot()
        store.save({"a": (1, n, s), "b": (1, n, s)})
    store.save({"b": (1, -1, None)})
    before = store.load()
    assert set(before) == {"a"}
    assert store.compact(min_rows=5)
    assert store.load() == before
    fresh = storage.open_or_create_system_table("consumer_protocol_groups", SCHEMA)
    assert storage.read_system_table(fresh, SCHEMA).num_rows == 1  # one row per group left


def test_saves_go_on_while_compaction_reads_and_a_save_made_meanwhile_is_kept(storage):
    """Compaction reads the files without the store's lock (a heartbeat's answer waits for its
    save): a save made while it reads lands, and the rewrite keeps it."""
    store = ConsumerGroupSnapshots(storage)
    for n in range(1, 6):
        store.save({"a": (1, n, _group_after(n).snapshot())})
    latest = _group_after(7).snapshot()
    read = store._read
    saved_meanwhile = threading.Event()

    def read_while_saving(uris):
        if not saved_meanwhile.is_set():  # the first read: the files listed before the save
            saver = threading.Thread(target=store.save, args=({"a": (1, 7, latest), "b": (1, 1, latest)},))
            saver.start()
            saver.join(10)
            assert not saver.is_alive(), "the save waited for the compaction's read"
            saved_meanwhile.set()
        return read(uris)

    store._read = read_while_saving
    assert store.compact(min_rows=5)
    assert saved_meanwhile.is_set()
    assert ConsumerGroupSnapshots(storage).load() == {"a": latest, "b": latest}
    fresh = storage.open_or_create_system_table("consumer_protocol_groups", SCHEMA)
    assert storage.read_system_table(fresh, SCHEMA).num_rows == 2


def test_saves_write_their_own_log_entries_past_a_rewrite_and_hand_back_to_delta_rs_on_a_protocol_change(storage):
    """On local disk a save writes its commit entry itself (a heartbeat waits for it): the table
    stays one delta-rs reads, a save after a compaction's rewrite lands on the version after it,
    and a constraint added from outside hands the saves back to delta-rs, which enforces it."""
    import glob
    import json
    import os

    from deltalake import DeltaTable

    store = ConsumerGroupSnapshots(storage)
    assert store._own is not None
    for n in range(1, 4):
        store.save({"a": (1, n, _group_after(n).snapshot())})
    assert store.compact(min_rows=3)
    latest = _group_after(5).snapshot()
    store.save({"a": (1, 5, latest), "b": (1, 1, latest)})
    uri = store._dt.table_uri
    # created, three saves, the system tables' settings (set at the first rewrite), the rewrite,
    # the save after it
    assert DeltaTable(uri).version() == 6
    assert ConsumerGroupSnapshots(storage).load() == {"a": latest, "b": latest}

    DeltaTable(uri).alter.add_constraint({"epoch_known": "group_epoch >= -1"})
    store.save({"a": (1, 6, _group_after(6).snapshot())})
    assert store._own is None
    last = sorted(glob.glob(os.path.join(storage.fs_path(uri), "_delta_log", "*.json")))[-1]
    with open(last) as f:
        info = next(json.loads(line)["commitInfo"] for line in f if '"commitInfo"' in line)
    assert info.get("engineInfo", "").startswith("delta-rs")
    assert ConsumerGroupSnapshots(storage).load()["a"] == _group_after(6).snapshot()
