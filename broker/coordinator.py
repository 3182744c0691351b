"""Group coordinator: the one consumer-group state machine behind every face (Kafka's
JoinGroup/SyncGroup/Heartbeat and ConsumerGroupHeartbeat, HTTP members), and the one door to a
group's committed offsets (reads, commits, resets, lag).

Runs on the server's event loop; all group state (delta_log.core.group_state.GroupState,
delta_log.core.consumer_group.ConsumerGroup) is touched from that loop only, and Delta I/O goes to
worker threads.

- Classic joins wait for the rebalance they started (or joined) to complete; the waiting is woken
  by the group's event, never by polling alone (a 0.5 s cap covers a deadline passing unobserved).
- Commits are checked against the current owners under the group's lock, which completing a
  rebalance also takes, so a rebalance cannot happen between the check and the durable write: a
  zombie never moves a committed offset (invariant 5).
- Classic state is persisted (delta_log.system.groups) on every generation change and restored at
  start; every `heartbeat_persist_s` each live group's heartbeats are persisted too, so the
  rebalance job can tell dead members from live ones, also after this server crashed.
- The Spark rebalance job (jobs.rebalance) writes a next generation to the same table; the sync
  loop adopts it within `sync_interval_s` through an ordinary rebalance that uses the job's
  assignment. A race between the job and this server is decided by Delta's app-transaction rule.
- Consumer-protocol groups (Kafka 4's KIP-848, delta_log.core.consumer_group) live beside the
  classic ones under the same ids, ownership and offsets fencing: ConsumerGroupHeartbeat drives
  them, the server assigns, and classic members (Kafka's and HTTP's) are served in them by the
  same machinery (Kafka's online upgrade and downgrade). A change is saved to
  `_system/consumer_protocol_groups` before it is answered, so a coordinator that restarts or
  takes a group over goes on where it was.
- Several gateways on one root (broker.cluster): this coordinator acts only for the groups
  `owns` says are its own. It takes a group over on first use: loads the group's persisted state
  (its members get a full session to heartbeat here) and claims the group's coordinator epoch in
  the offsets table; each of its offset commits is fenced by that epoch, so a gateway that lost the
  group (a stale view, a pause) can never write an offset for it. Groups it stops owning are
  released at once; their waiting joins answer NOT_COORDINATOR and clients retry (forwarded).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from conf import ServerSettings
from delta_log.core.consumer_group import (
    ClassicProtocol,
    ConsumerGroup,
    Heartbeat,
    HeartbeatAnswer,
    Topics,
    validate_consumer_join,
)
from delta_log.core.group_config import GroupConfigBounds, apply_updates
from delta_log.core.group_rules import (
    AWAITING_SYNC,
    DEAD,
    EMPTY,
    STABLE,
    MemberState,
    protocol_type_of,
    validate_group_id,
    validate_instance_id,
    validate_join,
)
from delta_log.core.group_state import GroupState, HeartbeatResult, JoinResult
from delta_log.core.lag import partition_lag
from delta_log.errors import (
    FencedMemberEpochError,
    GroupNotEmptyError,
    GroupSubscribedToTopicError,
    InconsistentGroupProtocolError,
    InvalidTopicError,
    MemberIdRequiredError,
    NotCoordinatorError,
    PartitionNotFoundError,
    RebalanceInProgressError,
    TopiclakeError,
    TopicNotFoundError,
    UnknownGroupError,
    UnknownGroupMemberError,
    UnknownMemberError,
)
from delta_log.log.catalog import CATALOG_MARKER
from delta_log.log.reader import OffsetSpec
from delta_log.registry import TopicRegistry
from delta_log.system.consumer_protocol_groups import ConsumerGroupSnapshots
from delta_log.system.group_configs import GroupConfigStore
from delta_log.system.groups import HEARTBEAT, REBALANCE_JOB, SERVER, GroupRecord, GroupStore, MemberRecord
from delta_log.system.offsets import OffsetCommit, validate_commit

log = logging.getLogger(__name__)


def group_config_bounds(server: ServerSettings) -> GroupConfigBounds:
    """Consumer-protocol groups' default timing and the bounds of their group configs."""
    return GroupConfigBounds.of(
        server.consumer_group_session_timeout_ms,
        server.consumer_group_heartbeat_interval_ms,
        (server.consumer_group_min_session_timeout_ms, server.consumer_group_max_session_timeout_ms),
        (server.consumer_group_min_heartbeat_interval_ms, server.consumer_group_max_heartbeat_interval_ms),
    )


__all__ = ["GroupCoordinator", "GroupLag", "GroupSummary", "HeartbeatResult", "JoinResult"]


def _snapshot_text(snapshot: Mapping[str, object]) -> str:
    return json.dumps(snapshot, sort_keys=True, separators=(",", ":"))


#: the protocol type of a member that joined over HTTP (Kafka's JoinGroup always names one)
HTTP_MEMBER = ""


class GroupSummary(NamedTuple):
    group: str
    state: str
    members: int
    generation: int
    protocol_type: str
    #: Kafka's group type: "classic" (JoinGroup/SyncGroup, HTTP) or "consumer" (KIP-848)
    group_type: str = "classic"


@dataclass(slots=True)
class _TopicIndex:
    """Every topic's partition count and id, re-read when the catalog's marker moved (checked at
    most once a second): what consumer-protocol groups resolve subscriptions against."""

    topics: Topics = field(default_factory=lambda: Topics(0, {}))
    ids: dict[str, uuid.UUID] = field(default_factory=dict)
    marker: str | None = None
    checked: float = -math.inf
    #: the topics the last read could not read (their last known state kept; read again each second)
    unread: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLag:
    topic: str
    partition: int
    committed_offset: int | None
    high_watermark: int
    log_start_offset: int
    lag: int


