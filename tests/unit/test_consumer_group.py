"""KIP-848 consumer groups (delta_log.core.consumer_group): Kafka's reconciliation rules, step by
step, with the heartbeats a client sends."""

from __future__ import annotations

import pytest

from delta_log.core.consumer_group import (
    GROUP_STABLE,
    RECONCILING,
    STABLE,
    STATIC_LEAVE_EPOCH,
    UNRELEASED,
    UNREVOKED,
    ConsumerGroup,
    Heartbeat,
    Topics,
)
from delta_log.errors import (
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupMaxSizeReachedError,
    InvalidGroupRequestError,
    InvalidRegularExpressionError,
    StaleMemberEpochError,
    UnknownMemberError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)

TOPICS = Topics(1, {"orders": 6})


def group() -> ConsumerGroup:
    return ConsumerGroup(group_id="g", session_timeout_ms=45_000, heartbeat_interval_ms=5_000)


def join(g: ConsumerGroup, member: str, now: float = 0.0, seen: Topics = TOPICS, **kw):
    fields = {"topics": ("orders",)} | kw
    return g.heartbeat(Heartbeat(member_id=member, epoch=0, rebalance_timeout_ms=30_000, **fields), now, seen)


def beat(g: ConsumerGroup, member: str, epoch: int, owned, now: float = 1.0, seen: Topics = TOPICS, **kw):
    owned = None if owned is None else {t: frozenset(ps) for t, ps in owned.items()}
    return g.heartbeat(Heartbeat(member_id=member, epoch=epoch, owned=owned, **kw), now, seen)


def count(assignment) -> int:
    return sum(len(ps) for ps in assignment.values())


def test_a_second_member_gets_partitions_only_after_the_first_revoked_them():
    g = group()
    a = join(g, "a")
    assert (a.epoch, count(a.assignment)) == (1, 6)
    b = join(g, "b")
    # b is at the new epoch, but every partition of its target is still a's: it waits for them
    assert b.epoch == 2 and count(b.assignment) == 0 and g.members["b"].state == UNRELEASED
    # a is asked to revoke three; it keeps its epoch until it has
    a2 = beat(g, "a", 1, a.assignment)
    assert a2.epoch == 1 and count(a2.assignment) == 3 and g.members["a"].state == UNREVOKED
    assert g.state == RECONCILING
    # b heartbeats meanwhile: still nothing to take
    assert beat(g, "b", 2, {}).assignment is None
    # a no longer owns them: it moves to the group's epoch, and b takes them at its next heartbeat
    a3 = beat(g, "a", 1, a2.assignment)
    assert a3.epoch == 2 and g.members["a"].state == STABLE
    b2 = beat(g, "b", 2, {})
    assert count(b2.assignment) == 3 and g.members["b"].state == STABLE
    assert set(a2.assignment["orders"]) | set(b2.assignment["orders"]) == set(range(6))
    assert not set(a2.assignment["orders"]) & set(b2.assignment["orders"])
    assert g.state == GROUP_STABLE


def test_epochs_fence_a_member_that_missed_its_assignment_and_a_rejoin_frees_its_partitions():
    g = group()
    a = join(g, "a")
    join(g, "b")
    with pytest.raises(FencedMemberEpochError):
        beat(g, "a", 7, a.assignment)
    # the previous epoch is accepted while it owns no more than its assignment (a lost answer)
    beat(g, "a", 1, a.assignment)
    assert beat(g, "a", 1, {}).epoch == 2
    kept = g.members["a"].assigned["orders"]
    assert beat(g, "a", 1, {"orders": kept}).epoch == 2
    with pytest.raises(FencedMemberEpochError):
        beat(g, "a", 1, {"orders": range(6)})
    # fenced, the client drops everything and joins again with epoch 0 under its id
    again = join(g, "a")
    assert again.epoch == g.assignment_epoch
    with pytest.raises(UnknownMemberError):
        beat(g, "nobody", 3, {})


