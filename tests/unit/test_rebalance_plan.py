"""plan_rebalance: expiry by persisted heartbeat, lag-aware reassignment, no churn when balanced."""

from delta_log.system.groups import REBALANCE_JOB, GroupRecord, MemberRecord
from jobs.rebalance import plan_rebalance

NOW = 1_000_000


def member(mid, assignment, *, hb=NOW, timeout=10_000, topics=("t",)):
    return MemberRecord(
        member_id=mid,
        instance_id=None,
        topics=topics,
        session_timeout_ms=timeout,
        assignment=assignment,
        last_heartbeat_ms=hb,
    )


def group(*members, generation=3):
    return {
        "g": GroupRecord(
            group="g", generation=generation, state="Stable", assignor="range", members=members, updated_at_us=0
        )
    }


def test_a_member_silent_past_its_session_timeout_is_expired_and_its_partitions_move():
    groups = group(member("a", {"t": [0, 1]}), member("b", {"t": [2, 3]}, hb=NOW - 10_001))
    [plan] = plan_rebalance(groups, now_ms=NOW, partitions={"t": 4}, lag={})
    assert plan.action == "expire" and plan.expired == ["b"]
    assert plan.record is not None and plan.record.generation == 4 and plan.record.writer == REBALANCE_JOB
    [a] = plan.record.members
    assert a.member_id == "a" and a.assignment == {"t": [0, 1, 2, 3]}
    assert plan.moved == 2


def test_grace_keeps_a_member_whose_heartbeat_is_only_late_by_the_persist_interval():
    groups = group(member("a", {"t": [0]}), member("b", {"t": [1]}, hb=NOW - 12_000))
    [plan] = plan_rebalance(groups, now_ms=NOW, partitions={"t": 2}, lag={}, grace_ms=6_000)
    assert plan.action == "none" and plan.record is None


def test_all_members_dead_leaves_an_empty_group():
    groups = group(member("a", {"t": [0]}, hb=0))
    [plan] = plan_rebalance(groups, now_ms=NOW, partitions={"t": 1}, lag={})
    assert plan.record is not None and plan.record.state == "Empty" and plan.record.members == ()


def test_lag_imbalance_moves_partitions_to_balance_lag_not_counts():
    # a owns the two partitions with a backlog, b two idle ones: equal counts, unequal work
    groups = group(member("a", {"t": [0, 1]}), member("b", {"t": [2, 3]}))
    lag = {("t", 0): 50_000, ("t", 1): 40_000, ("t", 2): 0, ("t", 3): 0}
    [plan] = plan_rebalance(groups, now_ms=NOW, partitions={"t": 4}, lag=lag, imbalance=2.0, min_lag=1000)
    assert plan.action == "balance" and plan.expired == []
    assert plan.lag_before == {"a": 90_000, "b": 0}
    assert max(plan.lag_after.values()) == 50_000  # the best split of {50k, 40k, 0, 0}
    assert plan.record is not None and plan.record.generation == 4


def test_balanced_or_small_differences_are_left_alone():
    groups = group(member("a", {"t": [0]}), member("b", {"t": [1]}))
    assert plan_rebalance(groups, now_ms=NOW, partitions={"t": 2}, lag={("t", 0): 900, ("t", 1): 0})[0].action == "none"
    lag = {("t", 0): 5000, ("t", 1): 4000}
    assert plan_rebalance(groups, now_ms=NOW, partitions={"t": 2}, lag=lag)[0].action == "none"


def test_an_imbalance_no_assignment_can_improve_is_not_churned():
    groups = group(member("a", {"t": [0]}), member("b", {"t": [1]}))
    [plan] = plan_rebalance(groups, now_ms=NOW, partitions={"t": 2}, lag={("t", 0): 100_000, ("t", 1): 0})
    assert plan.action == "none"


def test_partitions_added_to_a_topic_get_an_owner():
    groups = group(member("a", {"t": [0]}), member("b", {"t": [1]}))
    [plan] = plan_rebalance(groups, now_ms=NOW, partitions={"t": 4}, lag={})
    assert plan.action == "balance" and plan.record is not None
    owned = sorted(p for m in plan.record.members for p in m.assignment.get("t", []))
    assert owned == [0, 1, 2, 3]
    assert plan.moved == 2  # only the new partitions


def test_groups_in_a_rebalance_or_empty_are_skipped():
    rec = GroupRecord(group="g", generation=1, state="Empty", assignor="range", members=(), updated_at_us=0)
    assert plan_rebalance({"g": rec}, now_ms=NOW, partitions={}, lag={}) == []