class GroupCoordinator:
    def __init__(
        self,
        registry: TopicRegistry,
        store: GroupStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        sync_interval_s: float = 1.0,
        heartbeat_persist_s: float = 5.0,
        owns: Callable[[str], bool] | None = None,
        consumer_session_timeout_ms: int = 45_000,
        consumer_heartbeat_interval_ms: int = 5_000,
        group_config_bounds: GroupConfigBounds | None = None,
        group_max_size: int = 1000,
        consumer_group_max_size: int = 200,
    ) -> None:
        self.registry = registry
        self.offsets = registry.offsets
        self.store = store
        self.clock = clock
        self.sync_interval_s = sync_interval_s
        self.heartbeat_persist_s = heartbeat_persist_s
        self.groups: dict[str, GroupState] = {}
        #: consumer-protocol (KIP-848) groups; an id is in at most one of the two
        self.consumer_groups: dict[str, ConsumerGroup] = {}
        self.consumer_session_timeout_ms = consumer_session_timeout_ms
        self.consumer_heartbeat_interval_ms = consumer_heartbeat_interval_ms
        #: the most members of a classic group, and of a consumer-protocol group
        self.group_max_size, self.consumer_group_max_size = group_max_size, consumer_group_max_size
        #: consumer-protocol groups' timing: the defaults above, and the bounds of group configs
        self.config_bounds = group_config_bounds or GroupConfigBounds.of(
            consumer_session_timeout_ms, consumer_heartbeat_interval_ms, (45_000, 60_000), (5_000, 15_000)
        )
        self._config_store: GroupConfigStore | None = None  # opened on first use
        #: groups' config overrides (delta_log.core.group_config), as last read or set here
        self._group_configs: dict[str, dict[str, str]] = {}
        #: one read or change of them at a time: a read that began before a change here would
        #: otherwise put the older overrides back after it
        self._configs_lock = asyncio.Lock()
        self._topic_index = _TopicIndex()
        self._lag_weights: dict[str, tuple[float, dict[tuple[str, int], int]]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._seen_version = -1
        #: which groups this coordinator acts for (all of them on a single gateway)
        self.owns: Callable[[str], bool] = owns or (lambda group: True)
        #: coordinator epoch claimed per group (multi-gateway fencing); absent: not yet taken over
        self._epochs: dict[str, int] = {}
        self._fenced = owns is not None
        self._claims: dict[str, asyncio.Lock] = {}
        self._persisted_version = -1
        self._persisted_groups: Mapping[str, GroupRecord] = {}
        #: when each group's subscribed topics were last compared with its assignment
        self._checked: dict[str, float] = {}
        # consumer-protocol groups' snapshots (delta_log.system.consumer_protocol_groups): the store
        # (opened on first use), what was last saved of each group held here, the groups whose
        # snapshot was looked for since this gateway began acting for them, the groups changed
        # since the last save, and the event that wakes the saver
        self._snapshot_store: ConsumerGroupSnapshots | None = None
        self._saved: dict[str, str] = {}
        self._looked: set[str] = set()
        self._restoring: dict[str, asyncio.Lock] = {}
        self._dirty: set[str] = set()
        self._dirty_event = asyncio.Event()
        #: resolved when the next save (the one that takes the groups changed so far) is done
        self._next_save: asyncio.Future[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self._fenced:  # a single gateway: every group is ours, restore them all now
            records = await asyncio.to_thread(self.store.load)
            for rec in records.values():
                if rec.state != DEAD:
                    self.groups[rec.group] = self._restore(rec)
        self._seen_version = self.store.version
        self._tasks = [
            asyncio.create_task(self._expire_loop()),
            asyncio.create_task(self._sync_loop()),
            asyncio.create_task(self._snapshot_loop()),
        ]

    def _restore(self, rec: GroupRecord) -> GroupState:
        """A persisted group, live again here; its members get a full session from now."""
        now = self.clock()
        g = GroupState(group_id=rec.group, generation=rec.generation, assignor=rec.assignor)
        for m in rec.members:
            g.members[m.member_id] = m.to_state(last_heartbeat=now)
        g.state = STABLE if g.members else EMPTY
        if g.leader_assigns and g.members:
            g.start_rebalance(now)  # the leader's opaque assignments are not kept: the members rejoin
        return g

    async def _ensure(self, group_id: str, *, create: str | None = None) -> GroupState | None:
        """The group as this coordinator holds it, taking it over on first use when it is ours.

        `create`: the assignor of a group to create when none exists (a join).
        Raises: NotCoordinatorError (another gateway owns the group)."""
        self._check_owned(group_id)
        if self._fenced and group_id not in self._epochs:
            # One takeover per group at a time: concurrent requests wait for it (two claims would
            # leave this gateway holding the older epoch, fenced by its own second claim).
            async with self._claims.setdefault(group_id, asyncio.Lock()):
                if group_id not in self._epochs:
                    rec = (await self._persisted()).get(group_id)
                    if rec is None and create is None:
                        return self.groups.get(group_id)  # nothing persisted to take over, nothing to create
                    epoch = await asyncio.to_thread(self.offsets.claim_coordinator, group_id)
                    self._check_owned(group_id)  # the membership may have moved while we claimed
                    self._epochs[group_id] = epoch
                    if rec is not None and rec.state != DEAD and group_id not in self.groups:
                        self.groups[group_id] = self._restore(rec)
                    log.info("group %r: coordinated here from epoch %d", group_id, epoch)
        g = self.groups.get(group_id)
        if g is None and create is not None:
            g = self.groups.setdefault(group_id, GroupState(group_id=group_id, assignor=create))
        return g

    def _check_owned(self, group_id: str) -> None:
        """Raises: NotCoordinatorError (and releases the group) unless this gateway owns it."""
        if not self.owns(group_id):
            self.release(group_id)
            raise NotCoordinatorError(
                f"Group {group_id!r} is coordinated by another gateway; retry (any gateway forwards).",
                group=group_id,
            )

    async def _persisted(self) -> Mapping[str, GroupRecord]:
        """The groups table's latest state per group, re-read only when the table moved (a request
        for an unknown group costs a version check, not a table scan)."""
        version, latest = await asyncio.to_thread(self.store.load_if_changed, self._persisted_version)
        if latest is not None:
            self._persisted_version, self._persisted_groups = version, latest
        return self._persisted_groups

    async def _save(self, groups: list[GroupState], *, writer: str = SERVER) -> None:
        """Persist group states. With several gateways, only of the groups this one still holds:
        each group's epoch is checked on the offsets table first, and a group taken over meanwhile
        is released instead of written."""
        if self._fenced:
            epochs = {g.group_id: e for g in groups if (e := self._epochs.get(g.group_id)) is not None}
            lost = await self._release_lost(epochs)
            groups = [g for g in groups if g.group_id in epochs and g.group_id not in lost]
        held = [self.record(g, writer=writer) for g in groups]
        if held:
            await asyncio.to_thread(self.store.save, held)

    async def _release_lost(self, epochs: dict[str, int]) -> set[str]:
        """Release the groups of `epochs` (group -> the coordinator epoch held here) that another
        gateway took over; those groups. One look at the offsets table for them all: each look
        waits its turn at its lock, and a heartbeat's answer waits for the save behind it."""
        lost = await asyncio.to_thread(self.offsets.lost_coordinators, epochs) if epochs else set()
        for group_id in lost:
            self.release(group_id)
        return lost

    def release(self, group_id: str) -> None:
        """Stop acting for a group (another gateway owns it now); its waiters wake and find it gone."""
        g = self.groups.pop(group_id, None)
        self._epochs.pop(group_id, None)
        self._saved.pop(group_id, None)
        self._looked.discard(group_id)
        self._dirty.discard(group_id)
        if self.consumer_groups.pop(group_id, None) is not None:
            log.info("group %r: released to another gateway", group_id)
        if g is not None:
            log.info("group %r: released to another gateway", group_id)
            self._wake(g)

    def on_membership_change(self) -> None:
        """The cluster's live gateways changed: release the groups that moved away."""
        held = set(self.groups) | set(self.consumer_groups) | set(self._epochs)
        for group_id in [gid for gid in held if not self.owns(gid)]:
            self.release(group_id)

    def _fence(self, group_id: str) -> tuple[str, int] | None:
        if not self._fenced:
            return None
        epoch = self._epochs.get(group_id)
        if epoch is None:
            raise NotCoordinatorError(f"Group {group_id!r} is not coordinated here.", group=group_id)
        return (group_id, epoch)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()

    async def _sync_loop(self) -> None:
        last_persist = self.clock()
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync()
                if self.clock() - last_persist >= self.heartbeat_persist_s:
                    last_persist = self.clock()
                    await self.persist_heartbeats()
            except Exception:
                log.exception("syncing consumer group state failed; retrying")

    async def sync(self) -> None:
        """Adopt generations written by the rebalance job, and group configs set on any gateway,
        since the last look."""
        await self.reload_group_configs()
        version, latest = await asyncio.to_thread(self.store.load_if_changed, self._seen_version)
        self._seen_version = version
        for rec in (latest or {}).values():
            g = self.groups.get(rec.group)
            if g is None or rec.writer != REBALANCE_JOB:
                continue
            assignment = {m.member_id: m.assignment for m in rec.members}
            if g.adopt(rec.generation, assignment, self.clock()):
                log.info("group %r: adopting the rebalance job's generation %d", g.group_id, rec.generation)
                self._wake(g)

    async def persist_heartbeats(self) -> None:
        """One row per stable group with members, so liveness survives this process; and the
        bookkeeping of groups no longer held here is dropped (a client names any group id)."""
        held = set(self.groups) | set(self.consumer_groups) | set(self._epochs)
        self._looked &= held
        for group_id in [g for g, lock in self._restoring.items() if g not in held and not lock.locked()]:
            del self._restoring[group_id]
        live = [g for g in self.groups.values() if g.members and g.state == STABLE]
        if live:
            await self._save(live, writer=HEARTBEAT)
            await asyncio.to_thread(self.store.compact)
        if self._snapshot_store is not None:
            await asyncio.to_thread(self._snapshot_store.compact)
        await asyncio.to_thread(self.offsets.compact)  # one file per commit otherwise, forever

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            for g in list(self.groups.values()):
                try:
                    for mid in g.expire(self.clock()):
                        log.info("group %r: member %r session expired", g.group_id, mid)
                        self._wake(g)
                    if self._completable(g):
                        await self._complete_rebalance(g)
                except Exception:
                    log.exception("expiring members of %r failed", g.group_id)
            for cg in list(self.consumer_groups.values()):
                removed = cg.expire(self.clock(), self._topic_index.topics)
                for mid, why in removed.items():
                    log.info("group %r: member %r removed: %s", cg.group_id, mid, why)
                    self._touched(cg.group_id)
                if removed:
                    try:
                        await self._maybe_downgrade(cg)
                    except Exception:
                        log.exception("downgrading %r failed", cg.group_id)

    # -- membership -----------------------------------------------------------------------------
    def group(self, group_id: str) -> GroupState:
        """Raises: UnknownGroupError."""
        g = self.groups.get(group_id)
        if g is None:
            raise UnknownGroupError(f"Group {group_id!r} does not exist.", group=group_id)
        return g

    def member_group(self, group_id: str) -> GroupState:
        """The group a member's request is for. Raises: UnknownGroupMemberError."""
        g = self.groups.get(group_id)
        if g is None:
            raise UnknownGroupMemberError(f"Group {group_id!r} does not exist; join it again.", group=group_id)
        return g

    def _lock(self, g: GroupState) -> asyncio.Lock:
        return self._locks.setdefault(g.group_id, asyncio.Lock())

    def _event(self, g: GroupState) -> asyncio.Event:
        return self._changed.setdefault(g.group_id, asyncio.Event())

    def _wake(self, g: GroupState) -> None:
        self._event(g).set()
        self._changed[g.group_id] = asyncio.Event()

    async def join(
        self,
        group_id: str,
        *,
        topics: list[str],
        member_id: str | None = None,
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        assignor: str = "range",
        principal: str | None = None,
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
        """Join (or rejoin) and wait for the group's next generation (Stable; or, where the leader
        assigns, CompletingRebalance until the leader's SyncGroup: see `sync`), by Kafka's rules
        (GroupState.join).

        Raises: InvalidGroupError, UnknownAssignorError, UnknownMemberError, MemberIdRequiredError,
        FencedInstanceIdError, TopicNotFoundError, InconsistentGroupProtocolError.
        `missing_topics_ok`: topics that do not exist are joined with no partitions (Kafka's way)
        instead of refused. `rebalance_timeout_ms`: how long a rebalance waits for this member
        (Kafka's JoinGroup field; 0: its session timeout). `require_member_id`: a new dynamic
        member first gets its member id (Kafka's JoinGroup v4+). `protocol_type`: Kafka's JoinGroup
        protocol type ("consumer": a Kafka consumer, whose group may be upgraded to the consumer
        protocol); `embedded`: the protocols a Kafka consumer offers, and `owned` what its
        subscription says it owns (for a consumer-protocol group it joins as a classic member).
        `group_protocol`: "consumer" for an HTTP member that asks for a consumer-protocol group
        (`assignor` then names its server-side assignor: uniform, range or lag): the group becomes
        one, as Kafka's upgrade does, or is created as one.
        """
        owned = owned or {}
        validate_group_id(group_id)
        if group_protocol == "consumer":
            topics = validate_consumer_join(assignor, session_timeout_ms, topics)
        else:
            topics = validate_join(assignor, session_timeout_ms, topics)
        validate_instance_id(instance_id)
        if not missing_topics_ok:  # (Kafka's consumers may subscribe to topics not created yet)
            for t in topics:
                await asyncio.to_thread(self.registry.partitions, t)  # 404 for unknown topics, before any change
        while True:
            await self.restored(group_id)
            consumer = self.consumer_groups.get(group_id)
            if consumer is None and group_protocol == "consumer":
                await self._claim(group_id)
                consumer = await self._consumer_group_for(group_id)
            if consumer is not None:
                self._check_owned(group_id)
                if consumer.members or group_protocol == "consumer":
                    if protocol_type not in ("consumer", HTTP_MEMBER):
                        raise InconsistentGroupProtocolError(
                            f"Group {group_id!r} is a consumer-protocol group (KIP-848) with members; only "
                            "consumers join it (or use another group id).",
                            group=group_id,
                        )
                    return await self._classic_join_consumer(
                        consumer,
                        member_id=member_id,
                        instance_id=instance_id,
                        topics=topics,
                        owned=owned,
                        protocols=embedded,
                        session_timeout_ms=session_timeout_ms,
                        rebalance_timeout_ms=rebalance_timeout_ms,
                        principal=principal,
                        client=client,
                        require_member_id=require_member_id,
                        assignor=assignor if group_protocol == "consumer" else None,
                    )
                del self.consumer_groups[group_id]  # an empty consumer group becomes a classic one
                self._touched(group_id)
            try:
                return await self._classic_join(
                    group_id,
                    topics=topics,
                    member_id=member_id,
                    instance_id=instance_id,
                    session_timeout_ms=session_timeout_ms,
                    assignor=assignor,
                    principal=principal,
                    protocols=protocols,
                    missing_topics_ok=missing_topics_ok,
                    client=client,
                    rebalance_timeout_ms=rebalance_timeout_ms,
                    require_member_id=require_member_id,
                    protocol_type=protocol_type,
                )
            except RebalanceInProgressError as exc:
                if protocol_type != HTTP_MEMBER or group_id not in self.consumer_groups:
                    raise  # a Kafka consumer joins the new group itself
                # an HTTP member joins the consumer group its classic group became (it is in it)
                member_id = exc.details.get("member_id", member_id)

    async def _classic_join(
        self,
        group_id: str,
        *,
        topics: list[str],
        member_id: str | None,
        instance_id: str | None,
        session_timeout_ms: int,
        assignor: str,
        principal: str | None,
        protocols: Sequence[tuple[str, bytes]],
        missing_topics_ok: bool,
        client: tuple[str, str],
        rebalance_timeout_ms: int,
        require_member_id: bool,
        protocol_type: str,
    ) -> JoinResult:
        """`join` into a classic group. Raises: RebalanceInProgressError (also when the group became
        a consumer group while the join waited), and as `join`."""
        g = await self._ensure(group_id, create=assignor)
        assert g is not None
        previous = g.static_member(instance_id) if instance_id and member_id is None else None
        replaced = previous.member_id if previous is not None else None
        member, settled = g.join(
            now=self.clock(),
            topics=topics,
            member_id=member_id,
            instance_id=instance_id,
            session_timeout_ms=session_timeout_ms,
            assignor=assignor,
            principal=principal,
            protocols=protocols,
            client=client,
            rebalance_timeout_ms=rebalance_timeout_ms,
            require_member_id=require_member_id,
            max_size=self.group_max_size,
        )
        member.protocol_type = protocol_type
        if settled:
            if replaced is not None:  # a static member took its instance id over: persist its new id
                await self._save([g])
            return g.result(member, replaced=replaced)
        self._wake(g)
        # Answered once the rebalance this join is in completes, even if another has begun since
        # (a member joined in the same instant): Kafka answers every pending join at completion,
        # and the member learns of the next rebalance from its heartbeat. Waiting on into the next
        # one would leave this member, not rejoined there, to be dropped from it.
        joined_in, mid = g.generation, member.member_id  # (a static member taken over meanwhile changes ids)
        while g.rebalancing and g.generation == joined_in:
            if g.ready_to_complete(self.clock()):
                await self._complete_rebalance(g)  # (or another did, or it began anew meanwhile)
                continue
            event = self._event(g)
            remaining = (g.rebalance_deadline or self.clock()) - self.clock()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=max(0.01, min(remaining, 0.5)))
            if (moved := self._moved(g, mid)) is not None:
                raise moved
            if mid in g.members:
                g.members[mid].last_heartbeat = self.clock()  # waiting in join counts as alive
        if (moved := self._moved(g, mid)) is not None:
            raise moved
        # dropped meanwhile: UnknownMemberError, join again; its instance taken over: FencedInstanceIdError
        return g.result(g.member(mid, instance_id=instance_id))

    async def sync_group(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        assignments: Mapping[str, tuple[bytes, dict[str, list[int]]]],
        *,
        principal: str | None = None,
        instance_id: str | None = None,
    ) -> bytes:
        """Kafka's SyncGroup where the leader assigns (GroupState.sync): the leader's hands out the
        generation's assignment; a follower waits for it, woken by the group's event. A leader that
        does not hand it out within the group's largest session timeout starts a new rebalance.

        Raises: UnknownGroupMemberError, UnknownMemberError, FencedMemberError, FencedInstanceIdError,
        AuthorizationError, RebalanceInProgressError, NotCoordinatorError."""
        if group_id in self.consumer_groups:  # upgraded since the leader joined: it joins again
            self._check_owned(group_id)
            raise self._upgraded(group_id)
        await self._ensure(group_id)
        g = self.member_group(group_id)
        deadline = self.clock() + g.rebalance_timeout_s()  # Kafka's pending-sync timeout
        while True:
            before = g.state
            got = g.sync(member_id, generation, assignments, principal, instance_id=instance_id)
            if got is not None:
                if before == AWAITING_SYNC:  # the leader's: the generation is Stable now
                    self._wake(g)
                    await self._save([g])
                    log.info("group %r: generation %d assigned by its leader", group_id, g.generation)
                return got
            if self.clock() >= deadline:
                g.start_rebalance(self.clock())
                self._wake(g)
                raise RebalanceInProgressError(
                    f"Group {group_id!r}: the leader did not hand out the assignment in time; join again.",
                    group=group_id,
                )
            event = self._event(g)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=max(0.01, min(deadline - self.clock(), 0.5)))
            if (moved := self._moved(g)) is not None:
                raise moved
            if member_id in g.members:
                g.members[member_id].last_heartbeat = self.clock()  # waiting in sync counts as alive

    def _completable(self, g: GroupState) -> bool:
        return g.ready_to_complete(self.clock()) or (g.rebalancing and not g.members)

    async def _complete_rebalance(self, g: GroupState) -> None:
        """Complete the group's rebalance if it is ready, deciding that again under the group's lock
        and after every wait: a completion decided before another rebalance began must not complete
        that one (it would drop every member that had not had the time to rejoin it). The joins are
        answered at once; the new generation is persisted before any commit in it (the lock)."""
        async with self._lock(g):  # no commit is between its check and its write while generations change
            while True:
                if not self._completable(g):
                    return
                topics = g.topics_to_assign()
                partitions = await asyncio.to_thread(self._partition_counts, set(topics))
                if self._completable(g) and g.topics_to_assign() == topics:  # nothing moved while we looked
                    break
            g.complete(partitions)
            self._wake(g)
            log.info("group %r: generation %d, %d members", g.group_id, g.generation, len(g.members))
            await self._save([g])

    def record(self, g: GroupState, *, writer: str = SERVER) -> GroupRecord:
        wall, mono = time.time(), self.clock()
        return GroupRecord(
            group=g.group_id,
            generation=g.generation,
            state=g.state,
            assignor=g.assignor,
            members=tuple(
                MemberRecord.of(m, last_heartbeat_ms=int((wall - (mono - m.last_heartbeat)) * 1000))
                for m in g.members.values()
            ),
            updated_at_us=int(wall * 1e6),
            writer=writer,
        )

    async def heartbeat(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        *,
        principal: str | None = None,
        instance_id: str | None = None,
    ) -> HeartbeatResult:
        """`principal`: the caller (None while auth is off); only the one that joined the member.

        Raises: UnknownGroupMemberError, UnknownMemberError, FencedMemberError, AuthorizationError,
        NotCoordinatorError."""
        await self.restored(group_id)
        if (cg := self.consumer_groups.get(group_id)) is not None:  # a classic member of a consumer group
            self._check_owned(group_id)
            topics = await self.topics()
            weights = await self._weights(cg) if cg.assignor == "lag" and cg.target_stale(topics) else None
            rejoin = cg.classic_heartbeat(
                member_id,
                instance_id,
                generation,
                self.clock(),
                principal,
                topics=topics,
                weights=lambda: weights or {},
            )
            await self._saved_before_answer(group_id)
            held = cg.classic_member(member_id, instance_id, principal).assigned
            return HeartbeatResult(
                generation=generation, rebalance=rejoin, assignment={t: sorted(ps) for t, ps in held.items()}
            )
        await self._ensure(group_id)
        g = self.member_group(group_id)
        result = g.heartbeat(member_id, generation, self.clock(), principal, instance_id=instance_id)
        if not result.rebalance and await self._partitions_changed(g):
            g.start_rebalance(self.clock())  # as Kafka's group leader does when metadata changes
            self._wake(g)
            log.info("group %r: a subscribed topic appeared or grew; rebalancing", group_id)
            return HeartbeatResult(generation=result.generation, rebalance=True, assignment=result.assignment)
        return result

    async def _partitions_changed(self, g: GroupState) -> bool:
        """Whether a topic the group's members subscribe to was created, deleted or given more
        partitions since the assignment (checked at most once a second per group). Where the
        coordinator assigns, no member watches metadata: it does, as Kafka's leader would."""
        now = self.clock()
        if g.leader_assigns or g.state != STABLE or now - self._checked.get(g.group_id, 0.0) < 1.0:
            return False
        self._checked[g.group_id] = now
        counts = await asyncio.to_thread(self._partition_counts, {t for m in g.members.values() for t in m.topics})
        if not g.assigned_counts:  # restored from the groups table, which does not keep them
            g.assigned_counts = counts
            return False
        return counts != {t: n for t, n in g.assigned_counts.items() if t in counts}

    def _partition_counts(self, topics: set[str]) -> dict[str, int]:
        out = {}
        for t in topics:
            try:
                out[t] = self.registry.partitions(t)
            except TopiclakeError:
                out[t] = 0  # not created yet, or deleted
        return out

    async def leave(
        self, group_id: str, member_id: str, *, principal: str | None = None, instance_id: str | None = None
    ) -> None:
        """Raises: UnknownGroupMemberError, UnknownMemberError, AuthorizationError, NotCoordinatorError."""
        await self.restored(group_id)
        if (cg := self.consumer_groups.get(group_id)) is not None:  # a classic member of a consumer group
            self._check_owned(group_id)
            left = cg.classic_leave(member_id, instance_id, principal)
            await self._saved_before_answer(group_id)
            log.info("group %r: classic member %r left", group_id, left)
            return
        await self._ensure(group_id)
        g = self.member_group(group_id)
        g.leave(member_id, self.clock(), principal, instance_id=instance_id)
        if not g.members:
            await self._complete_rebalance(g)
        self._wake(g)

    # -- consumer-protocol groups (KIP-848) -------------------------------------------------------
    async def consumer_heartbeat(
        self,
        group_id: str,
        hb: Heartbeat,
        *,
        principal: str | None = None,
        readable: Callable[[str], bool] | None = None,
    ) -> tuple[HeartbeatAnswer, ConsumerGroup]:
        """One ConsumerGroupHeartbeat (joining, heartbeating, leaving), and the group after it.

        Raises: InvalidGroupError, NotCoordinatorError, UnknownGroupError (a classic group with
        members: not a consumer group), and as ConsumerGroup.heartbeat."""
        validate_group_id(group_id)
        await self._claim(group_id)
        await self.restored(group_id)
        g = self.consumer_groups.get(group_id) or await self._consumer_group_for(group_id)
        g.session_timeout_ms, g.heartbeat_interval_ms = self.config_bounds.effective(
            self._group_configs.get(group_id, {})
        )
        g.max_size = self.consumer_group_max_size
        topics = await self.topics()
        member = g.members.get(hb.member_id)
        named = hb.topics if hb.topics is not None else (member.topics if member is not None else ())
        if not all(t in topics.counts for t in named):  # created a moment ago, maybe: Kafka assigns it at once
            topics = await self.topics(fresh=True)
        weights = None
        if hb.assignor == "lag" or g.assignor == "lag":
            weights = await self._weights(g)
        try:
            answer = g.heartbeat(
                hb, self.clock(), topics, weights=lambda: weights or {}, principal=principal, readable=readable
            )
        except (FencedMemberEpochError, UnknownMemberError) as exc:
            # the client gives its partitions up (librdkafka reports them lost): worth a line
            log.info(
                "group %r: a heartbeat of member %r at epoch %d refused: %s", group_id, hb.member_id, hb.epoch, exc
            )
            self._touched(group_id)
            raise
        except BaseException:
            self._touched(group_id)
            raise
        if hb.epoch < 0 and g.members:
            await self._maybe_downgrade(g)
        await self._saved_before_answer(group_id)
        if not g.members and hb.epoch < 0:
            self._lag_weights.pop(group_id, None)
        return answer, g

    async def _consumer_group_for(self, group_id: str) -> ConsumerGroup:
        """The consumer-protocol group a member of that protocol joins, where the group is not one
        yet: a classic group of consumers (Kafka's and HTTP's) is upgraded, an empty one replaced,
        and a new one created. Raises: UnknownGroupError (a classic group of another protocol
        type with members, such as Connect's workers)."""
        classic = self.groups.get(group_id)
        if classic is not None and classic.members:
            if not all(m.protocol_type in ("consumer", HTTP_MEMBER) for m in classic.members.values()):
                raise UnknownGroupError(
                    f"Group {group_id!r} is a {classic.protocol_type!r} group with members, not a consumer group: "
                    "it takes consumer-protocol members once it is empty (or use group.protocol=classic).",
                    group=group_id,
                )
            return await self._upgrade(classic)
        if classic is not None:  # an empty classic group: Kafka's upgrade
            self.groups.pop(group_id, None)
            log.info("group %r: an empty classic group becomes a consumer-protocol group", group_id)
        return self.consumer_groups.setdefault(
            group_id,
            ConsumerGroup(
                group_id=group_id,
                session_timeout_ms=self.consumer_session_timeout_ms,
                heartbeat_interval_ms=self.consumer_heartbeat_interval_ms,
            ),
        )

    async def _maybe_downgrade(self, cg: ConsumerGroup) -> None:
        """Kafka's online downgrade (group.consumer.migration.policy `bidirectional`): once a
        consumer-protocol member has left (or was removed) and only classic members remain, the
        group is a classic group again (GroupState.downgraded), and its members rejoin it."""
        g = GroupState.downgraded(cg, self.clock(), max_size=self.group_max_size)
        if g is None or self.consumer_groups.get(cg.group_id) is not cg:
            return
        del self.consumer_groups[cg.group_id]
        self.groups[cg.group_id] = g
        self._touched(cg.group_id)  # its snapshot: gone
        self._wake(g)
        log.info(
            "group %r: its last consumer-protocol member left; a classic group of %d members again (generation %d)",
            g.group_id,
            len(g.members),
            g.generation,
        )
        await self._save([g])

    # -- consumer-protocol groups' snapshots: a takeover goes on where the group was ---------------
    def _snapshots(self) -> ConsumerGroupSnapshots:
        """Blocking on first use (opens the table): call in a thread."""
        if self._snapshot_store is None:
            self._snapshot_store = ConsumerGroupSnapshots(self.registry.storage)
        return self._snapshot_store

    async def restored(self, group_id: str) -> None:
        """Take a consumer-protocol group over from its last snapshot, the first time this gateway
        acts for it (after a failover or a restart): its members keep their ids, epochs and
        partitions, and a revocation in progress goes on, as on Kafka when a coordinator loads a
        group. A group another gateway coordinates is left to it. Raises: StorageUnavailableError."""
        if group_id in self.consumer_groups or group_id in self._looked or not self.owns(group_id):
            return
        async with self._restoring.setdefault(group_id, asyncio.Lock()):
            if group_id in self._looked or group_id in self.consumer_groups:
                return
            found = await asyncio.to_thread(lambda: self._snapshots().load(group_id))
            snapshot = found.get(group_id)
            if snapshot is not None:
                await self._claim(group_id)
                classic = self.groups.get(group_id)
                if group_id not in self.consumer_groups and (classic is None or not classic.members):
                    self.groups.pop(group_id, None)
                    self.consumer_groups[group_id] = ConsumerGroup.restore(
                        group_id,
                        snapshot,
                        now=self.clock(),
                        session_timeout_ms=self.consumer_session_timeout_ms,
                        heartbeat_interval_ms=self.consumer_heartbeat_interval_ms,
                    )
                    self._saved[group_id] = _snapshot_text(snapshot)
                    log.info("group %r: restored at epoch %s from its snapshot", group_id, snapshot["epoch"])
            self._looked.add(group_id)

    def _touched(self, group_id: str) -> asyncio.Future[None]:
        """A consumer-protocol group may have changed: the saver looks at it at once. Returns what
        resolves when that save is done."""
        self._dirty.add(group_id)
        self._dirty_event.set()
        if self._next_save is None or self._next_save.done():
            self._next_save = asyncio.get_running_loop().create_future()
        return self._next_save

    async def _saved_before_answer(self, group_id: str) -> None:
        """Wait until the group's change is saved, as Kafka's coordinator writes a change before it
        answers: what a member was told is what a gateway taking the group over restores (a member
        told an epoch the restored group does not know would be fenced, and librdkafka then retries
        its commits until its session ends)."""
        g = self.consumer_groups.get(group_id)
        if self._saved.get(group_id, "") != (_snapshot_text(g.snapshot()) if g is not None else ""):
            await self._touched(group_id)

    async def _snapshot_loop(self) -> None:
        """Save changed consumer-protocol groups, woken by a change; the changes made while one
        save runs go in the next commit together (a group commit: heartbeats wait on it)."""
        while True:
            await self._dirty_event.wait()
            await asyncio.sleep(0)  # the changes of this instant's other requests, too
            self._dirty_event.clear()
            dirty, self._dirty = self._dirty, set()
            done, self._next_save = self._next_save, None
            try:
                await self.save_snapshots(dirty)
            except Exception:  # answered anyway (the change is made); saved at the next try
                log.exception("saving consumer group snapshots failed; retrying")
                self._dirty |= dirty
                self._dirty_event.set()
                await asyncio.sleep(1.0)
            finally:
                if done is not None and not done.done():
                    done.set_result(None)

    async def save_snapshots(self, group_ids: set[str]) -> None:
        """Save the snapshot of each of these groups that changed since its last save here (a
        group gone from here since: an empty snapshot). With several gateways, only of the groups
        this one still coordinates (its coordinator epoch checked first, as `_save` does).
        Raises: StorageUnavailableError."""
        changed: dict[str, tuple[int, int, dict[str, object] | None]] = {}
        texts: dict[str, str] = {}
        for group_id in sorted(group_ids):
            g = self.consumer_groups.get(group_id)
            snapshot = g.snapshot() if g is not None else None
            text = _snapshot_text(snapshot) if snapshot is not None else ""
            if self._saved.get(group_id, "") == text:
                continue
            epoch = 0
            if self._fenced:
                held = self._epochs.get(group_id)
                if held is None:
                    continue
                epoch = held
            changed[group_id] = (epoch, g.epoch if g is not None else -1, snapshot)
            texts[group_id] = text
        if self._fenced and changed:
            for group_id in await self._release_lost({g: e for g, (e, _, _) in changed.items()}):
                del changed[group_id], texts[group_id]
        if changed:
            await asyncio.to_thread(lambda: self._snapshots().save(changed))
            self._saved.update(texts)

    # -- group configs (Kafka's GROUP resource) --------------------------------------------------
    def _configs(self) -> GroupConfigStore:
        if self._config_store is None:
            self._config_store = GroupConfigStore(self.registry.storage)
        return self._config_store

    async def reload_group_configs(self) -> dict[str, dict[str, str]]:
        """Every group's config overrides, read from the root now. Raises: StorageUnavailableError."""
        async with self._configs_lock:
            _, self._group_configs = await asyncio.to_thread(lambda: self._configs().load())
            return self._group_configs

    async def group_config(self, group_id: str) -> dict[str, str]:
        """The group's config overrides, as read from the root now (the gateway's defaults are
        `config_bounds.defaults()`). Raises: InvalidGroupError, StorageUnavailableError."""
        validate_group_id(group_id)
        return dict((await self.reload_group_configs()).get(group_id, {}))

    async def alter_group_config(
        self, group_id: str, updates: Mapping[str, str | None], *, validate_only: bool = False
    ) -> dict[str, str]:
        """Apply `updates` to the group's overrides (None: back to the default); they apply from
        each member's next heartbeat, on whichever gateway coordinates the group.

        Raises: InvalidGroupError, InvalidConfigError, StorageUnavailableError."""
        validate_group_id(group_id)
        if validate_only:
            current = (await self.reload_group_configs()).get(group_id, {})
            return apply_updates(current, updates, self.config_bounds)
        async with self._configs_lock:
            new = await asyncio.to_thread(lambda: self._configs().alter(group_id, updates, self.config_bounds))
            self._group_configs[group_id] = new
        return new

    async def _upgrade(self, classic: GroupState) -> ConsumerGroup:
        """Kafka's online upgrade: a classic group of Kafka consumers becomes a consumer group, its
        members in it with their partitions (ConsumerGroup.from_classic), speaking the classic
        protocol until they too move. Joins and syncs waiting in the classic group are answered
        REBALANCE_IN_PROGRESS (they join the consumer group); the classic group is persisted as Dead
        so no gateway restores it."""
        group_id = classic.group_id
        g = ConsumerGroup.from_classic(
            group_id,
            classic.generation,
            classic.members.values(),
            topics=await self.topics(),
            session_timeout_ms=self.consumer_session_timeout_ms,
            heartbeat_interval_ms=self.consumer_heartbeat_interval_ms,
        )
        self.consumer_groups[group_id] = g
        self.groups.pop(group_id, None)
        classic.state = DEAD
        self._wake(classic)
        self._touched(group_id)
        await self._save([classic])
        log.info(
            "group %r: a classic group of %d members becomes a consumer-protocol group (generation %d)",
            group_id,
            len(g.members),
            classic.generation,
        )
        return g

    def _upgraded(self, group_id: str, member_id: str | None = None) -> RebalanceInProgressError:
        """`member_id`: the member whose join waited (it is a member of the consumer group now)."""
        return RebalanceInProgressError(
            f"Group {group_id!r} now runs Kafka's consumer protocol; the member joins it again.",
            group=group_id,
            member_id=member_id,
        )

    def _moved(self, g: GroupState, member_id: str | None = None) -> TopiclakeError | None:
        """Why a join (of `member_id`) or a sync waiting in `g` cannot go on: the group became a
        consumer group, or it moved to another gateway."""
        if self.groups.get(g.group_id) is g:
            return None
        if g.group_id in self.consumer_groups:
            return self._upgraded(g.group_id, member_id)
        return NotCoordinatorError(f"Group {g.group_id!r} moved to another gateway; join again.", group=g.group_id)

    async def _classic_join_consumer(
        self,
        g: ConsumerGroup,
        *,
        member_id: str | None,
        instance_id: str | None,
        topics: list[str],
        owned: Mapping[str, Sequence[int]],
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        principal: str | None,
        client: tuple[str, str],
        require_member_id: bool,
        assignor: str | None,
    ) -> JoinResult:
        """A classic member's JoinGroup to a consumer group (ConsumerGroup.classic_join).

        Raises: MemberIdRequiredError, and as ConsumerGroup.classic_join."""
        g.max_size = self.consumer_group_max_size
        if not member_id:
            g.check_room()  # (Kafka refuses a new member at its first join)
            member_id = str(uuid.uuid4())
            if require_member_id and instance_id is None:  # KIP-394, as in a classic group
                raise MemberIdRequiredError(
                    f"Join group {g.group_id!r} again with member id {member_id!r}.", member_id=member_id
                )
        weights = await self._weights(g) if "lag" in (g.assignor, assignor) else None
        known = await self.topics()
        if not all(t in known.counts for t in topics):  # (created a moment ago, maybe)
            known = await self.topics(fresh=True)
        m = g.classic_join(
            member_id=member_id,
            instance_id=instance_id,
            topics=topics,
            owned={t: frozenset(ps) for t, ps in owned.items() if ps},
            classic=ClassicProtocol(session_timeout_ms=session_timeout_ms, protocols=tuple(protocols)),
            rebalance_timeout_ms=rebalance_timeout_ms,
            now=self.clock(),
            known_topics=known,
            principal=principal,
            client=client,
            weights=lambda: weights or {},
            assignor=assignor,
        )
        await self._saved_before_answer(g.group_id)
        return JoinResult(
            member_id=m.member_id,
            generation=m.epoch,
            assignment={t: sorted(ps) for t, ps in m.assigned.items()},
            members=len(g.members),
            protocol=protocols[0][0] if protocols else None,
            leader="",  # nobody assigns: every member syncs for its own partitions
        )

    def classic_sync_consumer(
        self, group_id: str, member_id: str, generation: int, *, principal: str | None, instance_id: str | None
    ) -> dict[str, list[int]] | None:
        """A classic member's SyncGroup to a consumer group: its partitions; None when the group is
        not a consumer group here. Raises: as ConsumerGroup.classic_sync."""
        g = self.consumer_groups.get(group_id)
        if g is None:
            return None
        self._check_owned(group_id)
        synced = g.classic_sync(member_id, instance_id, generation, principal)
        self._touched(group_id)
        return {t: sorted(ps) for t, ps in synced.items()}

    async def _claim(self, group_id: str) -> None:
        """Act for the group here (its coordinator epoch claimed on first use, with several
        gateways). Raises: NotCoordinatorError."""
        self._check_owned(group_id)
        if self._fenced and group_id not in self._epochs:
            async with self._claims.setdefault(group_id, asyncio.Lock()):
                if group_id not in self._epochs:
                    epoch = await asyncio.to_thread(self.offsets.claim_coordinator, group_id)
                    self._check_owned(group_id)
                    self._epochs[group_id] = epoch
                    log.info("group %r: coordinated here from epoch %d", group_id, epoch)

    async def topics(self, *, fresh: bool = False) -> Topics:
        """Every topic's partition count, as consumer-protocol groups see them (re-read when the
        catalog changed, looked at once a second at most; `fresh`: looked at now)."""
        index = self._topic_index
        now = self.clock()
        if fresh or now - index.checked >= 1.0:
            index.checked = now
            marker = await asyncio.to_thread(self.registry.storage.read_marker, CATALOG_MARKER)
            if marker != index.marker or not marker:
                counts, ids, unread = await asyncio.to_thread(self._read_topics, index)
                if counts != index.topics.counts or ids != index.ids:
                    index.topics, index.ids = Topics(index.topics.version + 1, counts), ids
                index.marker = None if unread else marker  # a topic not read: again in a second
                index.unread = unread
        return index.topics

    def _read_topics(self, known: _TopicIndex) -> tuple[dict[str, int], dict[str, uuid.UUID], set[str]]:
        """Every topic's partition count and id, and the topics that could not be read just now (a
        storage error): each keeps what `known` held of it. Dropped, its partitions would leave
        every group subscribed to it, a rebalance of them all, and come back a second later."""
        counts: dict[str, int] = {}
        ids: dict[str, uuid.UUID] = {}
        unread: set[str] = set()
        for name in self.registry.catalog.list_topics():
            try:
                reader = self.registry.reader(name)
                counts[name], ids[name] = reader.config.partitions, reader.topic_id
            except (TopicNotFoundError, InvalidTopicError):
                continue  # deleted meanwhile (or a name no topic can have)
            except TopiclakeError as exc:
                unread.add(name)
                if name not in known.unread:  # once, not every second while it lasts
                    log.warning("topic %r not read for consumer groups (its last known state kept): %s", name, exc)
                if name in known.ids:
                    counts[name], ids[name] = known.topics.counts[name], known.ids[name]
        return counts, ids, unread

    def topic_ids(self) -> Mapping[str, uuid.UUID]:
        """Each topic's id, as of the last `topics()`."""
        return self._topic_index.ids

    async def _weights(self, g: ConsumerGroup) -> dict[tuple[str, int], int]:
        """Each subscribed partition's lag for the `lag` assignor (re-read once a second at most)."""
        now = self.clock()
        cached = self._lag_weights.get(g.group_id)
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]
        await asyncio.to_thread(self.offsets.load)
        rows = await asyncio.to_thread(self._lag, g.group_id, set(g.subscribed), lambda t: True)
        weights = {(r.topic, r.partition): r.lag for r in rows}
        self._lag_weights[g.group_id] = (now, weights)
        return weights

    def consumer_group(self, group_id: str) -> ConsumerGroup:
        """Raises: NotCoordinatorError, UnknownGroupError (no consumer-protocol group of that id)."""
        self._check_owned(group_id)
        g = self.consumer_groups.get(group_id)
        if g is None:
            raise UnknownGroupError(f"Group {group_id!r} is not a consumer-protocol group.", group=group_id)
        return g

    # -- offsets: the one door ------------------------------------------------------------------
    async def commit(
        self,
        group_id: str,
        commits: list[OffsetCommit],
        *,
        member_id: str | None,
        generation: int | None,
        principal: str | None = None,
        write: Callable[[str, list[OffsetCommit]], Awaitable[int]] | None = None,
    ) -> int:
        """Durably commit offsets if the caller owns them in the current generation. `write`: what
        to do with checked offsets instead of committing them (a transaction stages them).

        Raises: InvalidGroupError, UnknownMemberError, FencedMemberError, InvalidOffsetError,
        StorageUnavailableError, AuthorizationError (a member another principal joined).
        """
        validate_group_id(group_id)
        for c in commits:
            validate_commit(c)
        await asyncio.to_thread(self._check_partitions_exist, commits)
        await self.restored(group_id)
        write = write or self._write_commits
        cg = self.consumer_groups.get(group_id)
        if cg is not None:  # Kafka's rule there: the member's current epoch (no generations)
            self._check_owned(group_id)
            cg.check_commit(
                member_id,
                -1 if generation is None else generation,
                principal,
                [(c.topic, c.partition) for c in commits],
            )
            return await write(group_id, commits)
        g = await self._ensure(group_id, create="range")
        assert g is not None
        async with self._lock(g):
            if self.groups.get(group_id) is not g:  # released (and maybe taken back) while we waited
                raise NotCoordinatorError(f"Group {group_id!r} moved; commit again.", group=group_id)
            g.check_commit(
                member_id=member_id,
                generation=generation,
                partitions=[(c.topic, c.partition) for c in commits],
                now=self.clock(),
                principal=principal,
            )
            return await write(group_id, commits)

    async def commit_transactional(
        self, commits: Mapping[str, list[OffsetCommit]], transaction: tuple[str, int] | None = None
    ) -> None:
        """Write committed transactions' offsets, of every group, in one Delta commit (their members
        were checked when they were staged): fenced by each group's coordinator epoch where this
        gateway coordinates the group; a group coordinated elsewhere reads them on its next offset
        fetch. `transaction`: the Delta app transaction naming the last of them, which makes the
        write idempotent (OffsetStore.commit).

        Raises: StorageUnavailableError, NotCoordinatorError (a group moved while writing)."""
        fences = [f for g in sorted(commits) if g in self._epochs and (f := self._fence(g)) is not None]
        rows = [c for g in sorted(commits) for c in commits[g]]
        await asyncio.to_thread(lambda: self.offsets.commit(rows, fences=fences, transaction=transaction))

    async def _write_commits(self, group_id: str, commits: list[OffsetCommit]) -> int:
        fence = self._fence(group_id)
        try:
            return await asyncio.to_thread(lambda: self.offsets.commit(commits, fence=fence))
        except NotCoordinatorError:
            self.release(group_id)  # someone else claimed the group: stop acting for it
            raise

    def _check_partitions_exist(self, commits: list[OffsetCommit]) -> None:
        """Kafka refuses commits for unknown topics or partitions. Raises: TopicNotFoundError,
        PartitionNotFoundError."""
        for topic in sorted({c.topic for c in commits}):
            n = self.registry.partitions(topic)
            for c in commits:
                if c.topic == topic and c.partition >= n:
                    raise PartitionNotFoundError(topic, c.partition, n)

    async def committed(
        self, group_id: str, *, member_id: str | None = None, epoch: int = -1
    ) -> dict[tuple[str, int], OffsetCommit]:
        """The group's committed offsets, including commits by other writers (Spark queries with
        groupId, other servers). `member_id`, `epoch`: the member asking (Kafka's OffsetFetch
        v9+), checked as ConsumerGroup.check_fetch in a consumer-protocol group coordinated here.

        Raises: UnknownGroupError (no members and no commits), and as ConsumerGroup.check_fetch."""
        await self.restored(group_id)
        if (cg := self.consumer_groups.get(group_id)) is not None and self.owns(group_id):
            cg.check_fetch(member_id, epoch)
        await asyncio.to_thread(self.offsets.load)
        out = self.offsets.committed(group_id)
        if not out and group_id not in self.groups:
            raise UnknownGroupError(f"Group {group_id!r} has no members and no committed offsets.", group=group_id)
        return out

    async def group_names(self) -> list[str]:
        """Every group with members or committed offsets."""
        await asyncio.to_thread(self.offsets.load)
        return sorted(set(self.groups) | set(self.consumer_groups) | set(self.offsets.groups()))

    async def summaries(self) -> list[GroupSummary]:
        """Every group: live here, else as its coordinator (another gateway, or none) last
        persisted it."""
        names = await self.group_names()
        persisted = await asyncio.to_thread(self.store.load)
        out = []
        for name in sorted(set(names) | set(persisted)):
            g, rec = self.groups.get(name), persisted.get(name)
            cg = self.consumer_groups.get(name)
            if cg is not None:
                out.append(GroupSummary(name, cg.state, len(cg.members), cg.epoch, "consumer", "consumer"))
            elif g is not None:
                out.append(GroupSummary(name, g.state, len(g.members), g.generation, g.protocol_type))
            elif rec is not None and rec.state != DEAD:
                out.append(
                    GroupSummary(name, rec.state, len(rec.members), rec.generation, protocol_type_of(rec.assignor))
                )
            elif rec is not None and name not in names:
                continue  # deleted, and nothing committed since
            else:
                out.append(GroupSummary(name, EMPTY, 0, 0, "consumer"))
        return out

    def _lag(self, group_id: str, topics: set[str], visible: Callable[[str], bool]) -> list[GroupLag]:
        committed = self.offsets.committed(group_id)
        rows = []
        for t in sorted(t for t in topics | {t for t, _ in committed} if visible(t)):
            try:
                parts = self.registry.reader(t).partition_offsets()
            except TopiclakeError:
                continue  # a deleted topic
            for p in parts:
                c = committed.get((t, p.partition))
                rows.append(
                    GroupLag(
                        topic=t,
                        partition=p.partition,
                        committed_offset=c.offset if c else None,
                        high_watermark=p.high_watermark,
                        log_start_offset=p.log_start_offset,
                        lag=partition_lag(
                            committed=c.offset if c else None,
                            log_start_offset=p.log_start_offset,
                            high_watermark=p.high_watermark,
                        ),
                    )
                )
        return rows

    async def describe(
        self, group_id: str, visible: Callable[[str], bool] = lambda topic: True
    ) -> tuple[GroupState, list[GroupLag]]:
        """The group (an Empty one if it only has commits) and its lag per partition of the topics
        `visible` lets through (the caller may describe them).

        Raises: UnknownGroupError, NotCoordinatorError."""
        await self._ensure(group_id)
        await asyncio.to_thread(self.offsets.load)
        await self.restored(group_id)
        cg = self.consumer_groups.get(group_id)
        g = self.groups.get(group_id) if cg is None else _classic_view(cg)
        if g is None and not self.offsets.committed(group_id):
            raise UnknownGroupError(f"Group {group_id!r} does not exist.", group=group_id)
        g = g or GroupState(group_id=group_id)
        topics = {t for m in g.members.values() for t in m.topics}
        return g, await asyncio.to_thread(self._lag, group_id, topics, visible)

    async def reset(
        self,
        group_id: str,
        topic: str,
        to: OffsetSpec,
        *,
        timestamp: int | None = None,
        offset: int | None = None,
        partitions: list[int] | None = None,
    ) -> dict[int, int]:
        """Move a group's committed offsets of `topic` (see TopicReader.resolve_offsets for `to`)
        while it has no members.

        Raises: GroupNotEmptyError, TopicNotFoundError, PartitionNotFoundError, InvalidOffsetError.
        """
        validate_group_id(group_id)
        g = await self._ensure(group_id)
        await self.restored(group_id)
        cg = self.consumer_groups.get(group_id)
        members = len(g.members) if g is not None else len(cg.members) if cg is not None else 0
        if members:
            raise GroupNotEmptyError(f"Group {group_id!r} has {members} active members.", group=group_id)
        reader = await asyncio.to_thread(self.registry.reader, topic)
        offsets = await asyncio.to_thread(
            lambda: reader.resolve_offsets(to, timestamp=timestamp, offset=offset, partitions=partitions)
        )
        now_us = int(time.time() * 1e6)
        commits = [
            OffsetCommit(
                group=group_id, topic=topic, partition=p, offset=o, metadata="reset", commit_timestamp_us=now_us
            )
            for p, o in offsets.items()
        ]
        await self.commit(group_id, commits, member_id=None, generation=None)
        return offsets

    async def delete_group(self, group_id: str) -> None:
        """Kafka's DeleteGroups: a group without members loses its committed offsets, and is
        persisted as Dead (listed no more; joining again starts it anew).

        Raises: InvalidGroupError, GroupNotEmptyError, UnknownGroupError, NotCoordinatorError,
        StorageUnavailableError."""
        validate_group_id(group_id)
        await asyncio.to_thread(self.offsets.load)
        committed = self.offsets.committed(group_id)
        known = group_id in self.groups or group_id in await self._persisted() or committed
        await self.restored(group_id)
        cg = self.consumer_groups.get(group_id)
        if not known and cg is None:
            raise UnknownGroupError(f"Group {group_id!r} does not exist.", group=group_id)
        if cg is not None:
            self._check_owned(group_id)
            if cg.members:
                raise GroupNotEmptyError(f"Group {group_id!r} has {len(cg.members)} active members.", group=group_id)
            del self.consumer_groups[group_id]
            self._touched(group_id)
            if not known:
                log.info("group %r: deleted", group_id)
                return
        g = await self._ensure(group_id, create="range")
        assert g is not None
        async with self._lock(g):
            if g.members:
                raise GroupNotEmptyError(f"Group {group_id!r} has {len(g.members)} active members.", group=group_id)
            fence = self._fence(group_id)
            await asyncio.to_thread(lambda: self.offsets.delete(group_id, list(committed), fence=fence))
            g.state = DEAD
            await self._save([g])
            self.groups.pop(group_id, None)
        log.info("group %r: deleted", group_id)

    async def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> None:
        """Kafka's OffsetDelete: forget committed offsets of topics the group does not subscribe to.

        Raises: InvalidGroupError, UnknownGroupError, GroupSubscribedToTopicError,
        NotCoordinatorError, StorageUnavailableError."""
        validate_group_id(group_id)
        await asyncio.to_thread(self.offsets.load)
        await self.restored(group_id)
        cg = self.consumer_groups.get(group_id)
        if not self.offsets.committed(group_id) and group_id not in self.groups and cg is None:
            raise UnknownGroupError(f"Group {group_id!r} does not exist.", group=group_id)
        if cg is not None:
            self._check_owned(group_id)
            busy = sorted({t for t, _ in partitions} & set(cg.subscribed))
            if busy:
                raise GroupSubscribedToTopicError(
                    f"Group {group_id!r} has members subscribed to {busy[0]!r}; stop them first.", group=group_id
                )
            await self._claim(group_id)
            fence = self._fence(group_id)
            await asyncio.to_thread(lambda: self.offsets.delete(group_id, partitions, fence=fence))
            return
        g = await self._ensure(group_id, create="range")
        assert g is not None
        async with self._lock(g):
            subscribed = {t for m in g.members.values() for t in m.topics}
            busy = sorted({t for t, _ in partitions} & subscribed)
            if busy:
                raise GroupSubscribedToTopicError(
                    f"Group {group_id!r} has members subscribed to {busy[0]!r}; stop them first.", group=group_id
                )
            fence = self._fence(group_id)
            await asyncio.to_thread(lambda: self.offsets.delete(group_id, partitions, fence=fence))

    def all_groups(self) -> Mapping[str, GroupState]:
        return self.groups


def _classic_view(g: ConsumerGroup) -> GroupState:
    """A consumer-protocol group as the classic shape describes it (HTTP's GET /groups/{g}): its
    epoch as the generation, each member's current partitions as its assignment."""
    view = GroupState(group_id=g.group_id, generation=g.epoch, state=g.state, assignor=g.assignor)
    for m in g.members.values():
        view.members[m.member_id] = MemberState(
            member_id=m.member_id,
            instance_id=m.instance_id,
            topics=frozenset(g.member_topics(m, g.subscribed)),
            session_timeout_ms=g.session_timeout_ms,
            last_heartbeat=m.last_heartbeat,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            assignment={t: sorted(ps) for t, ps in m.assigned.items()},
            principal=m.principal,
            client_id=m.client_id,
            client_host=m.client_host,
        )
    return view
