"""Consumer groups, whichever door asked: Kafka's ACLs checked here, then the one coordinator
(broker.coordinator) acts.

- READ on the group, and consume on each topic, to join, heartbeat, leave and commit; a member is
  heartbeated, left or committed for only with the key that joined it;
- DESCRIBE on the group to describe it and read its offsets, showing only the topics the key may
  describe; listings show only the groups it may describe;
- READ on the group plus admin on the topic to reset offsets; admin on the group to delete it or
  its offsets (Kafka's DELETE), with consume on the topics whose offsets go.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.coordinator import GroupCoordinator, GroupLag, GroupSummary, HeartbeatResult, JoinResult
from delta_log.core.acl import Principal, authorize, authorize_group
from delta_log.core.consumer_group import ConsumerGroup, Heartbeat, HeartbeatAnswer
from delta_log.core.group_rules import STABLE
from delta_log.core.group_state import GroupState
from delta_log.core.paging import page_of
from delta_log.errors import (
    FencedMemberError,
    InvalidOffsetError,
    RebalanceInProgressError,
    TopiclakeError,
    UnknownGroupError,
)
from delta_log.log.reader import OffsetSpec
from delta_log.registry import TopicRegistry
from delta_log.system.offsets import OffsetCommit, committed_history
from delta_log.table.time_travel import high_watermark_history


def owner_of(principal: Principal) -> str | None:
    """Who owns the members this caller joins (None while auth is off: no ownership checks)."""
    return None if principal.anonymous else principal.name


async def join(
    coordinator: GroupCoordinator,
    principal: Principal,
    group: str,
    *,
    topics: list[str],
    member_id: str | None,
    instance_id: str | None,
    session_timeout_ms: int,
    assignor: str,
    protocols: Sequence[tuple[str, bytes]] = (),
    missing_topics_ok: bool = False,
    client: tuple[str, str] = ("", ""),
    rebalance_timeout_ms: int = 0,
    require_member_id: bool = False,
    protocol_type: str = "",
    embedded: Sequence[tuple[str, bytes]] = (),
    owned: Mapping[str, Sequence[int]] | None = None,
    group_protocol: str = "classic",
) -> JoinResult:
    """Join (or rejoin) and wait for the group's next generation (in a consumer-protocol group:
    one reconciliation step, at once).

    Raises: AuthorizationError, and as GroupCoordinator.join."""
    authorize_group(principal, "read", group)
    for t in topics:
        authorize(principal, "consume", t)
    return await coordinator.join(
        group,
        topics=topics,
        member_id=member_id,
        instance_id=instance_id,
        session_timeout_ms=session_timeout_ms,
        assignor=assignor,
        principal=owner_of(principal),
        protocols=protocols,
        missing_topics_ok=missing_topics_ok,
        client=client,
        rebalance_timeout_ms=rebalance_timeout_ms,
        require_member_id=require_member_id,
        protocol_type=protocol_type,
        embedded=embedded,
        owned=owned,
        group_protocol=group_protocol,
    )


def classic_group(coordinator: GroupCoordinator, group: str) -> GroupState | None:
    """The classic group of that id this gateway holds now (None: none here, or a
    consumer-protocol group): what decides how a JoinGroup or SyncGroup is served."""
    return coordinator.groups.get(group)


async def topic_ids(coordinator: GroupCoordinator) -> Mapping[str, uuid.UUID]:
    """Every topic's id, as consumer-protocol groups name partitions (read afresh at most once a
    second)."""
    await coordinator.topics()
    return coordinator.topic_ids()


async def held_groups(coordinator: GroupCoordinator) -> set[str]:
    """The groups with a coordinator's state: every classic group persisted in the root, and the
    groups of either protocol live on this gateway."""
    persisted = await asyncio.to_thread(coordinator.store.load)
    return set(persisted) | set(coordinator.groups) | set(coordinator.consumer_groups)


def known_topic_ids(coordinator: GroupCoordinator) -> Mapping[str, uuid.UUID]:
    """Every topic's id as the coordinator last read them (no I/O)."""
    return coordinator.topic_ids()