def test_leaving_and_expiring_bump_the_epoch_and_free_the_partitions():
    g = group()
    a = join(g, "a")
    join(g, "b")
    beat(g, "a", 1, a.assignment)
    beat(g, "a", 1, {"orders": g.members["a"].assigned["orders"]})
    beat(g, "b", 2, {})
    epoch = g.epoch
    left = g.heartbeat(Heartbeat(member_id="b", epoch=-1), 2.0, TOPICS)
    assert left.epoch == -1 and "b" not in g.members and g.epoch == epoch + 1
    a2 = beat(g, "a", 2, {"orders": g.members["a"].assigned["orders"]}, now=3.0)
    assert count(a2.assignment) == 6
    # a member silent longer than the session timeout is removed
    assert g.expire(3.0 + 46, TOPICS) == {"a": "no heartbeat for 46.0 s (session timeout 45000 ms)"}
    assert not g.members


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_removed():
    g = group()
    a = join(g, "a")
    join(g, "b")
    beat(g, "a", 1, a.assignment, now=1.0)
    assert g.members["a"].state == UNREVOKED
    assert g.expire(1.0 + 29, TOPICS) == {}
    beat(g, "b", 2, {}, now=20.0)  # b heartbeats; a heartbeats but never revokes
    beat(g, "a", 1, a.assignment, now=25.0)
    assert g.expire(1.0 + 31, TOPICS) == {"a": "its partitions not revoked within its rebalance timeout (30000 ms)"}
    assert count(beat(g, "b", 2, {}, now=32.0).assignment) == 6


def test_a_static_member_leaves_for_now_and_its_instance_takes_the_partitions_back():
    g = group()
    a = join(g, "a", instance_id="i-a")
    b = join(g, "b", instance_id="i-b")
    beat(g, "a", 1, a.assignment, instance_id="i-a")
    a2 = beat(g, "a", 1, {"orders": g.members["a"].assigned["orders"]}, instance_id="i-a")
    b2 = beat(g, "b", b.epoch, {}, instance_id="i-b")
    mine = b2.assignment
    epoch = g.epoch
    g.heartbeat(Heartbeat(member_id="b", epoch=STATIC_LEAVE_EPOCH, instance_id="i-b"), 2.0, TOPICS)
    assert g.epoch == epoch and g.members["b"].epoch == STATIC_LEAVE_EPOCH  # no rebalance
    assert count(beat(g, "a", a2.epoch, a2.assignment, instance_id="i-a").assignment or {}) == 0
    # the instance comes back as a new process: the same partitions, no rebalance
    back = join(g, "b-2", instance_id="i-b", now=3.0)
    assert back.assignment == mine and g.epoch == epoch and "b" not in g.members
    with pytest.raises(FencedInstanceIdError):
        beat(g, "b", b.epoch, {}, instance_id="i-b")
    with pytest.raises(UnreleasedInstanceIdError):
        join(g, "b-3", instance_id="i-b")


def test_regex_subscriptions_pick_up_topics_created_later_and_never_internal_ones():
    g = group()
    first = Topics(1, {"orders-eu": 2, "payments": 2, "__consumer_offsets": 50})
    a = join(g, "a", seen=first, topics=None, regex="orders-.*|__.*")
    assert set(a.assignment) == {"orders-eu"}
    later = Topics(2, {**first.counts, "orders-us": 3})
    a2 = beat(g, "a", a.epoch, a.assignment, seen=later)
    assert a2.epoch == a.epoch + 1 and {t: len(ps) for t, ps in a2.assignment.items()} == {
        "orders-eu": 2,
        "orders-us": 3,
    }
    with pytest.raises(InvalidRegularExpressionError):
        join(g, "b", seen=first, topics=None, regex="orders-(")


def test_assignors_are_chosen_by_name_and_range_lines_up_co_partitioned_topics():
    g = group()
    topics = Topics(1, {"left": 4, "right": 4})
    join(g, "a", seen=topics, topics=("left", "right"), assignor="range")
    join(g, "b", seen=topics, topics=("left", "right"), assignor="range")
    assert g.assignor == "range"
    for target in g.target.values():
        assert target["left"] == target["right"]
    with pytest.raises(UnsupportedAssignorError):
        join(g, "c", assignor="cooperative-sticky")
    with pytest.raises(InvalidGroupRequestError):
        g.heartbeat(Heartbeat(member_id="d", epoch=0, topics=("orders",)), 0.0, TOPICS)  # no rebalance timeout


