import pytest

from delta_log.core.group_config import HEARTBEAT_INTERVAL, SESSION_TIMEOUT, GroupConfigBounds, apply_updates
from delta_log.errors import InvalidConfigError

BOUNDS = GroupConfigBounds.of(45_000, 5_000, (45_000, 60_000), (5_000, 15_000))


def test_overrides_are_set_reset_and_applied_over_the_defaults():
    got = apply_updates({}, {SESSION_TIMEOUT: "50000", HEARTBEAT_INTERVAL: "6000"}, BOUNDS)
    assert got == {SESSION_TIMEOUT: "50000", HEARTBEAT_INTERVAL: "6000"}
    assert BOUNDS.effective(got) == (50_000, 6_000)
    back = apply_updates(got, {HEARTBEAT_INTERVAL: None}, BOUNDS)
    assert back == {SESSION_TIMEOUT: "50000"} and BOUNDS.effective(back) == (50_000, 5_000)


@pytest.mark.parametrize(
    "updates",
    [
        {SESSION_TIMEOUT: "44999"},  # below the gateway's least
        {SESSION_TIMEOUT: "60001"},
        {HEARTBEAT_INTERVAL: "15001"},
        {SESSION_TIMEOUT: "lots"},
        {"share.session.timeout.ms": "45000"},  # share groups' keys: no share groups here
        {"retention.ms": "1"},
    ],
)
def test_values_outside_the_bounds_and_unknown_keys_are_refused(updates):
    with pytest.raises(InvalidConfigError):
        apply_updates({}, updates, BOUNDS)


def test_the_heartbeat_interval_stays_below_the_session_timeout():
    wide = GroupConfigBounds.of(6_000, 500, (1_000, 60_000), (100, 15_000))
    with pytest.raises(InvalidConfigError, match="below"):
        apply_updates({}, {HEARTBEAT_INTERVAL: "6000"}, wide)
    assert apply_updates({}, {HEARTBEAT_INTERVAL: "5999"}, wide) == {HEARTBEAT_INTERVAL: "5999"}


def test_the_bounds_always_include_the_defaults():
    fast = GroupConfigBounds.of(6_000, 500, (45_000, 60_000), (5_000, 15_000))
    assert fast.range_of(SESSION_TIMEOUT) == (6_000, 60_000) and fast.range_of(HEARTBEAT_INTERVAL) == (500, 15_000)
