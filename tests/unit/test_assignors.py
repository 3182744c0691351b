import pytest
from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.assignors import ASSIGNORS, assign
from delta_log.errors import UnknownAssignorError

topics_st = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(1, 12), min_size=1)


@st.composite
def groups(draw):
    partitions = draw(topics_st)
    names = draw(st.lists(st.text("mnopq", min_size=1, max_size=3), min_size=1, max_size=6, unique=True))
    members = {m: frozenset(draw(st.sets(st.sampled_from(sorted(partitions)), min_size=1))) for m in names}
    return members, partitions


@pytest.mark.parametrize("name", ASSIGNORS)
@given(g=groups())
def test_every_partition_exactly_once(name, g):
    members, partitions = g
    out = assign(name, members, partitions)
    owners = {}
    for m, tps in out.items():
        for t, ps in tps.items():
            assert t in members[m]  # only to subscribers
            for p in ps:
                assert (t, p) not in owners
                owners[(t, p)] = m
    expected = {(t, p) for t, n in partitions.items() for p in range(n) if any(t in s for s in members.values())}
    assert set(owners) == expected


@given(g=groups(), data=st.data())
def test_sticky_moves_the_minimum_when_a_member_leaves(g, data):
    members, partitions = g
    if len(members) < 2:
        return
    before = assign("sticky", members, partitions)
    gone = data.draw(st.sampled_from(sorted(members)))
    rest = {m: s for m, s in members.items() if m != gone}
    after = assign("sticky", rest, partitions, before)
    # only the departed member's partitions change owner: survivors keep all of theirs
    before_owner = {(t, p): m for m, tps in before.items() for t, ps in tps.items() for p in ps}
    after_owner = {(t, p): m for m, tps in after.items() for t, ps in tps.items() for p in ps}
    if all(s == frozenset(partitions) for s in members.values()):
        assert all(after_owner[tp] == m for tp, m in before_owner.items() if m != gone)


def test_sticky_balances_lag_when_weighted():
    members = {"x": frozenset({"t"}), "y": frozenset({"t"})}
    out = assign("sticky", members, {"t": 4}, weights={("t", 0): 100, ("t", 1): 1, ("t", 2): 1, ("t", 3): 98})
    lag = {m: sum({0: 100, 1: 1, 2: 1, 3: 98}[p] for p in tps.get("t", [])) for m, tps in out.items()}
    assert abs(lag["x"] - lag["y"]) <= 2


def test_range_matches_kafka():
    members = {"c1": frozenset({"t"}), "c2": frozenset({"t"})}
    assert assign("range", members, {"t": 5}) == {"c1": {"t": [0, 1, 2]}, "c2": {"t": [3, 4]}}
    assert assign("roundrobin", members, {"t": 5}) == {"c1": {"t": [0, 2, 4]}, "c2": {"t": [1, 3]}}


def test_unknown_assignor():
    with pytest.raises(UnknownAssignorError):
        assign("magic", {"m": frozenset({"t"})}, {"t": 1})
