"""The consumer-group state machine, driven by a fake clock (seconds): no I/O, no event loop."""

import pytest

from delta_log.core.group_rules import EMPTY, PREPARING, STABLE, MemberState, check_commit, expired
from delta_log.core.group_state import GroupState
from delta_log.errors import AuthorizationError, FencedMemberError, UnknownMemberError


def join(g, now, *, member_id=None, instance_id=None, topics=("t",), timeout_ms=10_000, assignor="range"):
    return g.join(
        now=now,
        topics=topics,
        member_id=member_id,
        instance_id=instance_id,
        session_timeout_ms=timeout_ms,
        assignor=assignor,
    )


def complete(g, partitions=None):
    g.complete(partitions or {"t": 4})


def stable_pair(now=0.0):
    """Two members in generation 2, range-assigned over 4 partitions."""
    g = GroupState(group_id="g")
    a, settled = join(g, now)
    assert not settled and g.ready_to_complete(now)
    complete(g)
    b, _ = join(g, now)  # a's heartbeat now says rebalance; a rejoins
    assert g.heartbeat(a.member_id, 1, now).rebalance
    assert not g.ready_to_complete(now)
    join(g, now, member_id=a.member_id)
    assert g.ready_to_complete(now)
    complete(g)
    return g, a, b


def test_first_join_forms_generation_one():
    g = GroupState(group_id="g")
    assert g.state == EMPTY
    m, settled = join(g, 0.0)
    assert not settled and g.state == PREPARING
    complete(g)
    assert g.state == STABLE and g.generation == 1
    assert g.result(m).assignment == {"t": [0, 1, 2, 3]}


def test_second_join_rebalances_and_splits_the_partitions():
    g, a, b = stable_pair()
    assert g.generation == 2 and g.state == STABLE
    assert sorted(a.assignment["t"] + b.assignment["t"]) == [0, 1, 2, 3]
    assert not set(a.assignment["t"]) & set(b.assignment["t"])


def test_rejoin_without_changes_is_answered_at_once():
    g, a, _ = stable_pair()
    member, settled = join(g, 1.0, member_id=a.member_id)
    assert settled and member is a and g.generation == 2


def test_rebalance_timeout_drops_members_that_did_not_rejoin():
    g, a, b = stable_pair()
    c, _ = join(g, 10.0)  # starts a rebalance; deadline = now + largest session timeout (10 s)
    join(g, 10.0, member_id=a.member_id)
    assert not g.ready_to_complete(19.9)
    assert g.ready_to_complete(20.0)  # b never rejoined
    complete(g)
    assert set(g.members) == {a.member_id, c.member_id} and g.generation == 3
    with pytest.raises(UnknownMemberError):
        g.heartbeat(b.member_id, 2, 20.0)


def test_session_expiry_starts_a_rebalance():
    g, a, b = stable_pair()
    g.heartbeat(a.member_id, 2, 9.0)
    assert g.expire(10.5) == [b.member_id]  # b's last sign of life was at 0.0, timeout 10 s
    assert g.state == PREPARING
    assert g.heartbeat(a.member_id, 2, 10.6).rebalance
    join(g, 10.6, member_id=a.member_id)
    complete(g)
    assert g.result(a).assignment == {"t": [0, 1, 2, 3]} and g.generation == 3


def test_last_member_leaving_empties_the_group():
    g = GroupState(group_id="g")
    m, _ = join(g, 0.0)
    complete(g)
    g.leave(m.member_id, 1.0)
    assert g.ready_to_complete(1.0)
    complete(g)
    assert g.state == EMPTY and not g.members and g.generation == 2


def test_static_member_takes_over_its_id_and_partitions_without_a_rebalance():
    g = GroupState(group_id="g")
    m, _ = join(g, 0.0, instance_id="host-1")
    complete(g)
    again, settled = join(g, 5.0, instance_id="host-1")  # restarted consumer, no member id
    assert settled and again.member_id == m.member_id and g.generation == 1
    assert again.last_heartbeat == 5.0
    changed, settled = join(g, 6.0, instance_id="host-1", topics=("t", "u"))
    assert not settled and changed.member_id == m.member_id and g.state == PREPARING


def test_commits_only_from_the_current_owner():
    g, a, b = stable_pair()
    owned = a.assignment["t"][0]
    g.check_commit(member_id=a.member_id, generation=2, partitions=[("t", owned)], now=3.0)
    assert a.last_heartbeat == 3.0  # a commit is a sign of life
    with pytest.raises(FencedMemberError):  # old generation: a zombie
        g.check_commit(member_id=a.member_id, generation=1, partitions=[("t", owned)], now=3.0)
    with pytest.raises(FencedMemberError):  # a partition it does not own
        g.check_commit(member_id=b.member_id, generation=2, partitions=[("t", owned)], now=3.0)
    with pytest.raises(UnknownMemberError):
        g.check_commit(member_id="nobody", generation=2, partitions=[], now=3.0)
    with pytest.raises(FencedMemberError):  # standalone commits only while the group has no members
        g.check_commit(member_id=None, generation=None, partitions=[("t", 0)], now=3.0)


def test_heartbeat_from_an_old_generation_is_fenced():
    g, a, _ = stable_pair()
    with pytest.raises(FencedMemberError):
        g.heartbeat(a.member_id, 1, 1.0)


def test_a_rebalance_jobs_assignment_is_adopted_by_the_next_completion():
    g, a, b = stable_pair()
    job = {a.member_id: {"t": [0, 3]}, b.member_id: {"t": [1, 2]}}
    assert not g.adopt(g.generation + 2, job, 1.0)  # not the next generation: ignored
    assert g.adopt(g.generation + 1, job, 1.0) and g.state == PREPARING
    join(g, 1.0, member_id=a.member_id)
    join(g, 1.0, member_id=b.member_id)
    complete(g)
    assert a.assignment == {"t": [0, 3]} and b.assignment == {"t": [1, 2]} and g.generation == 3


def test_rules_expired_and_standalone_commits():
    m = MemberState(member_id="m", instance_id=None, topics=frozenset({"t"}), session_timeout_ms=1000, last_heartbeat=0)
    assert expired({"m": m}, 1.0) == [] and expired({"m": m}, 1.01) == ["m"]
    check_commit({}, 0, member_id=None, member_generation=None, partitions=[("t", 0)])  # no members: allowed


def test_only_the_principal_that_joined_a_member_acts_for_it():
    g = GroupState(group_id="g")
    m, _ = g.join(
        now=0.0,
        topics=["t"],
        member_id=None,
        instance_id="i-1",
        session_timeout_ms=10_000,
        assignor="range",
        principal="alice",
    )
    g.complete({"t": 1})
    for act in (
        lambda: g.heartbeat(m.member_id, g.generation, 1.0, "mallory"),
        lambda: g.leave(m.member_id, 1.0, "mallory"),
        lambda: g.check_commit(
            member_id=m.member_id, generation=g.generation, partitions=[("t", 0)], now=1.0, principal="mallory"
        ),
        lambda: g.join(
            now=1.0,
            topics=["t"],
            member_id=None,
            instance_id="i-1",
            session_timeout_ms=10_000,
            assignor="range",
            principal="mallory",
        ),
    ):
        with pytest.raises(AuthorizationError):
            act()
    assert list(g.members) == [m.member_id] and g.state == "Stable"
    assert g.heartbeat(m.member_id, g.generation, 1.0, "alice").rebalance is False
    assert g.heartbeat(m.member_id, g.generation, 1.0, None).rebalance is False  # auth off: no owners
