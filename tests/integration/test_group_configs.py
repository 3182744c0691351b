"""Group configs in `_system/group_configs`: durable, seen by every gateway's store, and two
concurrent changes of one group both kept (neither overwrites the other's key)."""

import threading

from delta_log.core.group_config import HEARTBEAT_INTERVAL, SESSION_TIMEOUT, GroupConfigBounds
from delta_log.system.group_configs import GroupConfigStore

BOUNDS = GroupConfigBounds.of(45_000, 5_000, (45_000, 60_000), (5_000, 15_000))


def test_changes_are_durable_and_seen_by_another_store(storage):
    one, other = GroupConfigStore(storage), GroupConfigStore(storage)
    assert one.alter("g", {SESSION_TIMEOUT: "50000"}, BOUNDS) == {SESSION_TIMEOUT: "50000"}
    assert other.load()[1] == {"g": {SESSION_TIMEOUT: "50000"}}
    other.alter("g", {SESSION_TIMEOUT: None}, BOUNDS)
    assert one.load()[1] == {}  # no overrides left: the group is not listed


def test_concurrent_changes_of_one_group_keep_both_keys(storage):
    stores = [GroupConfigStore(storage) for _ in range(2)]
    barrier = threading.Barrier(2)

    def change(store: GroupConfigStore, key: str, value: str) -> None:
        barrier.wait()
        for _ in range(5):
            store.alter("g", {key: value}, BOUNDS)

    threads = [
        threading.Thread(target=change, args=(stores[0], SESSION_TIMEOUT, "55000")),
        threading.Thread(target=change, args=(stores[1], HEARTBEAT_INTERVAL, "7000")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert GroupConfigStore(storage).load()[1] == {"g": {SESSION_TIMEOUT: "55000", HEARTBEAT_INTERVAL: "7000"}}


def test_the_table_is_compacted_to_one_row_per_group(storage):
    store = GroupConfigStore(storage, compact_files=5)
    for i in range(12):
        store.alter(f"g{i % 3}", {SESSION_TIMEOUT: str(45_000 + i)}, BOUNDS)
    assert len(store._dt.file_uris()) < 6
    assert GroupConfigStore(storage).load()[1] == {f"g{i}": {SESSION_TIMEOUT: str(45_009 + i)} for i in range(3)}
