"""Group configs (Kafka's dynamic GROUP configs, KIP-848): per group overrides of the gateway's
consumer-protocol defaults, set with IncrementalAlterConfigs on a GROUP resource (Kafka's
`kafka-configs --entity-type groups`), kept in `_system/group_configs` (delta_log.system
.group_configs). Pure validation, no I/O.

- `consumer.session.timeout.ms`: a consumer-protocol member silent this long is removed;
- `consumer.heartbeat.interval.ms`: how often the members heartbeat (told to them in every answer).

Each must lie within the gateway's bounds (Kafka's `group.consumer.min/max.session.timeout.ms`
and `group.consumer.min/max.heartbeat.interval.ms`), and a group's heartbeat interval must stay
below its session timeout, as Kafka checks. Other keys (share and streams groups') are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from delta_log.errors import InvalidConfigError

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"
GROUP_CONFIG_KEYS = (SESSION_TIMEOUT, HEARTBEAT_INTERVAL)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfigBounds:
    """The gateway's defaults and bounds of consumer-protocol groups' timing (settings.server)."""

    session_timeout_ms: int
    heartbeat_interval_ms: int
    min_session_timeout_ms: int
    max_session_timeout_ms: int
    min_heartbeat_interval_ms: int
    max_heartbeat_interval_ms: int

    @classmethod
    def of(
        cls,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        session_range: tuple[int, int],
        heartbeat_range: tuple[int, int],
    ) -> GroupConfigBounds:
        """The defaults, and bounds widened to include them."""
        return cls(
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            min_session_timeout_ms=min(session_range[0], session_timeout_ms),
            max_session_timeout_ms=max(session_range[1], session_timeout_ms),
            min_heartbeat_interval_ms=min(heartbeat_range[0], heartbeat_interval_ms),
            max_heartbeat_interval_ms=max(heartbeat_range[1], heartbeat_interval_ms),
        )

    def defaults(self) -> dict[str, str]:
        return {SESSION_TIMEOUT: str(self.session_timeout_ms), HEARTBEAT_INTERVAL: str(self.heartbeat_interval_ms)}

    def range_of(self, key: str) -> tuple[int, int]:
        if key == SESSION_TIMEOUT:
            return self.min_session_timeout_ms, self.max_session_timeout_ms
        return self.min_heartbeat_interval_ms, self.max_heartbeat_interval_ms

    def effective(self, overrides: Mapping[str, str]) -> tuple[int, int]:
        """(session timeout, heartbeat interval) of a group with these overrides."""
        values = self.defaults() | dict(overrides)
        return int(values[SESSION_TIMEOUT]), int(values[HEARTBEAT_INTERVAL])


def apply_updates(
    current: Mapping[str, str], updates: Mapping[str, str | None], bounds: GroupConfigBounds
) -> dict[str, str]:
    """A group's overrides after `updates` (a value of None removes the key's override).

    Raises: InvalidConfigError for an unknown key, a value that is not an integer within the
    gateway's bounds, or a heartbeat interval not below the session timeout."""
    out = dict(current)
    for key, value in updates.items():
        if key not in GROUP_CONFIG_KEYS:
            raise InvalidConfigError(
                f"Unknown group config {key!r}; consumer groups take {', '.join(GROUP_CONFIG_KEYS)}.", key=key
            )
        if value is None:
            out.pop(key, None)
            continue
        low, high = bounds.range_of(key)
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = None
        if number is None or not low <= number <= high:
            raise InvalidConfigError(
                f"{key} must be an integer between {low} and {high} (the gateway's bounds); got {value!r}.", key=key
            )
        out[key] = str(number)
    session, heartbeat = bounds.effective(out)
    if heartbeat >= session:
        raise InvalidConfigError(
            f"{HEARTBEAT_INTERVAL} ({heartbeat}) must be below {SESSION_TIMEOUT} ({session}).", key=HEARTBEAT_INTERVAL
        )
    return out