def test_the_lag_assignor_gives_the_member_with_the_backlog_fewer_partitions():
    g = group()
    topics = Topics(1, {"t": 4})
    lag = {("t", 0): 1000, ("t", 1): 1, ("t", 2): 1, ("t", 3): 1}
    for m in ("a", "b"):
        g.heartbeat(
            Heartbeat(member_id=m, epoch=0, rebalance_timeout_ms=1, topics=("t",), assignor="lag"),
            0.0,
            topics,
            weights=lambda: lag,
        )
    sizes = sorted((len(p["t"]), 0 in p["t"]) for p in g.target.values())
    assert sizes == [(1, True), (3, False)]


def test_commits_need_the_members_current_epoch():
    g = group()
    a = join(g, "a")
    g.check_commit("a", a.epoch, None)
    with pytest.raises(StaleMemberEpochError):
        g.check_commit("a", a.epoch - 1, None)
    with pytest.raises(UnknownMemberError):
        g.check_commit("zombie", 5, None)
    with pytest.raises(UnknownMemberError):
        g.check_commit(None, -1, None)  # the admin tools commit only while the group is empty
    g.heartbeat(Heartbeat(member_id="a", epoch=-1), 1.0, TOPICS)
    g.check_commit(None, -1, None)


def test_a_commit_at_an_epoch_since_the_partition_was_given_is_the_members_kip_1251():
    g = group()
    a = join(g, "a")
    join(g, "b")
    a2 = beat(g, "a", 1, a.assignment)  # revoke three
    kept = sorted(a2.assignment["orders"])
    beat(g, "a", 1, a2.assignment)  # revoked: a is at epoch 2 now
    assert g.members["a"].epoch == 2
    # a's answer with epoch 2 may not have arrived: its epoch-1 commit of a partition it kept is fine
    g.check_commit("a", 1, None, [("orders", kept[0])])
    b = beat(g, "b", 2, {})
    mine = sorted(b.assignment["orders"])
    g.check_commit("b", 2, None, [("orders", mine[0])])
    with pytest.raises(StaleMemberEpochError):  # given at epoch 2: an epoch-1 commit is a zombie's
        g.check_commit("b", 1, None, [("orders", mine[0])])
    with pytest.raises(StaleMemberEpochError):  # a partition a gave up: only at its current epoch
        g.check_commit("a", 1, None, [("orders", mine[0])])
    with pytest.raises(StaleMemberEpochError):
        g.check_commit("a", 3, None, [("orders", kept[0])])


# -- classic members (Kafka's online upgrade) ----------------------------------------------------
def classic_group() -> ConsumerGroup:
    """A classic group of two Kafka consumers at generation 4, three partitions each, upgraded."""
    from delta_log.core.group_rules import MemberState

    members = [
        MemberState(
            member_id=mid,
            instance_id=None,
            topics=frozenset({"orders"}),
            session_timeout_ms=10_000,
            last_heartbeat=0.0,
            rebalance_timeout_ms=30_000,
            assignment={"orders": parts},
            protocols=(("cooperative-sticky", b"\x00\x03"),),
            protocol_type="consumer",
        )
        for mid, parts in (("c1", [0, 1, 2]), ("c2", [3, 4, 5]))
    ]
    return ConsumerGroup.from_classic(
        "g", 4, members, topics=TOPICS, session_timeout_ms=45_000, heartbeat_interval_ms=5_000
    )


def classic_join(g: ConsumerGroup, member: str, owned, now: float = 1.0, topics: Topics = TOPICS):
    from delta_log.core.consumer_group import ClassicProtocol

    return g.classic_join(
        member_id=member,
        instance_id=None,
        topics=["orders"],
        owned={t: frozenset(ps) for t, ps in owned.items()},
        classic=ClassicProtocol(session_timeout_ms=10_000, protocols=(("cooperative-sticky", b"\x00\x03"),)),
        rebalance_timeout_ms=30_000,
        now=now,
        known_topics=topics,
    )


