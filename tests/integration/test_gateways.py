"""Gateway membership files in a real storage root, and the offsets table's coordinator epochs."""

import subprocess
import sys

import pytest

from delta_log.errors import FencedMemberError, NotCoordinatorError
from delta_log.system.gateways import GatewayDirectory, GatewayRecord, process_gone, this_process
from delta_log.system.offsets import OffsetCommit, OffsetStore


def test_records_are_published_read_and_removed(storage):
    d = GatewayDirectory(storage)
    assert d.read_all() == []
    a = GatewayRecord(gateway_id="a", url="http://127.0.0.1:1", started_at_ms=1, heartbeat_ms=10)
    b = GatewayRecord(gateway_id="b", url="http://127.0.0.1:2", started_at_ms=2, heartbeat_ms=20)
    d.publish(a)
    d.publish(b)
    d.publish(GatewayRecord(gateway_id="a", url="http://127.0.0.1:1", started_at_ms=1, heartbeat_ms=30))
    assert [(r.gateway_id, r.heartbeat_ms) for r in d.read_all()] == [("a", 30), ("b", 20)]
    assert b.live(now_ms=25, timeout_ms=10) and not b.live(now_ms=31, timeout_ms=10)
    d.remove("a")
    d.remove("a")  # twice is fine
    assert [r.gateway_id for r in d.read_all()] == ["b"]


def test_a_gateway_process_of_this_machine_is_known_gone_once_it_ended():
    """A record names its process (boot, pid namespace, pid, start time): a gateway on the same
    machine tells at once that it ended, even when it was killed and its heartbeat is fresh."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from delta_log.system.gateways import this_process; print(this_process(), flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        token = child.stdout.readline().strip()
        assert token and token != this_process()
        assert not process_gone(token) and not process_gone(this_process())
        record = GatewayRecord(gateway_id="c", url="u", started_at_ms=1, heartbeat_ms=1, process=token)
        assert GatewayRecord.from_json(record.to_json()).process == token
    finally:
        child.kill()
        child.wait()
    assert process_gone(token) and record.process_gone()
    boot, ns, pid, start = token.split("/")
    assert process_gone(f"{boot}/{ns}/{pid}/{int(start) + 1}")  # the pid of another process now
    assert not process_gone(f"another-boot/{ns}/{pid}/{start}")  # another machine's: cannot tell
    assert not process_gone("") and not process_gone("garbage")


def test_a_stale_coordinator_cannot_commit_offsets(storage):
    first, second = OffsetStore(storage), OffsetStore(storage)  # two gateways' views of one table
    e1 = first.claim_coordinator("g")
    commit = OffsetCommit(group="g", topic="t", partition=0, offset=5)
    first.commit([commit], fence=("g", e1))
    first.check_coordinator("g", e1)
    e2 = second.claim_coordinator("g")  # the group moved
    assert e2 == e1 + 1
    with pytest.raises(NotCoordinatorError):
        first.check_coordinator("g", e1)  # group state writes check this first
    with pytest.raises(NotCoordinatorError):
        first.commit([OffsetCommit(group="g", topic="t", partition=0, offset=1)], fence=("g", e1))
    second.commit([OffsetCommit(group="g", topic="t", partition=0, offset=7)], fence=("g", e2))
    first.load()
    assert first.committed("g")[("t", 0)].offset == 7


def test_a_spark_group_commit_obeys_the_groups_coordinator(storage, monkeypatch):
    from delta_log.spark.options import SourceOptions
    from delta_log.spark.source import _Planner

    planner = _Planner(SourceOptions(root=storage.root, subscribe=("t",), group_id="g"))
    gateway = OffsetStore(storage)
    epoch = gateway.claim_coordinator("g")  # a gateway coordinated g once; no members now
    planner.commit_group({"t": {0: 5}})
    assert OffsetStore(storage).committed("g")[("t", 0)].offset == 5
    gateway.commit([OffsetCommit(group="g", topic="t", partition=0, offset=6)], fence=("g", epoch))  # still holds

    # a gateway takes the group over between the query's check and its commit: Delta refuses it
    read_epoch = OffsetStore.coordinator_epoch

    def racing(self, group):
        seen = read_epoch(self, group)
        OffsetStore(storage).claim_coordinator(group)
        return seen

    monkeypatch.setattr(OffsetStore, "coordinator_epoch", racing)
    with pytest.raises(FencedMemberError):
        planner.commit_group({"t": {0: 9}})
    assert OffsetStore(storage).committed("g")[("t", 0)].offset == 6
