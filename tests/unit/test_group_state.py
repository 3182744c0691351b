"""The consumer-group state machine, driven by a fake clock (seconds): no I/O, no event loop."""

import pytest

from delta_log.core.group_rules import AWAITING_SYNC, EMPTY, PREPARING, STABLE, MemberState, check_commit, expired
from delta_log.core.group_state import GroupState
from delta_log.errors import (
    AuthorizationError,
    FencedInstanceIdError,
    FencedMemberError,
    GroupMaxSizeReachedError,
    InconsistentGroupProtocolError,
    MemberIdRequiredError,
    RebalanceInProgressError,
    UnknownMemberError,
)


def join(
    g,
    now,
    *,
    member_id=None,
    instance_id=None,
    topics=("t",),
    timeout_ms=10_000,
    assignor="range",
    rebalance_ms=0,
    require_member_id=False,
):
    return g.join(
        now=now,
        topics=topics,
        member_id=member_id,
        instance_id=instance_id,
        session_timeout_ms=timeout_ms,
        assignor=assignor,
        rebalance_timeout_ms=rebalance_ms,
        require_member_id=require_member_id,
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


# -- groups whose leader assigns (Kafka Connect, Streams, cooperative-sticky alone) -------------------
CONNECT = "kafka:connect"


def kafka_join(g, now, protocols, *, member_id=None, assignor=CONNECT, topics=()):
    return g.join(
        now=now,
        topics=topics,
        member_id=member_id,
        instance_id=None,
        session_timeout_ms=10_000,
        assignor=assignor,
        protocols=protocols,
    )


def leader_pair():
    """Two Connect workers in generation 2, awaiting the leader's SyncGroup."""
    g = GroupState(group_id="connect-cluster")
    a, _ = kafka_join(g, 0.0, [("sessioned", b"a-s"), ("compatible", b"a-c"), ("default", b"a-d")])
    complete(g, {})
    b, _ = kafka_join(g, 0.0, [("compatible", b"b-c"), ("default", b"b-d")])
    assert g.heartbeat(a.member_id, 1, 0.0).rebalance
    kafka_join(g, 0.0, [("sessioned", b"a-s"), ("compatible", b"a-c"), ("default", b"a-d")], member_id=a.member_id)
    assert g.ready_to_complete(0.0)
    complete(g, {})
    return g, a, b


def test_the_leader_gets_every_members_metadata_for_the_protocol_chosen_by_vote():
    g, a, b = leader_pair()
    assert (g.state, g.generation, g.protocol, g.leader) == (AWAITING_SYNC, 2, "compatible", a.member_id)
    leader, follower = g.result(a), g.result(b)
    assert leader.member_metadata == ((a.member_id, None, b"a-c"), (b.member_id, None, b"b-c"))
    assert follower.member_metadata == () and follower.leader == a.member_id and follower.protocol == "compatible"


def test_followers_wait_for_the_leaders_sync_which_makes_the_group_stable():
    g, a, b = leader_pair()
    assert g.sync(b.member_id, 2, {}) is None  # the leader's is not in yet
    with pytest.raises(RebalanceInProgressError):
        g.check_commit(member_id=b.member_id, generation=2, partitions=[], now=0.0)
    got = g.sync(a.member_id, 2, {a.member_id: (b"for-a", {}), b.member_id: (b"for-b", {})})
    assert got == b"for-a" and g.state == STABLE
    assert g.sync(b.member_id, 2, {}) == b"for-b"
    with pytest.raises(FencedMemberError):
        g.sync(b.member_id, 1, {})


def test_consumer_assignments_from_a_leader_still_fence_commits_by_owner():
    g = GroupState(group_id="streams")
    a, _ = kafka_join(g, 0.0, [("stream", b"sub")], assignor="kafka:consumer", topics=("t",))
    complete(g, {"t": 2})
    g.sync(a.member_id, 1, {a.member_id: (b"opaque", {"t": [0]})})
    g.check_commit(member_id=a.member_id, generation=1, partitions=[("t", 0)], now=0.0)
    with pytest.raises(FencedMemberError):
        g.check_commit(member_id=a.member_id, generation=1, partitions=[("t", 1)], now=0.0)


def test_a_follower_rejoining_unchanged_keeps_the_generation_the_leader_rejoining_starts_a_rebalance():
    g, a, b = leader_pair()
    g.sync(a.member_id, 2, {a.member_id: (b"x", {}), b.member_id: (b"y", {})})
    _, settled = kafka_join(g, 1.0, [("compatible", b"b-c"), ("default", b"b-d")], member_id=b.member_id)
    assert settled and g.state == STABLE
    _, settled = kafka_join(
        g, 1.0, [("sessioned", b"a-s"), ("compatible", b"a-c"), ("default", b"a-d")], member_id=a.member_id
    )
    assert not settled and g.state == PREPARING


def test_members_that_cannot_share_a_group_are_refused():
    g, _, _ = leader_pair()
    with pytest.raises(InconsistentGroupProtocolError):
        join(g, 0.0)  # an HTTP member: the coordinator cannot assign beside a leader
    with pytest.raises(InconsistentGroupProtocolError):
        kafka_join(g, 0.0, [("sessioned", b"")])  # no protocol every member offers
    with pytest.raises(InconsistentGroupProtocolError):
        kafka_join(g, 0.0, [("compatible", b"")], assignor="kafka:consumer")  # another protocol type
    h, _, _ = stable_pair()
    with pytest.raises(InconsistentGroupProtocolError):
        kafka_join(h, 0.0, [("stream", b"")], assignor="kafka:consumer", topics=("t",))
    assert len(g.members) == 2 and len(h.members) == 2  # nothing joined


def test_a_leader_that_leaves_hands_leadership_to_a_remaining_member():
    g, a, b = leader_pair()
    g.leave(a.member_id, 1.0)
    kafka_join(g, 1.0, [("compatible", b"b-c"), ("default", b"b-d")], member_id=b.member_id)
    complete(g, {})
    assert (g.leader, g.protocol, g.generation) == (b.member_id, "compatible", 3)


def test_a_cooperative_member_commits_what_it_gives_up_while_nobody_owns_it_yet():
    """Cooperative rebalancing: in the generation after it owned t-1, the leader's plan withholds
    t-1 (its owner gives it up first); the owner commits it then. Once another member owns it, the
    old owner no longer may."""
    g = GroupState(group_id="coop")
    a, _ = kafka_join(g, 0.0, [("cooperative-sticky", b"")], assignor="kafka:consumer", topics=("t",))
    complete(g, {"t": 2})
    g.sync(a.member_id, 1, {a.member_id: (b"", {"t": [0, 1]})})
    b, _ = kafka_join(g, 0.0, [("cooperative-sticky", b"")], assignor="kafka:consumer", topics=("t",))
    kafka_join(g, 0.0, [("cooperative-sticky", b"")], assignor="kafka:consumer", topics=("t",), member_id=a.member_id)
    complete(g, {"t": 2})
    g.sync(a.member_id, 2, {a.member_id: (b"", {"t": [0]}), b.member_id: (b"", {})})  # t-1 withheld
    g.check_commit(member_id=a.member_id, generation=2, partitions=[("t", 0), ("t", 1)], now=0.0)
    with pytest.raises(FencedMemberError):  # b never owned it
        g.check_commit(member_id=b.member_id, generation=2, partitions=[("t", 1)], now=0.0)
    kafka_join(g, 0.0, [("cooperative-sticky", b"")], assignor="kafka:consumer", topics=("t",), member_id=a.member_id)
    kafka_join(g, 0.0, [("cooperative-sticky", b"")], assignor="kafka:consumer", topics=("t",), member_id=b.member_id)
    complete(g, {"t": 2})
    g.sync(a.member_id, 3, {a.member_id: (b"", {"t": [0]}), b.member_id: (b"", {"t": [1]})})
    with pytest.raises(FencedMemberError):  # b owns it now
        g.check_commit(member_id=a.member_id, generation=3, partitions=[("t", 1)], now=0.0)


def test_kip394_a_new_member_first_gets_its_member_id_and_the_rebalance_waits_for_it():
    g, a, b = stable_pair()
    with pytest.raises(MemberIdRequiredError) as err:
        join(g, 1.0, require_member_id=True)
    pending = err.value.details["member_id"]
    assert pending not in g.members and g.state == STABLE  # nothing changes until it joins with it
    c, settled = join(g, 1.1, member_id=pending)
    assert not settled and c.member_id == pending and g.state == PREPARING
    join(g, 1.2, member_id=a.member_id)
    join(g, 1.2, member_id=b.member_id)
    assert g.ready_to_complete(1.2)
    complete(g)
    assert g.generation == 3 and set(g.members) == {a.member_id, b.member_id, pending}


def test_kip394_a_pending_member_id_is_waited_for_until_it_leaves_or_expires():
    g, a, b = stable_pair()
    g.start_rebalance(1.0)
    with pytest.raises(MemberIdRequiredError) as err:
        join(g, 1.0, require_member_id=True, timeout_ms=6_000)
    pending = err.value.details["member_id"]
    join(g, 1.0, member_id=a.member_id)
    join(g, 1.0, member_id=b.member_id)
    assert not g.ready_to_complete(1.0)  # Kafka waits for the member ids it handed out
    g.leave(pending, 1.1)  # a client that gave up leaves with the id it was given
    assert g.ready_to_complete(1.1)
    with pytest.raises(MemberIdRequiredError) as err:
        join(g, 2.0, require_member_id=True, timeout_ms=6_000)
    assert not g.ready_to_complete(2.0)
    assert g.expire(8.1) == [] and g.ready_to_complete(8.1)  # or its session timeout passes
    with pytest.raises(UnknownMemberError):
        join(g, 8.2, member_id=err.value.details["member_id"])


def test_the_rebalance_waits_for_the_members_rebalance_timeout_not_their_session_timeout():
    g, a, b = stable_pair()
    join(g, 0.5, member_id=a.member_id, rebalance_ms=60_000)  # unchanged: the generation stands
    g.start_rebalance(1.0)  # (a subscribed topic grew, say)
    join(g, 1.0, member_id=a.member_id, rebalance_ms=60_000)  # a rejoins; b still works, heartbeating
    assert g.rebalance_deadline == 1.0 + 60.0
    g.heartbeat(b.member_id, 2, 30.0)
    assert not g.ready_to_complete(30.0) and g.expire(30.0) == []
    assert g.expire(45.0) == [b.member_id]  # silent past its session: gone, the rebalance completes
    assert g.ready_to_complete(45.0)


def test_kip345_a_static_member_back_takes_its_instance_over_and_fences_the_old_process():
    g = GroupState(group_id="g")
    a, _ = join(g, 0.0, instance_id="worker-1")
    complete(g)
    join(g, 0.0, instance_id="worker-2")
    join(g, 0.0, member_id=a.member_id, instance_id="worker-1")
    complete(g)
    old_id, owned = a.member_id, dict(a.assignment)
    back, settled = join(g, 1.0, instance_id="worker-1")  # restarted: no member id
    assert settled and back.member_id != old_id and back.assignment == owned and g.generation == 2
    with pytest.raises(FencedInstanceIdError):  # the old process, still running, is fenced
        g.heartbeat(old_id, 2, 1.1, instance_id="worker-1")
    with pytest.raises(UnknownMemberError):
        g.heartbeat(old_id, 2, 1.1)
    assert not g.heartbeat(back.member_id, 2, 1.1, instance_id="worker-1").rebalance


def test_a_static_member_that_does_not_rejoin_stays_in_the_next_generation():
    g = GroupState(group_id="g")
    s, _ = join(g, 0.0, instance_id="s")
    complete(g)
    d, _ = join(g, 0.0)
    assert g.heartbeat(s.member_id, 1, 0.1).rebalance
    g.heartbeat(s.member_id, 1, 9.0)  # alive, busy: it does not rejoin within the rebalance
    assert g.ready_to_complete(10.0) and g.topics_to_assign() == ["t"]
    complete(g)
    assert set(g.members) == {s.member_id, d.member_id}  # Kafka removes dynamic members only
    assert sorted(s.assignment["t"] + d.assignment["t"]) == [0, 1, 2, 3]


def test_kip394_a_pending_member_joining_a_stable_leader_assigned_group_starts_a_rebalance():
    """Its join with the id it was given is a new member's: never 'unchanged' (else it would get
    the current generation and no partitions, as librdkafka's cooperative member once did)."""
    g = GroupState(group_id="g", assignor="kafka:consumer")
    coop = [("cooperative-sticky", b"m")]
    a, _ = g.join(now=0.0, topics=["t"], member_id=None, instance_id=None, session_timeout_ms=10_000,
                  assignor="kafka:consumer", protocols=coop)  # fmt: skip
    complete(g)
    g.sync(a.member_id, 1, {a.member_id: (b"x", {"t": [0, 1]})})
    assert g.state == STABLE
    with pytest.raises(MemberIdRequiredError) as err:
        g.join(now=1.0, topics=["t"], member_id=None, instance_id=None, session_timeout_ms=10_000,
               assignor="kafka:consumer", protocols=coop, require_member_id=True)  # fmt: skip
    _, settled = g.join(now=1.0, topics=["t"], member_id=err.value.details["member_id"], instance_id=None,
                        session_timeout_ms=10_000, assignor="kafka:consumer", protocols=coop)  # fmt: skip
    assert not settled and g.state == PREPARING and g.heartbeat(a.member_id, 1, 1.1).rebalance


def test_a_new_member_beyond_the_groups_most_is_refused_but_a_static_one_takes_its_place():
    g = GroupState(group_id="g")

    def enter(member_id=None, instance_id=None, **kw):
        return g.join(
            now=0,
            topics=("t",),
            member_id=member_id,
            instance_id=instance_id,
            session_timeout_ms=10_000,
            assignor="range",
            max_size=2,
            **kw,
        )

    first = enter(instance_id="i-a")[0].member_id
    with pytest.raises(MemberIdRequiredError) as given:
        enter(require_member_id=True)
    pending = given.value.details["member_id"]  # a member-to-be counts: the group is full
    with pytest.raises(GroupMaxSizeReachedError):
        enter()
    enter(member_id=pending)  # the member-to-be joins with its id
    again, _ = enter(instance_id="i-a")  # a static member's new process takes its own place
    assert again.member_id != first and len(g.members) == 2