def test_an_upgraded_group_keeps_every_classic_members_partitions_at_its_generation():
    g = classic_group()
    assert (g.epoch, g.state) == (4, GROUP_STABLE)
    assert {m: (g.members[m].epoch, count(g.members[m].assigned)) for m in g.members} == {"c1": (4, 3), "c2": (4, 3)}
    assert g.classic_only
    # nothing moved: their heartbeats go on, their syncs give what they hold
    assert not g.classic_heartbeat("c1", None, 4, 1.0, None, topics=TOPICS)
    assert g.classic_sync("c2", None, 4, None) == {"orders": frozenset({3, 4, 5})}
    g.check_commit("c1", 4, None, [("orders", 0)])  # a classic member commits at its generation
    from delta_log.errors import FencedMemberError

    with pytest.raises(FencedMemberError):
        g.check_commit("c1", 3, None, [("orders", 0)])


def test_a_consumer_protocol_member_joins_and_the_classic_ones_rejoin_to_give_partitions_up():
    from delta_log.errors import FencedMemberError, RebalanceInProgressError

    g = classic_group()
    new = join(g, "n")
    assert new.epoch == 5 and count(new.assignment) == 0 and g.members["n"].state == UNRELEASED
    # the classic members learn of it from their heartbeat, and join again (cooperative: owning all)
    assert g.classic_heartbeat("c1", None, 4, 1.0, None, topics=TOPICS) is True
    with pytest.raises(RebalanceInProgressError):
        g.classic_sync("c1", None, 4, None)
    c1 = classic_join(g, "c1", {"orders": [0, 1, 2]})
    assert c1.state == UNREVOKED and c1.epoch == 4 and count(c1.assigned) == 2  # one to give up
    assert g.classic_sync("c1", None, 4, None) == c1.assigned  # the client revokes what is missing
    assert g.classic_heartbeat("c1", None, 4, 1.5, None, topics=TOPICS) is True  # still to revoke: join again
    c1 = classic_join(g, "c1", c1.assigned)
    assert (c1.state, c1.epoch, count(c1.assigned)) == (STABLE, 5, 2)
    with pytest.raises(FencedMemberError):
        g.classic_heartbeat("c1", None, 4, 2.0, None, topics=TOPICS)  # an old generation: ILLEGAL_GENERATION
    c2 = classic_join(g, "c2", {"orders": [3, 4, 5]})
    c2 = classic_join(g, "c2", c2.assigned)
    assert (c2.epoch, count(c2.assigned)) == (5, 2)
    # the consumer-protocol member gets what both released
    n = beat(g, "n", 5, {})
    assert count(n.assignment) == 2 and g.state == GROUP_STABLE
    held = [p for m in g.members.values() for p in m.assigned.get("orders", ())]
    assert sorted(held) == list(range(6))


def test_a_classic_member_leaves_or_goes_silent_for_its_own_session_timeout():
    g = classic_group()
    assert g.classic_leave("c1", None, None) == "c1" and g.epoch == 5
    with pytest.raises(UnknownMemberError):
        g.classic_heartbeat("c1", None, 4, 1.0, None, topics=TOPICS)
    # c2's own session timeout is 10 s (the group's 45 s is for consumer-protocol members)
    assert g.expire(9.0, TOPICS) == {}
    assert list(g.expire(10.5, TOPICS)) == ["c2"]


def test_a_consumer_protocol_member_is_not_served_classic_requests():
    from delta_log.errors import InconsistentGroupProtocolError

    g = classic_group()
    join(g, "n")
    with pytest.raises(InconsistentGroupProtocolError):
        g.classic_heartbeat("n", None, 5, 1.0, None, topics=TOPICS)


def test_offset_fetches_from_a_member_need_its_current_epoch():
    g = group()
    a = join(g, "a")
    g.check_fetch(None, -1)  # the admin tools, a consumer outside group management
    g.check_fetch("a", a.epoch)
    with pytest.raises(StaleMemberEpochError):
        g.check_fetch("a", a.epoch - 1)
    with pytest.raises(UnknownMemberError):
        g.check_fetch("zombie", 1)


def test_a_new_member_beyond_the_groups_most_is_refused_and_known_ones_stay():
    g = group()
    g.max_size = 2
    join(g, "a")
    b = join(g, "b")
    with pytest.raises(GroupMaxSizeReachedError):
        join(g, "c")
    assert set(g.members) == {"a", "b"}
    join(g, "b")  # a member rejoining (epoch 0) is no new one
    beat(g, "b", b.epoch, None)
    g.heartbeat(Heartbeat(member_id="a", epoch=-1), 2.0, TOPICS)  # a leaves: room for c
    join(g, "c")
    assert set(g.members) == {"b", "c"}