async def sync(
    coordinator: GroupCoordinator,
    principal: Principal,
    group: str,
    member_id: str,
    generation: int,
    assignments: Mapping[str, tuple[bytes, dict[str, list[int]]]],
    *,
    instance_id: str | None = None,
) -> bytes:
    """Kafka's SyncGroup where the leader assigns: the member's assignment, once its leader's is in.

    Raises: AuthorizationError, and as GroupCoordinator.sync_group."""
    authorize_group(principal, "read", group)
    return await coordinator.sync_group(
        group, member_id, generation, assignments, principal=owner_of(principal), instance_id=instance_id
    )


async def heartbeat(
    coordinator: GroupCoordinator,
    principal: Principal,
    group: str,
    member_id: str,
    generation: int,
    *,
    instance_id: str | None = None,
) -> HeartbeatResult:
    """Raises: AuthorizationError, and as GroupCoordinator.heartbeat."""
    authorize_group(principal, "read", group)
    return await coordinator.heartbeat(
        group, member_id, generation, principal=owner_of(principal), instance_id=instance_id
    )


async def consumer_heartbeat(
    coordinator: GroupCoordinator, principal: Principal, group: str, hb: Heartbeat
) -> tuple[HeartbeatAnswer, ConsumerGroup]:
    """Kafka's ConsumerGroupHeartbeat (KIP-848): READ on the group, consume on each topic named;
    a regular expression matches only topics the key may consume.

    Raises: AuthorizationError, and as GroupCoordinator.consumer_heartbeat."""
    authorize_group(principal, "read", group)
    for t in hb.topics or ():
        authorize(principal, "consume", t)
    readable = None if principal.anonymous else (lambda topic: principal.allows("consume", topic))
    return await coordinator.consumer_heartbeat(group, hb, principal=owner_of(principal), readable=readable)


async def consumer_groups(
    coordinator: GroupCoordinator, principal: Principal, names: Sequence[str]
) -> list[ConsumerGroup | TopiclakeError]:
    """Kafka's ConsumerGroupDescribe: each named consumer-protocol group, or why it is not described
    (AuthorizationError without DESCRIBE on it; UnknownGroupError for no such group, or a classic
    one). Members are shown to the keys that may describe the group, as Kafka shows them."""
    out: list[ConsumerGroup | TopiclakeError] = []
    for name in names:
        try:
            authorize_group(principal, "describe", name)
            await coordinator.restored(name)
            out.append(coordinator.consumer_group(name))
        except TopiclakeError as exc:
            out.append(exc)
    return out


