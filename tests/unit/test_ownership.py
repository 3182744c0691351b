from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.ownership import group_resource, owner


def test_no_members_no_owner():
    assert owner("group:g", []) is None


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6, unique=True), st.text(max_size=20))
def test_every_view_with_the_same_members_agrees(members, group):
    resource = group_resource(group)
    assert owner(resource, members) == owner(resource, list(reversed(members))) in members


def test_a_leaving_member_moves_only_its_own_groups():
    members = ["gw-a", "gw-b", "gw-c", "gw-d"]
    groups = [group_resource(f"g{i}") for i in range(400)]
    before = {g: owner(g, members) for g in groups}
    after = {g: owner(g, [m for m in members if m != "gw-b"]) for g in groups}
    moved = {g for g in groups if before[g] != after[g]}
    assert moved == {g for g in groups if before[g] == "gw-b"}
    assert 60 < len(moved) < 140  # about a quarter
