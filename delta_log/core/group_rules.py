"""Pure consumer-group rules: group states, who may commit, who expired, how to validate a join.

No I/O, no clock: callers pass `now` (monotonic seconds). Shared by the HTTP coordinator
(consumer_api), the rebalance job and the group state machine (delta_log.core.group_state).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from delta_log.core.assignors import ASSIGNORS
from delta_log.errors import FencedMemberError, InvalidGroupError, UnknownAssignorError, UnknownMemberError

#: Kafka's group states (the ones this coordinator uses). CompletingRebalance only in groups whose
#: leader assigns: the generation is out, the leader's SyncGroup is not yet in.
EMPTY, PREPARING, AWAITING_SYNC, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
#: a deleted group (Kafka's DeleteGroups), as its last persisted record says
DEAD = "Dead"
GroupStateName = Literal["Empty", "PreparingRebalance", "CompletingRebalance", "Stable"]

#: The `assignor` of a group whose leader member assigns (Kafka's classic protocol as Kafka runs it:
#: Connect's workers, Kafka Streams, any assignor the coordinator does not know), with the Kafka
#: protocol type after the prefix: "kafka:connect", "kafka:consumer".
LEADER_ASSIGNS = "kafka:"


def leader_assignor(protocol_type: str) -> str:
    return LEADER_ASSIGNS + protocol_type


def leader_assigns(assignor: str) -> bool:
    return assignor.startswith(LEADER_ASSIGNS)


def protocol_type_of(assignor: str) -> str:
    """Kafka's protocol type of a group: a leader-assigned group's own, else "consumer"."""
    return assignor[len(LEADER_ASSIGNS) :] if leader_assigns(assignor) else "consumer"


MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 300_000
MAX_GROUP_ID_LENGTH = 255
#: validate_group_id as one regular expression, for the OpenAPI document (with maxLength).
GROUP_ID_PATTERN = r"^[^/\\\x00]+$"
MAX_SUBSCRIBED_TOPICS = 1000
_INSTANCE_ID = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


@dataclass(slots=True, kw_only=True)
class MemberState:
    member_id: str
    instance_id: str | None
    topics: frozenset[str]
    session_timeout_ms: int
    last_heartbeat: float  # monotonic seconds
    #: how long a rebalance waits for this member to rejoin (Kafka's max.poll.interval.ms, sent in
    #: JoinGroup); 0: its session timeout (HTTP members, JoinGroup v0)
    rebalance_timeout_ms: int = 0
    assignment: dict[str, list[int]] = field(default_factory=dict)
    rejoined: bool = True
    #: who joined it (the API key's principal): only they heartbeat, leave or commit for it
    principal: str = ""
    #: in a group whose leader assigns: the Kafka protocols it offers, (name, metadata), in its
    #: order of preference, and the opaque assignment its leader gave it
    protocols: tuple[tuple[str, bytes], ...] = ()
    leader_assignment: bytes = b""
    #: what it owned in the generation before (a cooperative member commits it while giving it up)
    previous_assignment: dict[str, list[int]] = field(default_factory=dict)
    #: who the client says it is and where it connects from (Kafka's client.id and client host; over
    #: HTTP the join's `client_id`, else its User-Agent, and its address): DescribeGroups shows them
    client_id: str = ""
    client_host: str = ""
    #: Kafka's JoinGroup protocol type ("consumer": a Kafka consumer; empty: an HTTP member)
    protocol_type: str = ""

    def owns(self, topic: str, partition: int) -> bool:
        return partition in self.assignment.get(topic, ())


def validate_group_id(group: object) -> str:
    """The one rule for group ids, everywhere they enter. Raises: InvalidGroupError."""
    if not isinstance(group, str) or not 1 <= len(group) <= MAX_GROUP_ID_LENGTH or any(c in group for c in "/\\\x00"):
        raise InvalidGroupError(
            f"Group ids are 1-{MAX_GROUP_ID_LENGTH} characters without '/', '\\' or NUL.", group=str(group)[:300]
        )
    return group


def validate_instance_id(instance_id: str | None) -> str | None:
    """Static membership ids follow Kafka's rule for names: 1-249 of [a-zA-Z0-9._-]. Raises: InvalidGroupError."""
    if instance_id is None:
        return None
    if not isinstance(instance_id, str) or not _INSTANCE_ID.fullmatch(instance_id):
        raise InvalidGroupError(
            "group.instance.id (instance_id) must be 1-249 characters from [a-zA-Z0-9._-].",
            instance_id=str(instance_id)[:64],
        )
    return instance_id


def validate_join(assignor: str, session_timeout_ms: int, topics: Iterable[str]) -> list[str]:
    """The subscription, de-duplicated and sorted (empty only where the leader assigns something
    other than topics, as Connect's workers do). Raises: UnknownAssignorError, InvalidGroupError."""
    if assignor not in ASSIGNORS and not leader_assigns(assignor):
        raise UnknownAssignorError(f"Unknown assignor {assignor!r}.", assignor=assignor)
    if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        raise InvalidGroupError(
            f"session_timeout_ms must be between {MIN_SESSION_TIMEOUT_MS} and {MAX_SESSION_TIMEOUT_MS}.",
            session_timeout_ms=session_timeout_ms,
        )
    unique = sorted(set(topics))
    if not unique and protocol_type_of(assignor) == "consumer":
        raise InvalidGroupError("Subscribe to at least one topic.")
    if len(unique) > MAX_SUBSCRIBED_TOPICS:
        raise InvalidGroupError(
            f"A member subscribes to at most {MAX_SUBSCRIBED_TOPICS} topics; got {len(unique)}.", topics=len(unique)
        )
    return unique


def check_commit(
    members: Mapping[str, MemberState],
    generation: int,
    *,
    member_id: str | None,
    member_generation: int | None,
    partitions: Iterable[tuple[str, int]],
) -> None:
    """Only the current generation's owner of a partition may commit its offset (invariant 5).

    A commit without member id and generation is a standalone commit (an admin tool, a Spark job
    with groupId), accepted only while the group has no members.

    Raises: UnknownMemberError, FencedMemberError.
    """
    if member_id is None and member_generation is None:
        if members:
            raise FencedMemberError(
                "The group has active members; only they may commit (send member_id and generation).",
                members=len(members),
            )
        return
    member = members.get(member_id or "")
    if member is None:
        raise UnknownMemberError(f"Member {member_id!r} is not in the group.", member_id=member_id)

    if member_generation != generation:
        raise FencedMemberError(
            f"Generation {member_generation} is not the group's current generation {generation}.",
            member_id=member_id,
            generation=member_generation,
            current_generation=generation,
        )
    for topic, partition in partitions:
        if not member.owns(topic, partition):
            raise FencedMemberError(
                f"Member {member_id!r} does not own {topic}-{partition} in generation {generation}.",
                member_id=member_id,
                topic=topic,
                partition=partition,
            )


def expired(members: Mapping[str, MemberState], now: float) -> list[str]:
    """Members whose session timed out."""
    return sorted(m.member_id for m in members.values() if now - m.last_heartbeat > m.session_timeout_ms / 1000)