async def leave(
    coordinator: GroupCoordinator, principal: Principal, group: str, member_id: str, *, instance_id: str | None = None
) -> None:
    """Raises: AuthorizationError, and as GroupCoordinator.leave."""
    authorize_group(principal, "read", group)
    await coordinator.leave(group, member_id, principal=owner_of(principal), instance_id=instance_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Offset:
    topic: str
    partition: int
    offset: int
    metadata: str = ""


async def commit(
    coordinator: GroupCoordinator,
    principal: Principal,
    group: str,
    offsets: Sequence[Offset],
    *,
    member_id: str | None,
    generation: int | None,
    skip_denied: bool = False,
) -> set[str]:
    """Durably commit offsets for a member of the current generation (or, without one, for an
    empty group). The key needs consume on every topic: a denied topic refuses the request, or
    with `skip_denied` (Kafka answers per partition) is left out; returns the topics left out.

    Raises: AuthorizationError, and as GroupCoordinator.commit."""
    authorize_group(principal, "read", group)
    denied = {o.topic for o in offsets if not principal.allows("consume", o.topic)}
    if denied and not skip_denied:
        authorize(principal, "consume", sorted(denied)[0])
    now_us = int(time.time() * 1e6)
    commits = [
        OffsetCommit(
            group=group,
            topic=o.topic,
            partition=o.partition,
            offset=o.offset,
            metadata=o.metadata,
            member_id=member_id or "",
            generation=generation if generation is not None else -1,
            commit_timestamp_us=now_us,
        )
        for o in offsets
        if o.topic not in denied
    ]
    if commits or not offsets:  # an empty commit still checks the group and the member
        await coordinator.commit(
            group, commits, member_id=member_id, generation=generation, principal=owner_of(principal)
        )
    return denied


async def committed(
    coordinator: GroupCoordinator,
    principal: Principal,
    group: str,
    *,
    member_id: str | None = None,
    epoch: int = -1,
    missing_ok: bool = False,
) -> dict[tuple[str, int], OffsetCommit]:
    """The group's committed offsets, of the topics this key may describe; `member_id`, `epoch`:
    the member asking (GroupCoordinator.committed); `missing_ok`: a group that does not exist has
    none (Kafka's OffsetFetch) instead of raising UnknownGroupError.

    Raises: AuthorizationError, UnknownGroupError, UnknownMemberError, StaleMemberEpochError,
    FencedMemberError."""
    authorize_group(principal, "describe", group)
    try:
        found = await coordinator.committed(group, member_id=member_id, epoch=epoch)
    except UnknownGroupError:
        if not missing_ok:
            raise
        return {}
    return {k: c for k, c in found.items() if principal.allows("describe", k[0])}


async def summaries(
    coordinator: GroupCoordinator, principal: Principal, *, search: str = "", after: str = "", limit: int | None = None
) -> tuple[list[GroupSummary], str | None]:
    """The groups this key may describe, by name: a page of them (delta_log.core.paging), and the
    name to ask `after` next (None: no more)."""
    visible = (s for s in await coordinator.summaries() if principal.allows_group("describe", s.group))
    return page_of(visible, lambda s: s.group, search=search, after=after, limit=limit)


async def describe(
    coordinator: GroupCoordinator, principal: Principal, group: str
) -> tuple[GroupState, list[GroupLag]]:
    """The group and its lag per partition, of the topics this key may describe (faces show the
    members' subscriptions and assignments of those topics only).

    Raises: AuthorizationError, UnknownGroupError, NotCoordinatorError."""
    authorize_group(principal, "describe", group)
    return await coordinator.describe(group, lambda topic: principal.allows("describe", topic))


async def describe_classic(coordinator: GroupCoordinator, principal: Principal, group: str) -> GroupState | None:
    """The group as Kafka's DescribeGroups shows it: None for one that does not exist, or that
    is a consumer-protocol group (Kafka describes both as Dead there).

    Raises: AuthorizationError, NotCoordinatorError."""
    if group in coordinator.consumer_groups:
        authorize_group(principal, "describe", group)
        return None
    try:
        g, _lag = await describe(coordinator, principal, group)
    except UnknownGroupError:
        return None
    return g


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberView:
    """A member as a key may see it: only the topics it may describe."""

    member_id: str
    instance_id: str | None
    topics: list[str]
    assignment: dict[str, list[int]]
    session_timeout_ms: int
    #: where the leader assigns: the member's metadata for the group's protocol and the assignment
    #: its leader gave it, as Kafka's opaque bytes; None where the key may not see every topic they
    #: name (the faces then show the cut topics and assignment instead)
    leader_metadata: bytes | None = None
    leader_assignment: bytes | None = None
    client_id: str = ""
    client_host: str = ""


def visible_members(principal: Principal, g: GroupState) -> list[MemberView]:
    """The group's members, their subscriptions and assignments cut to the topics `principal` may
    describe (what describing a group shows, whichever door)."""
    out = []
    for m in g.members.values():
        named = set(m.topics) | set(m.assignment)
        whole = g.leader_assigns and all(principal.allows("describe", t) for t in named)
        out.append(
            MemberView(
                member_id=m.member_id,
                instance_id=m.instance_id,
                topics=sorted(t for t in m.topics if principal.allows("describe", t)),
                assignment={t: ps for t, ps in m.assignment.items() if principal.allows("describe", t)},
                session_timeout_ms=m.session_timeout_ms,
                leader_metadata=dict(m.protocols).get(g.protocol or "", b"") if whole else None,
                leader_assignment=m.leader_assignment if whole else None,
                client_id=m.client_id,
                client_host=m.client_host,
            )
        )
    return out


async def reset(
    coordinator: GroupCoordinator,
    principal: Principal,
    group: str,
    topic: str,
    to: OffsetSpec,
    *,
    timestamp: int | None = None,
    offset: int | None = None,
    partitions: list[int] | None = None,
) -> dict[int, int]:
    """Move a group's committed offsets of `topic` while it has no members.

    Raises: AuthorizationError, and as GroupCoordinator.reset."""
    authorize_group(principal, "read", group)
    authorize(principal, "admin", topic)
    return await coordinator.reset(group, topic, to, timestamp=timestamp, offset=offset, partitions=partitions)


async def delete_group(coordinator: GroupCoordinator, principal: Principal, group: str) -> None:
    """Raises: AuthorizationError, and as GroupCoordinator.delete_group."""
    authorize_group(principal, "admin", group)
    await coordinator.delete_group(group)


async def delete_offsets(
    coordinator: GroupCoordinator, principal: Principal, group: str, partitions: list[tuple[str, int]]
) -> set[str]:
    """Forget committed offsets (Kafka's OffsetDelete); topics the key may not consume are left
    out and returned. Raises: AuthorizationError, and as GroupCoordinator.delete_offsets."""
    authorize_group(principal, "admin", group)
    denied = {t for t, _ in partitions if not principal.allows("consume", t)}
    wanted = [(t, p) for t, p in partitions if t not in denied]
    if wanted:
        await coordinator.delete_offsets(group, wanted)
    return denied


def assignment(
    coordinator: GroupCoordinator, principal: Principal, group: str, member_id: str, generation: int
) -> dict[str, list[int]]:
    """A classic member's partitions at `generation`, for the key that joined it: Kafka's SyncGroup
    in a group whose coordinator assigns.

    Raises: AuthorizationError, UnknownGroupMemberError, UnknownMemberError,
    RebalanceInProgressError (the group is between generations), FencedMemberError (another
    generation: Kafka's ILLEGAL_GENERATION)."""
    authorize_group(principal, "read", group)
    g = coordinator.member_group(group)
    member = g.member(member_id, owner_of(principal))
    if g.state != STABLE:
        raise RebalanceInProgressError(f"Group {group!r} is rebalancing.", group=group)
    if generation != g.generation:
        raise FencedMemberError(
            f"Generation {generation} is not group {group!r}'s ({g.generation}).", group=group, generation=generation
        )
    return member.assignment


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionLag:
    topic: str
    partition: int
    committed_offset: int
    high_watermark: int
    lag: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LagPoint:
    """A group's lag at one moment: per partition, and in total (of the partitions known then)."""

    at_ms: int
    lag: int | None  # None: the history does not reach back this far, or nothing was committed then
    partitions: list[PartitionLag]


#: Points a lag history may ask for: each is a time travel of the offsets table and of each topic.
MAX_LAG_POINTS = 60


def lag_history(
    registry: TopicRegistry, principal: Principal, group: str, *, since_ms: int, until_ms: int, points: int
) -> list[LagPoint]:
    """The group's lag at `points` moments evenly from `since_ms` to `until_ms`, from the Delta
    history of the offsets table (what the group had committed then) and of each topic it
    committed to (the high watermark then): "what did this group read last Tuesday". Only the
    topics this key may describe. Blocking: call it in a thread.

    Raises: AuthorizationError, InvalidOffsetError (a bad window)."""
    authorize_group(principal, "describe", group)
    if not 1 <= points <= MAX_LAG_POINTS or not 0 <= since_ms < until_ms:
        raise InvalidOffsetError(
            f"Ask for 1-{MAX_LAG_POINTS} points over a window whose start (epoch ms) is before its end.",
            points=points,
        )
    step = (until_ms - since_ms) / max(points - 1, 1)
    times = [int(since_ms + i * step) for i in range(points)] if points > 1 else [until_ms]
    committed = committed_history(registry.storage, group, times)
    alive = set(registry.catalog.list_topics())
    topics = sorted({t for c in committed if c for t, _ in c if t in alive and principal.allows("describe", t)})
    watermarks = {
        t: high_watermark_history(registry.storage.open_topic(t), registry.reader(t).config.partitions, times)
        for t in topics
    }
    out = []
    for i, at in enumerate(times):
        offsets = committed[i]
        if not offsets:  # the history does not reach back this far, or the group had committed nothing yet
            out.append(LagPoint(at_ms=at, lag=None, partitions=[]))
            continue
        rows = []
        unknown = False
        for (t, p), offset in sorted(offsets.items()):
            if t not in watermarks:
                continue  # deleted since, or not this key's to describe
            hws = watermarks[t][i]
            if hws is None:  # the topic's log no longer reaches back this far
                unknown = True
            elif p in hws:
                rows.append(
                    PartitionLag(
                        topic=t,
                        partition=p,
                        committed_offset=offset,
                        high_watermark=hws[p],
                        lag=max(hws[p] - offset, 0),
                    )
                )
        # no partition counted (only deleted topics, or none this key may describe): no point, not 0
        total = None if unknown or not rows else sum(r.lag for r in rows)
        out.append(LagPoint(at_ms=at, lag=total, partitions=rows))
    return out


@dataclass(frozen=True, slots=True)
class GroupConfigEntry:
    """One of a group's configs: its value, and whether it is the gateway's default."""

    name: str
    value: str
    is_default: bool


async def describe_group_config(
    coordinator: GroupCoordinator, principal: Principal, group: str
) -> list[GroupConfigEntry]:
    """Every config of the group (Kafka's GROUP resource): its overrides, else the gateway's
    defaults. Raises: AuthorizationError (DESCRIBE on the group), InvalidGroupError,
    StorageUnavailableError."""
    authorize_group(principal, "describe", group)
    overrides = await coordinator.group_config(group)
    defaults = coordinator.config_bounds.defaults()
    return [
        GroupConfigEntry(name=k, value=overrides.get(k, v), is_default=k not in overrides)
        for k, v in sorted(defaults.items())
    ]


async def alter_group_config(
    coordinator: GroupCoordinator,
    principal: Principal,
    group: str,
    updates: Mapping[str, str | None],
    *,
    validate_only: bool = False,
) -> dict[str, str]:
    """Set (or, with None, reset) group configs; the group's overrides after. Raises:
    AuthorizationError (admin on the group: Kafka's ALTER_CONFIGS), InvalidGroupError,
    InvalidConfigError, StorageUnavailableError."""
    authorize_group(principal, "admin", group)
    return await coordinator.alter_group_config(group, updates, validate_only=validate_only)


async def classic_sync(
    coordinator: GroupCoordinator,
    principal: Principal,
    group: str,
    member_id: str,
    generation: int,
    instance_id: str | None,
) -> dict[str, list[int]] | None:
    """A classic member's SyncGroup in a consumer-protocol group: its partitions; None when the
    group is no consumer-protocol group here.

    Raises: AuthorizationError, StorageUnavailableError, and as ConsumerGroup.classic_sync."""
    authorize_group(principal, "read", group)
    await coordinator.restored(group)
    return coordinator.classic_sync_consumer(
        group, member_id, generation, principal=owner_of(principal), instance_id=instance_id
    )
