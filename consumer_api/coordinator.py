"""Group coordinator: join, heartbeat, leave, commit, with generations and session timeouts.

Runs on the server's event loop; all group state is touched from that loop only (no locks), and
Delta I/O goes to worker threads. Protocol (Kafka's eager rebalance, over HTTP):

- A join by a new member (or a changed subscription, a leave, an expired session) starts a
  rebalance: the group is PreparingRebalance and every heartbeat answers `rebalance: true`; each
  member commits what it has processed (its generation is still current, so commits are accepted)
  and joins again. The join waits until every member rejoined or the rebalance timeout (the
  largest session timeout) passed; members that did not rejoin are dropped. Then the generation is
  bumped, the assignor runs, and every waiting join returns the new assignment.
- Commits carry member id + generation and are checked against the current owners
  (`rules.check_commit`) under the group's lock, so a rebalance cannot complete between the check
  and the durable write: a zombie never moves a committed offset.
- Static membership: a join with a known `instance_id` takes over that member's id and
  partitions without a rebalance.
- State is persisted (delta_log.groups_store) on every generation change and restored at start;
  every `heartbeat_persist_s` each live group's heartbeats are persisted too, so the rebalance job
  can tell dead members from live ones, also after this server crashed.
- The Spark rebalance job (jobs.rebalance) writes a next generation to the same table. The sync
  loop picks it up within `sync_interval_s`: members the job expired are dropped and a rebalance
  starts whose completion uses the job's (lag-aware) assignment, so members commit under their
  old generation first, as in any rebalance. A race between the job and this server is decided
  by Delta: both commit with the group's app transaction id; the server refreshes and wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from consumer_api.rules import MemberState, check_commit, expired, validate_group_id, validate_join
from delta_log.assignors import assign
from delta_log.errors import UnknownGroupError, UnknownMemberError
from delta_log.groups_store import HEARTBEAT, REBALANCE_JOB, SERVER, GroupRecord, GroupStore, MemberRecord
from delta_log.offsets import OffsetCommit, OffsetStore

log = logging.getLogger(__name__)

EMPTY, PREPARING, STABLE = "Empty", "PreparingRebalance", "Stable"


@dataclass(slots=True, kw_only=True)
class Group:
    group_id: str
    generation: int = 0
    state: str = EMPTY
    assignor: str = "range"
    members: dict[str, MemberState] = field(default_factory=dict)
    rebalance_deadline: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: GroupRecord | None = None  # a rebalance job's assignment, used by the next completion


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinResult:
    member_id: str
    generation: int
    assignment: dict[str, list[int]]
    members: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResult:
    generation: int
    rebalance: bool
    assignment: dict[str, list[int]]


class GroupCoordinator:
    def __init__(
        self,
        offsets: OffsetStore,
        store: GroupStore,
        partitions_of: Callable[[str], int],
        *,
        clock: Callable[[], float] = time.monotonic,
        sync_interval_s: float = 1.0,
        heartbeat_persist_s: float = 5.0,
    ) -> None:
        self.offsets = offsets
        self.store = store
        self.partitions_of = partitions_of
        self.clock = clock
        self.sync_interval_s = sync_interval_s
        self.heartbeat_persist_s = heartbeat_persist_s
        self.groups: dict[str, Group] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._seen_version = -1

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        records = await asyncio.to_thread(self.store.load)
        now = self.clock()
        for rec in records.values():
            g = Group(group_id=rec.group, generation=rec.generation, assignor=rec.assignor)
            for m in rec.members:
                g.members[m.member_id] = MemberState(
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    topics=frozenset(m.topics),
                    session_timeout_ms=m.session_timeout_ms,
                    last_heartbeat=now,
                    assignment=m.assignment,
                )
            g.state = STABLE if g.members else EMPTY
            self.groups[rec.group] = g
        self._seen_version = self.store.version
        self._tasks = [asyncio.create_task(self._expire_loop()), asyncio.create_task(self._sync_loop())]

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
        """Pick up generations written by the rebalance job since the last look."""
        version, latest = await asyncio.to_thread(self.store.load_if_changed, self._seen_version)
        self._seen_version = version
        for rec in (latest or {}).values():
            g = self.groups.get(rec.group)
            if g is None or rec.writer != REBALANCE_JOB or rec.generation != g.generation + 1 or g.state != STABLE:
                continue
            keep = {m.member_id for m in rec.members}
            for mid in [mid for mid in g.members if mid not in keep]:
                log.info("group %s: rebalance job expired member %s", g.group_id, mid)
                g.members.pop(mid)
            g.pending = rec
            log.info("group %s: adopting the rebalance job's generation %d", g.group_id, rec.generation)
            await self._start_rebalance(g)

    async def persist_heartbeats(self) -> None:
        """One row per stable group with members, so liveness survives this process."""
        records = [self.record(g, writer=HEARTBEAT) for g in self.groups.values() if g.members and g.state == STABLE]
        if records:
            await asyncio.to_thread(self.store.save, records)
            await asyncio.to_thread(self.store.compact)
        await asyncio.to_thread(self.offsets.compact)  # one file per commit otherwise, forever

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            for g in list(self.groups.values()):
                try:
                    await self._expire(g)
                except Exception:
                    log.exception("expiring members of %s failed", g.group_id)

    async def _expire(self, g: Group) -> None:
        now = self.clock()
        gone = expired(g.members, now)
        if gone:
            for m in gone:
                log.info("group %s: member %s session expired", g.group_id, m)
                g.members.pop(m, None)
            await self._start_rebalance(g)
        if g.state == PREPARING and g.rebalance_deadline is not None and now >= g.rebalance_deadline:
            await self._complete_rebalance(g)

    # -- membership -----------------------------------------------------------------------------
    def group(self, group_id: str) -> Group:
        g = self.groups.get(group_id)
        if g is None:
            raise UnknownGroupError(f"Group {group_id!r} does not exist.", group=group_id)
        return g

    def _member(self, g: Group, member_id: str) -> MemberState:
        m = g.members.get(member_id)
        if m is None:
            raise UnknownMemberError(f"Member {member_id!r} is not in group {g.group_id!r}.", member_id=member_id)
        return m

    async def join(
        self,
        group_id: str,
        *,
        topics: list[str],
        member_id: str | None = None,
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
        assignor: str = "range",
    ) -> JoinResult:
        """Join (or rejoin) and wait for the group's next stable generation.

        Raises: InvalidGroupError, UnknownAssignorError, UnknownMemberError, TopicNotFoundError.
        """
        validate_group_id(group_id)
        validate_join(assignor, session_timeout_ms, topics)
        for t in topics:
            await asyncio.to_thread(self.partitions_of, t)  # 404 for unknown topics, before any change
        g = self.groups.setdefault(group_id, Group(group_id=group_id, assignor=assignor))
        now = self.clock()
        subs = frozenset(topics)
        found: MemberState | None
        if member_id is not None:
            found = self._member(g, member_id)
        else:
            found = next((m for m in g.members.values() if instance_id and m.instance_id == instance_id), None)
            if found is not None and found.topics == subs and g.state == STABLE:
                found.last_heartbeat = now  # static member back within its session: no rebalance
                found.session_timeout_ms = session_timeout_ms
                return self._result(g, found)
            if found is None:
                found = MemberState(
                    member_id=f"{instance_id or 'member'}-{uuid.uuid4().hex[:12]}",
                    instance_id=instance_id,
                    topics=subs,
                    session_timeout_ms=session_timeout_ms,
                    last_heartbeat=now,
                )
                g.members[found.member_id] = found
        member = found
        member.last_heartbeat = now
        member.session_timeout_ms = session_timeout_ms
        if g.state == STABLE and member.topics == subs and member.assignment and member_id is not None:
            return self._result(g, member)  # nothing changed: the current assignment stands
        member.topics = subs
        if not g.members or len(g.members) == 1:
            g.assignor = assignor
        if g.state != PREPARING:
            await self._start_rebalance(g)
        member.rejoined = True
        g.changed.set()
        while g.state == PREPARING:
            if all(m.rejoined for m in g.members.values()):
                await self._complete_rebalance(g)
                break
            event = g.changed
            remaining = (g.rebalance_deadline or now) - self.clock()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=max(0.01, min(remaining, 0.5)))
            member.last_heartbeat = self.clock()  # waiting in join counts as alive
            if g.rebalance_deadline is not None and self.clock() >= g.rebalance_deadline:
                await self._complete_rebalance(g)
        if member.member_id not in g.members:
            raise UnknownMemberError(f"Member {member.member_id!r} was dropped from the group; join again.")
        return self._result(g, member)

    def _result(self, g: Group, m: MemberState) -> JoinResult:
        return JoinResult(
            member_id=m.member_id, generation=g.generation, assignment=dict(m.assignment), members=len(g.members)
        )

    async def _start_rebalance(self, g: Group) -> None:
        if not g.members:
            await self._complete_rebalance(g)
            return
        if g.state != PREPARING:
            g.state = PREPARING
            timeout = max(m.session_timeout_ms for m in g.members.values()) / 1000
            g.rebalance_deadline = self.clock() + timeout
            for m in g.members.values():
                m.rejoined = False
        self._wake(g)

    def _wake(self, g: Group) -> None:
        g.changed.set()
        g.changed = asyncio.Event()

    async def _complete_rebalance(self, g: Group) -> None:
        async with g.lock:  # no commit is between its check and its write while generations change
            if g.state != PREPARING and g.members:
                return
            for mid in [m.member_id for m in g.members.values() if not m.rejoined]:
                g.members.pop(mid)
            previous = {m.member_id: m.assignment for m in g.members.values()}
            topics = sorted({t for m in g.members.values() for t in m.topics})
            partitions = {}
            for t in topics:
                try:
                    partitions[t] = await asyncio.to_thread(self.partitions_of, t)
                except Exception:
                    partitions[t] = 0  # a deleted topic: nothing to assign
            pending, g.pending = g.pending, None
            if pending is not None and {m.member_id for m in pending.members} == set(g.members):
                assignment = {m.member_id: m.assignment for m in pending.members}
            elif g.members:
                subs = {m.member_id: m.topics for m in g.members.values()}
                assignment = assign(g.assignor, subs, partitions, previous)
            else:
                assignment = {}
            for m in g.members.values():
                m.assignment = assignment.get(m.member_id, {})
                m.rejoined = True
            g.generation += 1
            g.state = STABLE if g.members else EMPTY
            g.rebalance_deadline = None
            await asyncio.to_thread(self.store.save, [self.record(g)])
            log.info("group %s: generation %d, %d members", g.group_id, g.generation, len(g.members))
        self._wake(g)

    def record(self, g: Group, *, writer: str = SERVER) -> GroupRecord:
        wall, mono = time.time(), self.clock()
        return GroupRecord(
            group=g.group_id,
            generation=g.generation,
            state=g.state,
            assignor=g.assignor,
            members=tuple(
                MemberRecord(
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    topics=tuple(sorted(m.topics)),
                    session_timeout_ms=m.session_timeout_ms,
                    assignment=m.assignment,
                    last_heartbeat_ms=int((wall - (mono - m.last_heartbeat)) * 1000),
                )
                for m in g.members.values()
            ),
            updated_at_us=int(wall * 1e6),
            writer=writer,
        )

    async def heartbeat(self, group_id: str, member_id: str, generation: int) -> HeartbeatResult:
        """Raises: UnknownGroupError, UnknownMemberError, FencedMemberError."""
        g = self.group(group_id)
        m = self._member(g, member_id)
        m.last_heartbeat = self.clock()
        if g.state == PREPARING:
            return HeartbeatResult(generation=g.generation, rebalance=True, assignment=dict(m.assignment))
        if generation != g.generation:
            check_commit(g.members, g.generation, member_id=member_id, member_generation=generation, partitions=())
        return HeartbeatResult(generation=g.generation, rebalance=False, assignment=dict(m.assignment))

    async def leave(self, group_id: str, member_id: str) -> None:
        """Raises: UnknownGroupError, UnknownMemberError."""
        g = self.group(group_id)
        self._member(g, member_id)
        g.members.pop(member_id)
        await self._start_rebalance(g)

    # -- offsets --------------------------------------------------------------------------------
    async def commit(
        self,
        group_id: str,
        commits: list[OffsetCommit],
        *,
        member_id: str | None,
        generation: int | None,
    ) -> int:
        """Durably commit offsets if the caller owns them in the current generation.

        Raises: UnknownMemberError, FencedMemberError, InvalidOffsetError, StorageUnavailableError.
        """
        validate_group_id(group_id)
        g = self.groups.setdefault(group_id, Group(group_id=group_id))
        async with g.lock:
            check_commit(
                g.members,
                g.generation,
                member_id=member_id,
                member_generation=generation,
                partitions=[(c.topic, c.partition) for c in commits],
            )
            if member_id is not None:
                g.members[member_id].last_heartbeat = self.clock()
            return await asyncio.to_thread(self.offsets.commit, commits)

    def describe(self, group_id: str) -> Group:
        return self.group(group_id)

    def all_groups(self) -> Mapping[str, Group]:
        return self.groups