def test_a_group_restored_from_its_snapshot_mid_reconciliation_goes_on_where_it_was():
    """A coordinator taking the group over (its snapshot, through JSON) serves the members at the
    epochs they hold: the revocation in progress completes, nobody is fenced or starts over."""
    import json

    g = group()
    a = join(g, "a")
    join(g, "b", instance_id="b-1", rack_id="r1")
    a2 = beat(g, "a", 1, a.assignment)  # a is asked to revoke three
    assert g.members["a"].state == UNREVOKED and g.state == RECONCILING
    snapshot = json.loads(json.dumps(g.snapshot()))
    taken = ConsumerGroup.restore("g", snapshot, now=100.0, session_timeout_ms=45_000, heartbeat_interval_ms=5_000)
    assert taken.snapshot() == g.snapshot() and taken.owners == g.owners and taken.state == RECONCILING
    assert taken.members["a"].revoke_deadline == 100.0 + taken.members["a"].rebalance_timeout_ms / 1000
    a3 = beat(taken, "a", 1, a2.assignment, now=101.0)  # a has revoked: it moves on
    b2 = beat(taken, "b", 2, {}, now=101.0, instance_id="b-1")
    assert a3.epoch == 2 and count(b2.assignment) == 3 and taken.state == GROUP_STABLE
    assert taken.members["b"].instance_id == "b-1" and taken.members["b"].rack_id == "r1"
    # and a classic member (an upgraded group) keeps its protocols
    c = classic_group()
    again = ConsumerGroup.restore(
        "g", json.loads(json.dumps(c.snapshot())), now=1.0, session_timeout_ms=45_000, heartbeat_interval_ms=5_000
    )
    assert again.snapshot() == c.snapshot()
    assert {m.classic for m in again.members.values()} == {m.classic for m in c.members.values()}


def test_the_last_consumer_protocol_member_leaving_downgrades_the_group_to_classic():
    """Kafka's online downgrade: with only classic members left, the group is a classic one again
    at the group epoch, its leader assigning, each member keeping its target, and a rebalance
    begun (they rejoin); not while a consumer-protocol member is in it, nor beyond the classic
    group's most members."""
    from delta_log.core.group_rules import PREPARING, leader_assigns
    from delta_log.core.group_state import GroupState

    g = classic_group()
    join(g, "new", now=1.0)  # a consumer-protocol member: the group stays a consumer group
    assert GroupState.downgraded(g, 2.0, max_size=10) is None
    g.heartbeat(Heartbeat(member_id="new", epoch=-1), 3.0, TOPICS)  # it leaves
    assert GroupState.downgraded(g, 4.0, max_size=1) is None  # two classic members: too many
    classic = GroupState.downgraded(g, 4.0, max_size=10)
    assert classic is not None
    assert (classic.generation, classic.state, leader_assigns(classic.assignor)) == (g.epoch, PREPARING, True)
    assert set(classic.members) == {"c1", "c2"}
    assert all(m.protocols == (("cooperative-sticky", b"\x00\x03"),) for m in classic.members.values())
    for m in classic.members.values():  # each keeps its target until the leader assigns again
        assert m.assignment == {t: sorted(ps) for t, ps in g.target[m.member_id].items()}
    assert all(not m.rejoined and m.session_timeout_ms == 10_000 for m in classic.members.values())


def test_classic_members_alone_learn_from_their_heartbeat_that_a_subscribed_topic_grew():
    """Where every member speaks the classic protocol (an upgraded group, HTTP members), a topic's
    new partitions still move the group epoch, as Kafka's coordinator does on new metadata."""
    g = classic_group()
    grown = Topics(TOPICS.version + 1, {**TOPICS.counts, "orders": 8})
    assert g.classic_heartbeat("c1", None, 4, 1.0, None, topics=grown) is True and g.epoch == 5
    c1 = classic_join(g, "c1", {"orders": [0, 1, 2]}, topics=grown)
    c2 = classic_join(g, "c2", {"orders": [3, 4, 5]}, topics=grown)
    c1 = classic_join(g, "c1", c1.assigned, topics=grown)
    assert (c1.epoch, c2.epoch) == (5, 5) and count(c1.assigned) + count(c2.assigned) == 8
