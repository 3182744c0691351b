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
from delta_log.core.consumer_group import ConsumerGroup
from delta_log.core.group_rules import (
    AWAITING_SYNC,
    EMPTY,
    PREPARING,
    STABLE,
    MemberState,
    check_commit,
    expired,
    leader_assignor,
    leader_assigns,
    protocol_type_of,
)
from delta_log.errors import (
    AuthorizationError,
    FencedInstanceIdError,
    FencedMemberError,
    GroupMaxSizeReachedError,
    InconsistentGroupProtocolError,
    MemberIdRequiredError,
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
    #: a static member that took over its instance id in a Stable group without a rebalance: the
    #: member id it replaced, whose leadership (if it led) it keeps without assigning again
    replaced: str | None = None


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
    #: Kafka's KIP-394: member ids handed to new members (MEMBER_ID_REQUIRED) that have not joined
    #: with them yet -> when each is forgotten (monotonic; its session timeout). A rebalance waits
    #: for them, as Kafka's does; a client that gives up leaves with the id, or it expires.
    pending_members: dict[str, float] = field(default_factory=dict)

    @classmethod
    def downgraded(cls, cg: ConsumerGroup, now: float, *, max_size: int) -> GroupState | None:
        """Kafka's online downgrade (ClassicGroup.fromConsumerGroup): a consumer-protocol group
        whose members all speak the classic protocol (the last consumer-protocol member left) as a
        classic group of Kafka consumers, its leader assigning, at a generation equal to the group
        epoch, each member keeping its target partitions, and a rebalance begun so that they
        rejoin; None when it may not be (a consumer-protocol member in it, no member, more than
        `max_size`, or an HTTP member: its group stays a consumer-protocol group, which serves it
        as the classic one would)."""
        members = list(cg.members.values())
        if not members or len(members) > max_size or any(m.classic is None or not m.classic.protocols for m in members):
            return None
        g = cls(group_id=cg.group_id, generation=cg.epoch, state=STABLE, assignor=leader_assignor("consumer"))
        for m in members:
            assert m.classic is not None
            g.members[m.member_id] = MemberState(
                member_id=m.member_id,
                instance_id=m.instance_id,
                topics=m.topics,
                session_timeout_ms=m.classic.session_timeout_ms,
                last_heartbeat=now,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                assignment={t: sorted(ps) for t, ps in cg.target.get(m.member_id, {}).items()},
                principal=m.principal,
                protocols=m.classic.protocols,
                client_id=m.client_id,
                client_host=m.client_host,
                protocol_type="consumer",
            )
        g.start_rebalance(now)
        return g

    # -- queries ---------------------------------------------------------------------------------
    def member(self, member_id: str, principal: str | None = None, *, instance_id: str | None = None) -> MemberState:
        """The member; with `principal`, only if that principal joined it; with `instance_id`
        (a static member's request), only if that instance id is this member's now.

        Raises: UnknownMemberError, FencedInstanceIdError (a newer process took the instance id
        over), AuthorizationError (another principal's member)."""
        if instance_id is not None:
            current = self.static_member(instance_id)
            if current is not None and current.member_id != member_id:
                raise FencedInstanceIdError(
                    f"Instance id {instance_id!r} of group {self.group_id!r} now belongs to member "
                    f"{current.member_id!r}, not {member_id[:300]!r}.",
                    group=self.group_id,
                    instance_id=instance_id,
                )
        m = self.members.get(member_id)
        if m is None:
            raise UnknownMemberError(
                f"Member {member_id!r} is not in group {self.group_id!r}.", member_id=member_id[:300]
            )
        _check_owner(self.group_id, m, principal)
        return m

    def static_member(self, instance_id: str) -> MemberState | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def rebalance_timeout_s(self) -> float:
        """How long a rebalance waits for members to rejoin: the largest rebalance timeout of its
        members (Kafka's rule), each defaulting to its session timeout."""
        return max((m.rebalance_timeout_ms or m.session_timeout_ms for m in self.members.values()), default=0) / 1000

    @property
    def leader_assigns(self) -> bool:
        return leader_assigns(self.assignor)

    @property
    def protocol_type(self) -> str:
        return protocol_type_of(self.assignor)

    def result(self, m: MemberState, *, replaced: str | None = None) -> JoinResult:
        """The JoinGroup answer for `m`; `replaced`: the member id a static member took over from
        without a rebalance (see `join`)."""
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
            replaced=replaced,
        )

    @property
    def rebalancing(self) -> bool:
        return self.state == PREPARING

    def ready_to_complete(self, now: float) -> bool:
        """A rebalance in progress can complete: every member rejoined and no member id handed
        out is still to join with (Kafka's rule), or the rebalance timeout passed."""
        if self.state != PREPARING:
            return False
        if all(m.rejoined for m in self.members.values()) and not self.pending_members:
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
        rebalance_timeout_ms: int = 0,
        require_member_id: bool = False,
        max_size: int | None = None,
    ) -> tuple[MemberState, bool]:
        """Add or refresh a member, as Kafka's classic coordinator does. Returns (member, settled):
        when `settled`, the current generation stands and the join is answered now; otherwise a
        rebalance is in progress and the caller waits until `ready_to_complete`, then calls
        `complete`.

        - A new dynamic member with `require_member_id` (Kafka's JoinGroup v4+, KIP-394) is given
          a member id and told to join again with it (MemberIdRequiredError); it is pending until
          then.
        - A static member (`instance_id`) joining without a member id takes its instance id over
          under a new member id (KIP-345): the older process is fenced (FencedInstanceIdError on
          its requests). In a Stable group with unchanged protocols and topics it keeps its
          assignment and no rebalance starts.
        - A known member rejoining with unchanged protocols gets the current generation again
          where Kafka gives it (a follower of a Stable group; any member while the leader's
          assignment is awaited); otherwise it starts (or joins) a rebalance.

        `principal`: who joins (None while auth is off); a member id or a static instance id that
        another principal joined is refused, so no key can take over another key's member.
        `max_size`: the most members (and members-to-be given an id); a new one beyond is refused.
        `assignor` "kafka:<protocol type>" with `protocols` (Kafka's (name, metadata), preferred
        first): a member of a group whose leader assigns.

        Raises: MemberIdRequiredError, UnknownMemberError (a `member_id` the group does not know),
        FencedInstanceIdError, AuthorizationError, InconsistentGroupProtocolError (the group's
        members assign otherwise, or share no protocol), GroupMaxSizeReachedError.
        """
        subs = frozenset(topics)
        if max_size is not None and member_id is None and len(self.members) + len(self.pending_members) >= max_size:
            found = self.static_member(instance_id) if instance_id else None
            if found is None:  # (a static member's new process takes its own place)
                raise GroupMaxSizeReachedError(self.group_id, max_size)
        offered = tuple(protocols)
        self._check_protocols(member_id, assignor, offered)
        joined_anew = member_id is not None and self.pending_members.pop(member_id, None) is not None
        if joined_anew:
            assert member_id is not None
            member = self._add(member_id, instance_id, subs, session_timeout_ms, now, principal, offered)
        elif member_id is not None:
            member = self.member(member_id, principal, instance_id=instance_id)
        else:
            found = self.static_member(instance_id) if instance_id else None
            if found is not None:
                _check_owner(self.group_id, found, principal)
                member = self._replace(found, new_member_id(instance_id))
                if found.topics == subs and found.protocols == offered and self.state == STABLE:
                    member.last_heartbeat = now  # the static member is back: no rebalance
                    member.session_timeout_ms = session_timeout_ms
                    member.rebalance_timeout_ms = rebalance_timeout_ms
                    member.client_id, member.client_host = client
                    return member, True
            elif require_member_id and instance_id is None:
                pending = new_member_id(None)
                self.pending_members[pending] = now + session_timeout_ms / 1000
                raise MemberIdRequiredError(
                    f"Join group {self.group_id!r} again with member id {pending!r}.", member_id=pending
                )
            else:
                member = self._add(
                    new_member_id(instance_id), instance_id, subs, session_timeout_ms, now, principal, offered
                )
        member.last_heartbeat = now
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.client_id, member.client_host = client
        unchanged = member_id is not None and not joined_anew and member.topics == subs and member.protocols == offered
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

    def _add(
        self,
        member_id: str,
        instance_id: str | None,
        topics: frozenset[str],
        session_timeout_ms: int,
        now: float,
        principal: str | None,
        protocols: tuple[tuple[str, bytes], ...],
    ) -> MemberState:
        m = MemberState(
            member_id=member_id,
            instance_id=instance_id,
            topics=topics,
            session_timeout_ms=session_timeout_ms,
            last_heartbeat=now,
            principal=principal or "",
            protocols=protocols,
        )
        self.members[member_id] = m
        return m

    def _replace(self, old: MemberState, member_id: str) -> MemberState:
        """A static member's state under its new member id (the old id is no member any more)."""
        del self.members[old.member_id]
        if self.leader == old.member_id:
            self.leader = member_id
        old.member_id = member_id
        self.members[member_id] = old
        return old

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
        self.rebalance_deadline = now + self.rebalance_timeout_s()
        for m in self.members.values():
            m.rejoined = False

    def topics_to_assign(self) -> list[str]:
        """The topics of the members a completion now keeps (those that rejoined, and static ones):
        what it assigns (the caller looks up their partition counts for `complete`)."""
        return sorted({t for m in self.members.values() if m.rejoined or m.instance_id for t in m.topics})

    def complete(self, partitions: Mapping[str, int]) -> None:
        """Finish a rebalance: assign, bump the generation, become Stable (Empty without members).

        `partitions`: topic -> partition count for `topics_to_assign()` (0 for a deleted topic).
        """
        for mid in [m.member_id for m in self.members.values() if not m.rejoined and m.instance_id is None]:
            self.members.pop(mid)  # dynamic members that did not rejoin within the rebalance (static ones stay)
        self.pending_members.clear()  # (their time ran out with the rebalance's)
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
        *,
        instance_id: str | None = None,
    ) -> bytes | None:
        """Kafka's SyncGroup where the leader assigns. The leader's, in CompletingRebalance, hands
        every member its assignment (opaque bytes, and the topic partitions they name where the
        protocol type is "consumer"; a member it leaves out gets none) and makes the group Stable.
        Returns the member's assignment once Stable; None while the leader's is still awaited (the
        caller waits for the group to change and asks again).

        Raises: UnknownMemberError, AuthorizationError, RebalanceInProgressError (join again),
        FencedMemberError (another generation)."""
        m = self.member(member_id, principal, instance_id=instance_id)
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

    def heartbeat(
        self,
        member_id: str,
        generation: int,
        now: float,
        principal: str | None = None,
        *,
        instance_id: str | None = None,
    ) -> HeartbeatResult:
        """Raises: UnknownMemberError, FencedMemberError (an old generation), FencedInstanceIdError,
        AuthorizationError."""
        m = self.member(member_id, principal, instance_id=instance_id)
        m.last_heartbeat = now
        if self.state == PREPARING:
            return HeartbeatResult(generation=self.generation, rebalance=True, assignment=dict(m.assignment))
        if generation != self.generation:
            check_commit(
                self.members, self.generation, member_id=member_id, member_generation=generation, partitions=()
            )
        return HeartbeatResult(generation=self.generation, rebalance=False, assignment=dict(m.assignment))

    def leave(
        self, member_id: str, now: float, principal: str | None = None, *, instance_id: str | None = None
    ) -> None:
        """A member leaves (a rebalance starts), or a pending member id is given up (none does).
        No member id but an instance id: that static member is removed (Kafka's admin removal).

        Raises: UnknownMemberError, FencedInstanceIdError, AuthorizationError."""
        if self.pending_members.pop(member_id, None) is not None:
            return
        if not member_id and instance_id is not None:
            found = self.static_member(instance_id)
            member_id = found.member_id if found is not None else ""
        self.member(member_id, principal, instance_id=instance_id)
        self.members.pop(member_id)
        self.start_rebalance(now)

    def expire(self, now: float) -> list[str]:
        """Drop members whose session timed out (starting a rebalance), and member ids handed out
        that were not joined with in time; the members' ids."""
        for mid in [mid for mid, until in self.pending_members.items() if until <= now]:
            del self.pending_members[mid]
        awaiting = self.state == PREPARING  # a member waiting for its join's answer needs no heartbeat (Kafka's rule)
        gone = [mid for mid in expired(self.members, now) if not (awaiting and self.members[mid].rejoined)]
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
