"""The consumer-group state machine (Kafka's eager rebalance protocol), pure: no I/O, no clock.

Every transition takes `now` (monotonic seconds) from the caller. The coordinator (consumer_api)
drives it from its event loop and does the waiting and the persistence; a Kafka listener can
drive the same machine from JoinGroup/SyncGroup/Heartbeat/LeaveGroup.

- A join by a new member, a changed subscription, a leave or an expired session starts a
  rebalance: the group is PreparingRebalance and heartbeats answer `rebalance`; members commit
  what they processed (their generation is still current) and join again.
- The rebalance completes when every member rejoined or the rebalance timeout (the largest session
  timeout) passed; members that did not rejoin are dropped. Then the generation is bumped and the
  assignor (or a rebalance job's pending assignment) runs.
- Static membership: a join with a known `instance_id` and an unchanged subscription takes over
  that member's id and partitions without a rebalance.
- Groups whose leader assigns (Kafka's classic protocol as Kafka runs it: Connect's workers,
  Kafka Streams, an assignor the coordinator does not know; `assignor` "kafka:<protocol type>"):
  the completion picks the protocol every member offers (by vote) and a leader, and the group waits
  in CompletingRebalance for the leader's SyncGroup, which hands every member its opaque
  assignment. Such a group holds Kafka members only; HTTP members are assigned by the coordinator.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from delta_log.core.assignors import assign
from delta_log.core.group_rules import (
    AWAITING_SYNC,
    EMPTY,
    PREPARING,
    STABLE,
    MemberState,
    check_commit,
    expired,
    leader_assigns,
    protocol_type_of,
)
from delta_log.errors import (
    AuthorizationError,
    FencedMemberError,
    InconsistentGroupProtocolError,
    RebalanceInProgressError,
    UnknownMemberError,
)

#: member id -> topic -> partitions
Assignment = dict[str, dict[str, list[int]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinResult:
    member_id: str
    generation: int
    assignment: dict[str, list[int]]
    members: int
    #: groups whose leader assigns: this generation's protocol and leader, and for the leader
    #: only, every member's (member id, instance id, metadata for that protocol)
    protocol: str | None = None
    leader: str | None = None
    member_metadata: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResult:
    generation: int
    rebalance: bool
    assignment: dict[str, list[int]]


def _check_owner(group_id: str, m: MemberState, principal: str | None) -> None:
    """Raises: AuthorizationError unless `principal` joined `m` (None: auth is off, no check)."""
    if principal is not None and m.principal != principal:
        raise AuthorizationError(
            f"Member {m.member_id!r} of group {group_id!r} was joined with another API key; "
            "heartbeat, leave and commit with the key that joined it, or join as a new member.",
            group=group_id,
            member_id=m.member_id,
        )


def new_member_id(instance_id: str | None) -> str:
    return f"{instance_id or 'member'}-{uuid.uuid4().hex[:12]}"


@dataclass(slots=True, kw_only=True)
class GroupState:
    """One consumer group's membership, generation and assignment."""

    group_id: str
    generation: int = 0
    state: str = EMPTY
    assignor: str = "range"
    members: dict[str, MemberState] = field(default_factory=dict)
    rebalance_deadline: float | None = None
    #: a rebalance job's assignment, used by the next completion if its members still match
    pending: Assignment | None = None
    #: where the leader assigns: this generation's protocol and leader
    protocol: str | None = None
    leader: str | None = None
    #: topic -> partition count the current assignment was made for (0: the topic did not exist)
    assigned_counts: dict[str, int] = field(default_factory=dict)

    # -- queries ---------------------------------------------------------------------------------
    def member(self, member_id: str, principal: str | None = None) -> MemberState:
        """The member; with `principal`, only if that principal joined it.

        Raises: UnknownMemberError, AuthorizationError (another principal's member)."""
        m = self.members.get(member_id)
        if m is None:
            raise UnknownMemberError(
                f"Member {member_id!r} is not in group {self.group_id!r}.", member_id=member_id[:300]
            )
        _check_owner(self.group_id, m, principal)
        return m

    @property
    def leader_assigns(self) -> bool:
        return leader_assigns(self.assignor)

    @property
    def protocol_type(self) -> str:
        return protocol_type_of(self.assignor)

    def result(self, m: MemberState) -> JoinResult:
        metadata: tuple[tuple[str, str | None, bytes], ...] = ()
        if self.leader_assigns and m.member_id == self.leader:
            metadata = tuple(
                (x.member_id, x.instance_id, dict(x.protocols).get(self.protocol or "", b""))
                for x in self.members.values()
            )
        return JoinResult(
            member_id=m.member_id,
            generation=self.generation,
            assignment=dict(m.assignment),
            members=len(self.members),
            protocol=self.protocol,
            leader=self.leader,
            member_metadata=metadata,
        )

    @property
    def rebalancing(self) -> bool:
        return self.state == PREPARING

    def ready_to_complete(self, now: float) -> bool:
        """A rebalance in progress can complete: everyone rejoined, or the timeout passed."""
        if self.state != PREPARING:
            return False
        if all(m.rejoined for m in self.members.values()):
            return True
        return self.rebalance_deadline is not None and now >= self.rebalance_deadline

    # -- transitions -----------------------------------------------------------------------------
    def join(
        self,
        *,
        now: float,
        topics: Iterable[str],
        member_id: str | None,
        instance_id: str | None,
        session_timeout_ms: int,
        assignor: str,
        principal: str | None = None,
        protocols: Sequence[tuple[str, bytes]] = (),
        client: tuple[str, str] = ("", ""),
    ) -> tuple[MemberState, bool]:
        """Add or refresh a member. Returns (member, settled): when `settled`, the current
        assignment stands and the join is answered now; otherwise a rebalance is in progress and
        the caller waits until `ready_to_complete`, then calls `complete`.

        `principal`: who joins (None while auth is off); a member id or a static instance id that
        another principal joined is refused, so no key can take over another key's member.
        `assignor` "kafka:<protocol type>" with `protocols` (Kafka's (name, metadata), preferred
        first): a member of a group whose leader assigns.

        Raises: UnknownMemberError (a `member_id` the group does not know), AuthorizationError,
        InconsistentGroupProtocolError (the group's members assign otherwise, or share no protocol).
        """
        subs = frozenset(topics)
        offered = tuple(protocols)
        self._check_protocols(member_id, assignor, offered)
        if member_id is not None:
            member = self.member(member_id, principal)
        else:
            found = next((m for m in self.members.values() if instance_id and m.instance_id == instance_id), None)
            if found is not None:
                _check_owner(self.group_id, found, principal)
            if found is not None and found.topics == subs and found.protocols == offered and self.state == STABLE:
                found.last_heartbeat = now  # static member back within its session: no rebalance
                found.session_timeout_ms = session_timeout_ms
                found.client_id, found.client_host = client
                return found, True
            if found is None:
                found = MemberState(
                    member_id=new_member_id(instance_id),
                    instance_id=instance_id,
                    topics=subs,
                    session_timeout_ms=session_timeout_ms,
                    last_heartbeat=now,
                    principal=principal or "",
                    protocols=offered,
                )
                self.members[found.member_id] = found
            member = found
        member.last_heartbeat = now
        member.session_timeout_ms = session_timeout_ms
        member.client_id, member.client_host = client
        unchanged = member_id is not None and member.topics == subs and member.protocols == offered
        if self.leader_assigns and leader_assigns(assignor):
            # Kafka's rule: a member that rejoins unchanged gets the current generation again (it
            # may have lost the answer); only the leader rejoining a Stable group starts a rebalance
            if unchanged and (self.state == AWAITING_SYNC or (self.state == STABLE and member_id != self.leader)):
                return member, True
        elif self.state == STABLE and unchanged and member.assignment:
            return member, True  # nothing changed
        member.topics = subs
        member.protocols = offered
        if len(self.members) <= 1:
            self.assignor = assignor
        self.start_rebalance(now)
        member.rejoined = True
        return member, False

    def _check_protocols(self, member_id: str | None, assignor: str, offered: tuple[tuple[str, bytes], ...]) -> None:
        """Raises: InconsistentGroupProtocolError unless the joining member fits the other members:
        the same kind of assignment, and (where the leader assigns) the same protocol type and a
        protocol every member offers."""
        others = [m for m in self.members.values() if m.member_id != member_id]
        if not others:
            return
        if leader_assigns(assignor) != self.leader_assigns or (self.leader_assigns and assignor != self.assignor):
            raise InconsistentGroupProtocolError(
                f"Group {self.group_id!r} is a {self.protocol_type!r} group whose "
                f"{'leader member' if self.leader_assigns else 'coordinator'} assigns; "
                "this member cannot join it.",
                group=self.group_id,
            )
        if self.leader_assigns and not self._common({p for p, _ in offered}, others):
            raise InconsistentGroupProtocolError(
                f"Group {self.group_id!r}: none of the protocols {[p for p, _ in offered]} is offered by every member.",
                group=self.group_id,
            )

    @staticmethod
    def _common(names: set[str], members: Iterable[MemberState]) -> set[str]:
        for m in members:
            if m.protocols:
                names &= {p for p, _ in m.protocols}
        return names

    def _vote(self) -> str | None:
        """Kafka's protocol choice: among the protocols every member offers, each member votes for
        the one it prefers most; the most votes win (ties: the first member's preference)."""
        members = list(self.members.values())
        candidates = self._common({p for p, _ in members[0].protocols}, members) if members else set()
        votes: dict[str, int] = {}
        for m in members:
            choice = next(p for p, _ in m.protocols if p in candidates) if candidates else None
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        order = [p for p, _ in members[0].protocols] if members else []
        return max(votes, key=lambda p: (votes[p], -order.index(p)), default=None)

    def start_rebalance(self, now: float) -> None:
        """Enter PreparingRebalance (no-op if already there). With no members left, the caller
        completes at once (`ready_to_complete` is true)."""
        if self.state == PREPARING:
            return
        self.state = PREPARING
        timeout = max((m.session_timeout_ms for m in self.members.values()), default=0) / 1000
        self.rebalance_deadline = now + timeout
        for m in self.members.values():
            m.rejoined = False

    def topics_to_assign(self) -> list[str]:
        """Drop members that did not rejoin; the topics the survivors subscribe to (the caller looks
        up their partition counts for `complete`)."""
        for mid in [m.member_id for m in self.members.values() if not m.rejoined]:
            self.members.pop(mid)
        return sorted({t for m in self.members.values() for t in m.topics})

    def complete(self, partitions: Mapping[str, int]) -> None:
        """Finish a rebalance: assign, bump the generation, become Stable (Empty without members).

        `partitions`: topic -> partition count for `topics_to_assign()` (0 for a deleted topic).
        """
        self.topics_to_assign()
        self.assigned_counts = dict(partitions)
        if self.leader_assigns:
            self._complete_for_leader()
            return
        previous = {m.member_id: m.assignment for m in self.members.values()}
        pending, self.pending = self.pending, None
        if pending is not None and set(pending) == set(self.members):
            assignment: Assignment = {mid: dict(a) for mid, a in pending.items()}
        elif self.members:
            subs = {m.member_id: m.topics for m in self.members.values()}
            assignment = assign(self.assignor, subs, partitions, previous)
        else:
            assignment = {}
        for m in self.members.values():
            m.assignment = assignment.get(m.member_id, {})
            m.rejoined = True
        self.generation += 1
        self.state = STABLE if self.members else EMPTY
        self.rebalance_deadline = None

    def _complete_for_leader(self) -> None:
        """A new generation whose assignment the leader will hand out (SyncGroup)."""
        self.pending = None
        for m in self.members.values():
            m.previous_assignment = m.assignment or m.previous_assignment
            m.assignment, m.leader_assignment, m.rejoined = {}, b"", True
        self.protocol = self._vote()
        if self.leader not in self.members:
            self.leader = next(iter(self.members), None)
        self.generation += 1
        self.state = AWAITING_SYNC if self.members else EMPTY
        self.rebalance_deadline = None

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: Mapping[str, tuple[bytes, dict[str, list[int]]]],
        principal: str | None = None,
    ) -> bytes | None:
        """Kafka's SyncGroup where the leader assigns. The leader's, in CompletingRebalance, hands
        every member its assignment (opaque bytes, and the topic partitions they name where the
        protocol type is "consumer"; a member it leaves out gets none) and makes the group Stable.
        Returns the member's assignment once Stable; None while the leader's is still awaited (the
        caller waits for the group to change and asks again).

        Raises: UnknownMemberError, AuthorizationError, RebalanceInProgressError (join again),
        FencedMemberError (another generation)."""
        m = self.member(member_id, principal)
        if self.state == PREPARING:
            raise RebalanceInProgressError(f"Group {self.group_id!r} is rebalancing; join again.", group=self.group_id)
        if generation != self.generation:
            raise FencedMemberError(
                f"Generation {generation} is not the group's current generation {self.generation}.",
                member_id=member_id,
                generation=generation,
                current_generation=self.generation,
            )
        if self.state == AWAITING_SYNC and member_id == self.leader:
            for x in self.members.values():
                x.leader_assignment, x.assignment = assignments.get(x.member_id, (b"", {}))
            self.state = STABLE
        return m.leader_assignment if self.state == STABLE else None

    def heartbeat(self, member_id: str, generation: int, now: float, principal: str | None = None) -> HeartbeatResult:
        """Raises: UnknownMemberError, FencedMemberError (an old generation), AuthorizationError."""
        m = self.member(member_id, principal)
        m.last_heartbeat = now
        if self.state == PREPARING:
            return HeartbeatResult(generation=self.generation, rebalance=True, assignment=dict(m.assignment))
        if generation != self.generation:
            check_commit(
                self.members, self.generation, member_id=member_id, member_generation=generation, partitions=()
            )
        return HeartbeatResult(generation=self.generation, rebalance=False, assignment=dict(m.assignment))

    def leave(self, member_id: str, now: float, principal: str | None = None) -> None:
        """Raises: UnknownMemberError, AuthorizationError."""
        self.member(member_id, principal)
        self.members.pop(member_id)
        self.start_rebalance(now)

    def expire(self, now: float) -> list[str]:
        """Drop members whose session timed out (starting a rebalance); their ids."""
        gone = expired(self.members, now)
        for mid in gone:
            self.members.pop(mid, None)
        if gone:
            self.start_rebalance(now)
        return gone

    def check_commit(
        self,
        *,
        member_id: str | None,
        generation: int | None,
        partitions: Iterable[tuple[str, int]],
        now: float,
        principal: str | None = None,
    ) -> None:
        """Only the current generation's owner commits (invariant 5), with the key that joined it;
        a commit is also a sign of life.

        Raises: UnknownMemberError, FencedMemberError, AuthorizationError.
        """
        if member_id is not None and member_id in self.members:
            _check_owner(self.group_id, self.members[member_id], principal)
        if self.state == AWAITING_SYNC and member_id is not None:
            raise RebalanceInProgressError(
                f"Group {self.group_id!r} awaits its leader's assignment; commit after SyncGroup.", group=self.group_id
            )
        if self.protocol_type != "consumer":
            partitions = ()  # nothing the coordinator can read says who owns what (Kafka checks no owner either)
        elif self.leader_assigns and member_id in self.members:
            # cooperative rebalancing: a member gives a partition up in the generation after it
            # owned it, and commits it then; nobody owns it until the next generation
            partitions = self._released_by(self.members[member_id], partitions)
        check_commit(
            self.members, self.generation, member_id=member_id, member_generation=generation, partitions=partitions
        )
        if member_id is not None:
            self.members[member_id].last_heartbeat = now

    def _released_by(self, m: MemberState, partitions: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """`partitions` less those `m` owned in the previous generation and nobody owns now."""
        owned = {(t, p) for x in self.members.values() for t, ps in x.assignment.items() for p in ps}
        return [(t, p) for t, p in partitions if (t, p) in owned or p not in m.previous_assignment.get(t, ())]

    def adopt(self, generation: int, assignment: Assignment, now: float) -> bool:
        """A rebalance job wrote the next generation: drop the members it expired and rebalance so
        that the completion uses its assignment. False (and nothing changes) unless this group is
        Stable at the generation before it."""
        if self.state != STABLE or generation != self.generation + 1 or self.leader_assigns:
            return False
        for mid in [mid for mid in self.members if mid not in assignment]:
            self.members.pop(mid)
        self.pending = assignment
        self.start_rebalance(now)
        return True
