"""Consumer groups on Kafka 4's consumer protocol (KIP-848), pure: no I/O, no clock.

The coordinator drives it from ConsumerGroupHeartbeat; every transition takes `now` (monotonic
seconds) and the topics as the coordinator sees them (name -> partition count). Kafka's rules, as
its group coordinator (GroupMetadataManager, CurrentAssignmentBuilder) runs them:

- **Epochs.** The group epoch moves when a member joins, leaves, is fenced or changes its
  subscription, and when a subscribed topic appears, goes or gets partitions. A new target
  assignment is computed by the server-side assignor for each group epoch. Each member has its own
  epoch, which reaches the target's as it reconciles.
- **Incremental revocation.** A member asked to give partitions up keeps its epoch and the rest of
  its partitions (UNREVOKED_PARTITIONS) until a heartbeat no longer lists them as owned; a
  partition is handed to its new owner only once its old owner released it (until then the new
  owner waits in UNRELEASED_PARTITIONS with the partitions that are free). No global barrier: the
  members that keep their partitions go on consuming.
- **Fencing.** A heartbeat with an epoch the coordinator does not know is FENCED_MEMBER_EPOCH (the
  previous epoch is accepted while the member owns no more than its assignment: the answer that
  bumped it may have been lost). A member that neither heartbeats within the session timeout nor
  revokes within its rebalance timeout is removed. A member that joins again with epoch 0 has
  dropped all its partitions (that is what the client does when fenced), so they are free at once.
- **Static members** (`group.instance.id`): epoch -2 leaves for now, keeping the assignment for the
  session timeout; the instance joining again under a new member id takes it over. An instance id
  still in use is UNRELEASED_INSTANCE_ID; a replaced member's requests are FENCED_INSTANCE_ID.
- **Subscriptions** by names, or by a regular expression in RE2's syntax (Kafka's RE2/J), matched
  against whole topic names by the server; internal topics never match. A topic created later that
  matches is assigned at the next metadata refresh.
- **Assignors**, chosen by `group.remote.assignor` (the members' most common choice wins):
  `uniform` (balanced, sticky: Kafka's default), `range` (per topic, contiguous ranges in member
  order, so co-partitioned topics line up) and `lag` (topiclake's: balanced by backlog, not count:
  a member holding a partition with a large lag gets fewer others).
- **Classic members** (Kafka's online upgrade, `group.consumer.migration.policy`): a classic group
  of Kafka consumers becomes a consumer group when a consumer-protocol member joins it
  (`from_classic`: every member keeps its partitions at an epoch equal to the generation), and its
  classic members stay in it, on the same machinery: a JoinGroup is one reconciliation step (their
  subscription says what they still own), SyncGroup hands them their partitions, and a Heartbeat
  answers REBALANCE_IN_PROGRESS when they have partitions to give up or to take, or the group epoch
  moved past theirs. Their own session timeout applies to them.
"""

from __future__ import annotations

import base64
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import re2

from delta_log.core.assignors import assign_range, assign_sticky
from delta_log.core.group_rules import MemberState, validate_join
from delta_log.core.topic_config import INTERNAL_TOPICS
from delta_log.errors import (
    AuthorizationError,
    FencedInstanceIdError,
    FencedMemberEpochError,
    FencedMemberError,
    GroupMaxSizeReachedError,
    InconsistentGroupProtocolError,
    InvalidGroupRequestError,
    InvalidRegularExpressionError,
    RebalanceInProgressError,
    StaleMemberEpochError,
    UnknownAssignorError,
    UnknownMemberError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)

#: a member's reconciliation states (Kafka's MemberState)
STABLE = "stable"
UNREVOKED = "unrevoked_partitions"
UNRELEASED = "unreleased_partitions"
#: group states as ConsumerGroupDescribe and ListGroups name them
EMPTY, ASSIGNING, RECONCILING, GROUP_STABLE = "Empty", "Assigning", "Reconciling", "Stable"
#: the epochs a heartbeat sends to leave: for good, or (a static member) for now
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
#: the server-side assignors, Kafka's default first
ASSIGNORS = ("uniform", "range", "lag")
#: the longest regular expression a member may subscribe with
MAX_REGEX_CHARS = 1024

Partitions = dict[str, frozenset[int]]  # topic -> partitions


@dataclass(frozen=True, slots=True)
class Topics:
    """Every topic's partition count as the coordinator last read it; `version` moves when they
    change (regular expressions are matched again then, not at every heartbeat)."""

    version: int
    counts: Mapping[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """One ConsumerGroupHeartbeat as the group reads it (`None`: not sent, unchanged)."""

    member_id: str
    epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    topics: tuple[str, ...] | None = None
    regex: str | None = None
    assignor: str | None = None
    #: the partitions the member owns, by topic name (topics no longer known are left out)
    owned: Partitions | None = None
    principal: str = ""
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAnswer:
    member_id: str
    epoch: int
    #: the member's partitions, when the request was a full one or they changed; else None
    assignment: Partitions | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassicProtocol:
    """A member that speaks the classic protocol (JoinGroup, SyncGroup, Heartbeat) in a consumer
    group: its session timeout, and the protocols it offers (name, ConsumerProtocol subscription;
    an HTTP member, which joins and heartbeats over HTTP, offers none)."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    principal: str = ""
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300_000
    topics: frozenset[str] = frozenset()
    regex: str | None = None
    assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = 0
    state: str = STABLE
    assigned: Partitions = field(default_factory=dict)
    revoking: Partitions = field(default_factory=dict)
    last_heartbeat: float = 0.0
    #: while UNREVOKED: when the member is fenced unless it has revoked
    revoke_deadline: float | None = None
    #: the member epoch at which it was given each partition it holds (Kafka's KIP-1251: a commit
    #: at any epoch since then, up to its current one, is its own)
    assigned_at: dict[tuple[str, int], int] = field(default_factory=dict)
    #: which topics its key may read (a regular expression matches only those); None: all
    readable: Callable[[str], bool] | None = field(default=None, compare=False)
    #: a classic-protocol member (None: a consumer-protocol one)
    classic: ClassicProtocol | None = None

    def holds(self) -> Iterable[tuple[str, int]]:
        for parts in (self.assigned, self.revoking):
            for t, ps in parts.items():
                for p in ps:
                    yield (t, p)

    @property
    def left_for_now(self) -> bool:
        return self.epoch == STATIC_LEAVE_EPOCH


def _partitions(assignment: Mapping[str, Iterable[int]]) -> Partitions:
    return {t: frozenset(ps) for t, ps in assignment.items() if ps}


def _listed(parts: Partitions) -> dict[str, list[int]]:
    return {t: sorted(ps) for t, ps in sorted(parts.items())}


def _member_snapshot(m: ConsumerMember) -> dict[str, object]:
    return {
        "member_id": m.member_id,
        "instance_id": m.instance_id,
        "rack_id": m.rack_id,
        "principal": m.principal,
        "client_id": m.client_id,
        "client_host": m.client_host,
        "rebalance_timeout_ms": m.rebalance_timeout_ms,
        "topics": sorted(m.topics),
        "regex": m.regex,
        "assignor": m.assignor,
        "epoch": m.epoch,
        "previous_epoch": m.previous_epoch,
        "state": m.state,
        "assigned": _listed(m.assigned),
        "revoking": _listed(m.revoking),
        "assigned_at": sorted([t, p, e] for (t, p), e in m.assigned_at.items()),
        "revoke_pending": m.revoke_deadline is not None,
        "classic": None
        if m.classic is None
        else {
            "session_timeout_ms": m.classic.session_timeout_ms,
            "protocols": [[name, base64.b64encode(meta).decode()] for name, meta in m.classic.protocols],
        },
    }


def _member_restored(raw: Mapping[str, Any], now: float) -> ConsumerMember:
    """A member of a snapshot, alive as of `now` (a revocation it owed is due a rebalance timeout
    from now)."""
    classic = raw["classic"]
    timeout = int(raw["rebalance_timeout_ms"])
    return ConsumerMember(
        member_id=str(raw["member_id"]),
        instance_id=raw["instance_id"],
        rack_id=raw["rack_id"],
        principal=str(raw["principal"]),
        client_id=str(raw["client_id"]),
        client_host=str(raw["client_host"]),
        rebalance_timeout_ms=timeout,
        topics=frozenset(raw["topics"]),
        regex=raw["regex"],
        assignor=raw["assignor"],
        epoch=int(raw["epoch"]),
        previous_epoch=int(raw["previous_epoch"]),
        state=str(raw["state"]),
        assigned=_partitions(raw["assigned"]),
        revoking=_partitions(raw["revoking"]),
        assigned_at={(str(t), int(p)): int(e) for t, p, e in raw["assigned_at"]},
        last_heartbeat=now,
        revoke_deadline=now + timeout / 1000 if raw["revoke_pending"] else None,
        classic=None
        if classic is None
        else ClassicProtocol(
            session_timeout_ms=int(classic["session_timeout_ms"]),
            protocols=tuple((str(n), base64.b64decode(m)) for n, m in classic["protocols"]),
        ),
    )


def compile_regex(pattern: str) -> re2._Regexp:
    """Raises: InvalidRegularExpressionError."""
    if len(pattern) > MAX_REGEX_CHARS:
        raise InvalidRegularExpressionError(f"The regular expression is over {MAX_REGEX_CHARS} characters.")
    try:
        return re2.compile(pattern)
    except Exception as exc:  # re2.error, and what its parser raises for bytes it cannot take
        raise InvalidRegularExpressionError(f"{pattern!r} is not a regular expression in RE2's syntax: {exc}") from exc


@dataclass(slots=True, kw_only=True)
class ConsumerGroup:
    group_id: str
    session_timeout_ms: int
    heartbeat_interval_ms: int
    epoch: int = 0
    assignment_epoch: int = 0
    #: member id -> its target partitions at `assignment_epoch`
    target: dict[str, Partitions] = field(default_factory=dict)
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    #: the subscribed topics' partition counts the target was computed for
    subscribed: dict[str, int] = field(default_factory=dict)
    #: which member holds each partition (assigned to it, or still being revoked from it)
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    #: the assignor of the current target
    assignor: str = ASSIGNORS[0]
    #: the most members; a new one beyond is refused (GroupMaxSizeReachedError)
    max_size: int | None = None
    #: the topics version the subscriptions were last resolved against, and each member's topics then
    _seen: int = -1
    _wanted: dict[str, frozenset[str]] = field(default_factory=dict)

    # -- queries ---------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.epoch > self.assignment_epoch:
            return ASSIGNING
        if any(
            m.epoch != self.assignment_epoch or m.state != STABLE for m in self.members.values() if not m.left_for_now
        ):
            return RECONCILING
        return GROUP_STABLE

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def member_topics(self, m: ConsumerMember, topics: Mapping[str, int]) -> frozenset[str]:
        """The existing topics a member subscribes to, by name or by its regular expression."""
        found = {t for t in m.topics if t in topics}
        if m.regex:
            pattern = compile_regex(m.regex)
            may = m.readable or (lambda t: True)
            found |= {t for t in topics if t not in INTERNAL_TOPICS and may(t) and pattern.fullmatch(t)}
        return frozenset(found)

    def check_commit(
        self, member_id: str | None, epoch: int, principal: str | None, partitions: Iterable[tuple[str, int]] = ()
    ) -> None:
        """Kafka's rule for offset commits in a consumer group (4.3, KIP-1251): a member's, at an
        epoch from the one each partition was given to it at up to its current one (the answer that
        moved its epoch may not have reached it yet); a partition it does not hold only at its
        current epoch. Without a member (epoch < 0, the admin tools) only while the group is empty.
        A classic member commits at its generation, its member epoch.

        Raises: UnknownMemberError, StaleMemberEpochError, FencedMemberError, AuthorizationError."""
        if epoch < 0 and not self.members:
            return
        m = self._member(member_id)
        _check_principal(self.group_id, m, principal)
        if m.classic is not None:  # a classic member commits at its generation (ILLEGAL_GENERATION)
            self._check_generation(m, epoch)
            return
        held = set(m.holds())
        stale = epoch > m.epoch or any(
            epoch < m.assigned_at.get(tp, m.epoch) if tp in held else epoch != m.epoch for tp in partitions
        )
        if stale or (not partitions and epoch != m.epoch):
            raise StaleMemberEpochError(
                f"Member epoch {epoch} is not the member's current one ({m.epoch}): the consumer's "
                "assignment changed; it commits again at its new epoch.",
                group=self.group_id,
                member_id=member_id,
            )

    # -- the heartbeat ---------------------------------------------------------------------------
    def heartbeat(
        self,
        hb: Heartbeat,
        now: float,
        topics: Topics,
        *,
        weights: Callable[[], Mapping[tuple[str, int], int]] | None = None,
        principal: str | None = None,
        readable: Callable[[str], bool] | None = None,
    ) -> HeartbeatAnswer:
        """One ConsumerGroupHeartbeat. `topics`: every topic's partition count now; `weights`:
        each partition's backlog, for the `lag` assignor; `principal`: the caller (None: auth off);
        `readable`: the topics the caller's key may read (its regular expression matches no other).

        Raises: InvalidGroupRequestError, UnknownMemberError, FencedMemberEpochError,
        FencedInstanceIdError, UnreleasedInstanceIdError, UnsupportedAssignorError,
        InvalidRegularExpressionError, AuthorizationError, GroupMaxSizeReachedError (a new member)."""
        _validate(hb)
        if hb.epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(hb, now, principal)
        before, joined = self._member_for(hb, now, principal)
        member = replace(
            before,
            instance_id=hb.instance_id if hb.instance_id is not None else before.instance_id,
            rack_id=hb.rack_id if hb.rack_id is not None else before.rack_id,
            rebalance_timeout_ms=hb.rebalance_timeout_ms
            if hb.rebalance_timeout_ms >= 0
            else before.rebalance_timeout_ms,
            topics=frozenset(hb.topics) if hb.topics is not None else before.topics,
            regex=(hb.regex or None) if hb.regex is not None else before.regex,
            assignor=(hb.assignor or None) if hb.assignor is not None else before.assignor,
            client_id=hb.client_id,
            client_host=hb.client_host,
            last_heartbeat=now,
            readable=readable,
        )
        if member.regex is not None:
            compile_regex(member.regex)
        changed = joined or (member.topics, member.regex, member.assignor) != (
            before.topics,
            before.regex,
            before.assignor,
        )
        self._put(member)
        self._refresh(topics, bump=changed, weights=weights)
        member = self._reconcile(self.members[member.member_id], hb.owned, now)
        self._put(member)
        full = hb.epoch == 0 or (hb.rebalance_timeout_ms >= 0 and hb.topics is not None and hb.owned is not None)
        return HeartbeatAnswer(
            member_id=member.member_id,
            epoch=member.epoch,
            assignment=member.assigned if full or member.assigned != before.assigned else None,
        )

    def _member_for(self, hb: Heartbeat, now: float, principal: str | None) -> tuple[ConsumerMember, bool]:
        """The member this heartbeat is from (new, rejoining with epoch 0, or known at a valid
        epoch), and whether it is new to the group."""
        if hb.epoch != 0:
            known = self._known(hb.member_id, hb.instance_id, principal)
            self._check_epoch(known, hb)
            return known, False
        if hb.instance_id is not None:
            existing = self.static_member(hb.instance_id)
            if existing is None:
                return self._new_member(hb, now, principal), True
            if not existing.left_for_now and existing.member_id != hb.member_id:
                raise UnreleasedInstanceIdError(
                    f"Instance id {hb.instance_id!r} is in use by member {existing.member_id!r}.",
                    group=self.group_id,
                )
            _check_principal(self.group_id, existing, principal)
            return replace(self._taken_over(existing, hb.member_id), epoch=0, previous_epoch=0), False
        existing = self.members.get(hb.member_id)
        if existing is None:
            return self._new_member(hb, now, principal), True
        _check_principal(self.group_id, existing, principal)
        # joining again: the client dropped every partition it had (it does so when fenced)
        dropped = replace(existing, epoch=0, previous_epoch=0, state=STABLE, assigned={}, revoking={}, assigned_at={})
        return dropped, False

    def _known(self, member_id: str, instance_id: str | None, principal: str | None) -> ConsumerMember:
        """The member a request other than a join is from: a static member by its instance id,
        which a newer process may have taken over; any other by its member id.

        Raises: UnknownMemberError, FencedInstanceIdError, AuthorizationError."""
        if instance_id is not None:
            m = self.static_member(instance_id)
            if m is not None and m.member_id != member_id:
                raise FencedInstanceIdError(
                    f"Instance id {instance_id!r} was taken over by member {m.member_id!r}.",
                    group=self.group_id,
                    member_id=member_id,
                )
            named = f"instance id {instance_id!r}"
        else:
            m = self.members.get(member_id)
            named = f"member id {member_id!r}"
        if m is None:
            raise UnknownMemberError(
                f"No member of group {self.group_id!r} has {named}; the consumer rejoins with epoch 0.",
                group=self.group_id,
                member_id=member_id,
            )
        _check_principal(self.group_id, m, principal)
        return m

    def _taken_over(self, static: ConsumerMember, member_id: str) -> ConsumerMember:
        """A static member's instance back under `member_id` (a new process of it): the old
        member's assignment is its own, and no rebalance follows."""
        if static.member_id == member_id:
            return static
        self._remove(static.member_id, bump=False)
        self.target[member_id] = self.target.pop(static.member_id, {})
        return replace(static, member_id=member_id)

    def _new_member(self, hb: Heartbeat, now: float, principal: str | None) -> ConsumerMember:
        self.check_room()
        return ConsumerMember(
            member_id=hb.member_id or str(uuid.uuid4()),
            instance_id=hb.instance_id,
            principal=principal or "",
            last_heartbeat=now,
        )

    def check_room(self) -> None:
        """Raises: GroupMaxSizeReachedError when a new member would be one too many."""
        if self.max_size is not None and len(self.members) >= self.max_size:
            raise GroupMaxSizeReachedError(self.group_id, self.max_size)

    def _member(self, member_id: str | None) -> ConsumerMember:
        """Raises: UnknownMemberError."""
        m = self.members.get(member_id or "")
        if m is None:
            raise UnknownMemberError(
                f"Member {member_id!r} is not in group {self.group_id!r}; the consumer rejoins.",
                group=self.group_id,
                member_id=member_id,
            )
        return m

    def check_fetch(self, member_id: str | None, epoch: int) -> None:
        """Kafka's rule for OffsetFetch v9+ in a consumer group: without a member id and epoch (the
        admin tools, a consumer outside group management) anyone; else the member at its current
        epoch (a classic member at its generation).

        Raises: UnknownMemberError, StaleMemberEpochError, FencedMemberError."""
        if member_id is None and epoch < 0:
            return
        m = self._member(member_id)
        if m.classic is not None:
            self._check_generation(m, epoch)
        elif epoch != m.epoch:
            raise StaleMemberEpochError(
                f"Member epoch {epoch} is not the member's current one ({m.epoch}): the consumer fetches its "
                "offsets again at its new epoch.",
                group=self.group_id,
                member_id=member_id,
            )

    def _check_epoch(self, m: ConsumerMember, hb: Heartbeat) -> None:
        if hb.epoch == m.epoch:
            return
        lost_answer = hb.epoch == m.previous_epoch and hb.owned is not None and _within(hb.owned, m.assigned)
        if hb.epoch > m.epoch or not lost_answer:
            raise FencedMemberEpochError(
                f"Member epoch {hb.epoch} is not the coordinator's ({m.epoch}): the consumer gives up its "
                "partitions and rejoins.",
                group=self.group_id,
                member_id=m.member_id,
            )

    def _leave(self, hb: Heartbeat, now: float, principal: str | None) -> HeartbeatAnswer:
        m = self._known(hb.member_id, hb.instance_id, principal)
        if hb.epoch == STATIC_LEAVE_EPOCH and m.instance_id is not None:
            # gone for now: its partitions wait for the instance to come back (or the session to end)
            self._put(replace(m, epoch=STATIC_LEAVE_EPOCH, last_heartbeat=now))
        else:
            self._remove(m.member_id, bump=True)
        return HeartbeatAnswer(member_id=hb.member_id, epoch=hb.epoch, assignment=None)

    # -- membership and the target ---------------------------------------------------------------
    def _put(self, m: ConsumerMember) -> None:
        old = self.members.get(m.member_id)
        if old is not None:
            for tp in old.holds():
                if self.owners.get(tp) == m.member_id:
                    del self.owners[tp]
        self.members[m.member_id] = m
        for tp in m.holds():
            self.owners[tp] = m.member_id

    def _remove(self, member_id: str, *, bump: bool) -> None:
        m = self.members.pop(member_id, None)
        if m is None:
            return
        for tp in m.holds():
            if self.owners.get(tp) == member_id:
                del self.owners[tp]
        if bump:
            self.target.pop(member_id, None)
            self.epoch += 1

    def target_stale(self, topics: Topics) -> bool:
        """Whether the next refresh against `topics` computes a target (the topics changed since
        the last one, or the group epoch moved past the target's): only then are lag weights read."""
        return topics.version != self._seen or self.epoch > self.assignment_epoch

    def _refresh(
        self,
        topics: Topics,
        *,
        bump: bool,
        weights: Callable[[], Mapping[tuple[str, int], int]] | None = None,
    ) -> None:
        """Bump the group epoch when asked or when the subscribed topics changed, and compute the
        target assignment for the group epoch when it is behind."""
        if not bump and not self.target_stale(topics):
            return  # nothing the target depends on moved
        self._wanted = wanted = {mid: self.member_topics(m, topics.counts) for mid, m in self.members.items()}
        self._seen = topics.version
        subscribed = {t: topics.counts[t] for ts in wanted.values() for t in ts}
        if bump or subscribed != self.subscribed:
            self.epoch += 1
            self.subscribed = subscribed
        if self.epoch <= self.assignment_epoch:
            return
        self.assignor = self._preferred_assignor()
        if not self.members:
            self.target = {}
        elif self.assignor == "range":
            self.target = {m: _partitions(a) for m, a in assign_range(wanted, subscribed).items()}
        else:
            previous = {m: {t: sorted(ps) for t, ps in a.items()} for m, a in self.target.items()}
            lag = weights() if self.assignor == "lag" and weights is not None else None
            chosen = assign_sticky(wanted, subscribed, previous, weights=lag)
            self.target = {m: _partitions(a) for m, a in chosen.items()}
        self.assignment_epoch = self.epoch

    def _preferred_assignor(self) -> str:
        votes = Counter(m.assignor for m in self.members.values() if m.assignor)
        return votes.most_common(1)[0][0] if votes else ASSIGNORS[0]

    def _reconcile(self, m: ConsumerMember, owned: Partitions | None, now: float) -> ConsumerMember:
        """Kafka's CurrentAssignmentBuilder: one step of `m` toward its target."""
        if m.left_for_now:
            return m
        if m.state == STABLE and m.epoch == self.assignment_epoch:
            return m
        if m.state == UNREVOKED and _owns_any(owned, m.revoking):
            return m
        target = self.target.get(m.member_id, {})
        assigned: dict[str, set[int]] = {}
        revoking: dict[str, set[int]] = {}
        adding: dict[str, set[int]] = {}
        unreleased = False
        for t in set(target) | set(m.assigned):
            want = target.get(t, frozenset())
            have = m.assigned.get(t, frozenset())
            keep = have & want
            if keep:
                assigned[t] = set(keep)
            if have - keep:
                revoking[t] = set(have - keep)
            free = {p for p in want - keep if self.owners.get((t, p), m.member_id) == m.member_id}
            unreleased |= len(free) < len(want - keep)
            if free:
                adding[t] = free
        if revoking and _owns_any(owned, _partitions(revoking)):
            deadline = m.revoke_deadline if m.state == UNREVOKED else now + m.rebalance_timeout_ms / 1000
            return replace(
                m,
                state=UNREVOKED,
                previous_epoch=m.epoch,
                assigned=_partitions(assigned),
                revoking=_partitions(revoking),
                revoke_deadline=deadline,
            )
        since = {tp: at for tp, at in m.assigned_at.items() if tp[1] in assigned.get(tp[0], ())}
        for t, ps in adding.items():
            assigned.setdefault(t, set()).update(ps)
            since.update(((t, p), self.assignment_epoch) for p in ps)
        return replace(
            m,
            state=UNRELEASED if unreleased else STABLE,
            epoch=self.assignment_epoch,
            previous_epoch=m.epoch,
            assigned=_partitions(assigned),
            revoking={},
            revoke_deadline=None,
            assigned_at=since,
        )

    # -- classic members (Kafka's online upgrade) ------------------------------------------------
    # -- persistence -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, object]:
        """What a coordinator taking the group over needs (JSON-able): epochs, target, members with
        their assignments and reconciliation state. Times are not in it: a restored member gets a
        full session from the takeover, as Kafka's coordinator gives it on loading a group."""
        return {
            "epoch": self.epoch,
            "assignment_epoch": self.assignment_epoch,
            "assignor": self.assignor,
            "subscribed": dict(sorted(self.subscribed.items())),
            "target": {mid: _listed(ps) for mid, ps in sorted(self.target.items())},
            "members": [_member_snapshot(m) for _, m in sorted(self.members.items())],
        }

    @classmethod
    def restore(
        cls,
        group_id: str,
        snapshot: Mapping[str, Any],
        *,
        now: float,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
    ) -> ConsumerGroup:
        """The group a `snapshot` describes, live from `now`."""
        g = cls(
            group_id=group_id,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            epoch=int(snapshot["epoch"]),
            assignment_epoch=int(snapshot["assignment_epoch"]),
            assignor=str(snapshot["assignor"]),
            subscribed={str(t): int(n) for t, n in snapshot["subscribed"].items()},
            target={str(mid): _partitions(ps) for mid, ps in snapshot["target"].items()},
        )
        for raw in snapshot["members"]:
            g._put(_member_restored(raw, now))
        return g

    @classmethod
    def from_classic(
        cls,
        group_id: str,
        generation: int,
        members: Iterable[MemberState],
        *,
        topics: Topics,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
    ) -> ConsumerGroup:
        """A classic group of Kafka consumers as a consumer group (Kafka's ConsumerGroup
        .fromClassicGroup): each member keeps its partitions, at an epoch equal to the generation,
        which is the group's epoch and its target's; its subscriptions resolved against `topics`,
        every topic's partition count now."""
        g = cls(
            group_id=group_id,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            epoch=generation,
            assignment_epoch=generation,
        )
        for m in members:
            assigned = _partitions(m.assignment)
            g.target[m.member_id] = assigned
            g._put(
                ConsumerMember(
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    principal=m.principal,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout_ms=m.rebalance_timeout_ms or m.session_timeout_ms,
                    topics=m.topics,
                    epoch=generation,
                    previous_epoch=generation,
                    assigned=assigned,
                    assigned_at={(t, p): generation for t, ps in assigned.items() for p in ps},
                    last_heartbeat=m.last_heartbeat,
                    classic=ClassicProtocol(session_timeout_ms=m.session_timeout_ms, protocols=m.protocols),
                )
            )
        g._wanted = {mid: g.member_topics(m, topics.counts) for mid, m in g.members.items()}
        g._seen = topics.version
        g.subscribed = {t: topics.counts[t] for ts in g._wanted.values() for t in ts}
        return g

    def classic_join(
        self,
        *,
        member_id: str,
        instance_id: str | None,
        topics: Iterable[str],
        owned: Partitions,
        classic: ClassicProtocol,
        rebalance_timeout_ms: int,
        now: float,
        known_topics: Topics,
        principal: str | None = None,
        client: tuple[str, str] = ("", ""),
        weights: Callable[[], Mapping[tuple[str, int], int]] | None = None,
        assignor: str | None = None,
    ) -> ConsumerMember:
        """A classic member's JoinGroup (Kafka's classicGroupJoinToConsumerGroup): the member is
        added or updated, and takes one reconciliation step; `owned`: what its subscription says
        it still owns (an eager member owns nothing when it rejoins). Its epoch is the generation
        the JoinGroup answers. `assignor`: the server-side assignor it votes for (an HTTP member
        that asked for the consumer protocol; Kafka's classic members vote for none).

        Raises: FencedInstanceIdError, AuthorizationError, GroupMaxSizeReachedError."""
        before: ConsumerMember | None = None
        if instance_id is not None and (existing := self.static_member(instance_id)) is not None:
            _check_principal(self.group_id, existing, principal)
            before = self._taken_over(existing, member_id)
        elif (existing := self.members.get(member_id)) is not None:
            _check_principal(self.group_id, existing, principal)
            before = existing
        if before is None:
            self.check_room()
        base = before or ConsumerMember(member_id=member_id, instance_id=instance_id, principal=principal or "")
        member = replace(
            base,
            topics=frozenset(topics),
            regex=None,
            assignor=assignor,
            rebalance_timeout_ms=rebalance_timeout_ms or classic.session_timeout_ms,
            client_id=client[0],
            client_host=client[1],
            last_heartbeat=now,
            classic=classic,
            epoch=0 if base.left_for_now else base.epoch,  # a static member back from leaving for now
        )
        changed = (
            before is None or member.topics != before.topics or before.regex is not None or assignor != before.assignor
        )
        self._put(member)
        self._refresh(known_topics, bump=changed, weights=weights)
        member = self._reconcile(self.members[member.member_id], owned, now)
        self._put(member)
        return member

    def classic_member(self, member_id: str, instance_id: str | None, principal: str | None) -> ConsumerMember:
        """The classic member a SyncGroup, Heartbeat, LeaveGroup or commit is from.

        Raises: UnknownMemberError, FencedInstanceIdError, AuthorizationError,
        InconsistentGroupProtocolError (a consumer-protocol member)."""
        m = self._known(member_id, instance_id, principal)
        if m.classic is None:
            raise InconsistentGroupProtocolError(
                f"Member {member_id!r} of group {self.group_id!r} uses the consumer protocol; it heartbeats "
                "with ConsumerGroupHeartbeat.",
                group=self.group_id,
            )
        return m

    def classic_sync(
        self, member_id: str, instance_id: str | None, generation: int, principal: str | None
    ) -> Partitions:
        """A classic member's SyncGroup: its partitions (Kafka's classicGroupSyncToConsumerGroup).

        Raises: as `classic_member`, FencedMemberError (another generation),
        RebalanceInProgressError (the group epoch moved past the member's: it joins again)."""
        m = self.classic_member(member_id, instance_id, principal)
        self._check_generation(m, generation)
        if self.epoch > m.epoch and m.state != UNREVOKED:
            raise RebalanceInProgressError(
                f"Group {self.group_id!r} is rebalancing (epoch {self.epoch}); the member joins again.",
                group=self.group_id,
            )
        return m.assigned

    def classic_heartbeat(
        self,
        member_id: str,
        instance_id: str | None,
        generation: int,
        now: float,
        principal: str | None,
        *,
        topics: Topics,
        weights: Callable[[], Mapping[tuple[str, int], int]] | None = None,
    ) -> bool:
        """A classic member's Heartbeat; whether it must join again (Kafka's
        classicGroupHeartbeatToConsumerGroup: the group epoch moved past its own, it has partitions
        to give up, or partitions it waited for are free). `topics`: every topic's partition count
        now (a subscribed topic created or grown moves the group epoch, as Kafka's coordinator does
        on new metadata, also where every member speaks the classic protocol).

        Raises: as `classic_member`, FencedMemberError."""
        m = self.classic_member(member_id, instance_id, principal)
        self._check_generation(m, generation)
        self.members[m.member_id] = replace(m, last_heartbeat=now)
        self._refresh(topics, bump=False, weights=weights)
        return m.epoch < self.epoch or m.state == UNREVOKED or (m.state == UNRELEASED and not self._waiting_on(m))

    def classic_leave(self, member_id: str, instance_id: str | None, principal: str | None) -> str:
        """A classic member's LeaveGroup; the member id that left.

        Raises: as `classic_member`."""
        m = self.classic_member(member_id, instance_id, principal)
        self._remove(m.member_id, bump=True)
        return m.member_id

    def _check_generation(self, m: ConsumerMember, generation: int) -> None:
        if generation != m.epoch:
            raise FencedMemberError(
                f"Generation {generation} is not member {m.member_id!r}'s ({m.epoch}); the consumer joins again.",
                group=self.group_id,
                member_id=m.member_id,
            )

    def _waiting_on(self, m: ConsumerMember) -> bool:
        """Whether a partition of the member's target is still held by another member."""
        target = self.target.get(m.member_id, {})
        return any(
            p not in m.assigned.get(t, ()) and self.owners.get((t, p), m.member_id) != m.member_id
            for t, ps in target.items()
            for p in ps
        )

    @property
    def classic_only(self) -> bool:
        """Every member speaks the classic protocol (the group could be a classic one again)."""
        return bool(self.members) and all(m.classic is not None for m in self.members.values())

    # -- time ------------------------------------------------------------------------------------
    def why_expired(self, m: ConsumerMember, now: float) -> str | None:
        """Why `m` is out of time at `now` (its session ended, or it did not revoke within its
        rebalance timeout), in words for the log; None while it is not."""
        session_ms = m.classic.session_timeout_ms if m.classic is not None else self.session_timeout_ms
        silent = now - m.last_heartbeat
        if silent > session_ms / 1000:
            return f"no heartbeat for {silent:.1f} s (session timeout {session_ms} ms)"
        if m.state == UNREVOKED and m.revoke_deadline is not None and now > m.revoke_deadline:
            return f"its partitions not revoked within its rebalance timeout ({m.rebalance_timeout_ms} ms)"
        return None

    def expire(self, now: float, topics: Topics) -> dict[str, str]:
        """Remove members whose session ended (a classic member's own session timeout) or that did
        not revoke within their rebalance timeout; the ids removed, each with why (`why_expired`;
        the group epoch moved if any)."""
        gone = {m.member_id: why for m in self.members.values() if (why := self.why_expired(m, now)) is not None}
        for mid in gone:
            self._remove(mid, bump=True)
        if gone:
            self._refresh(topics, bump=False)
        return gone


def _validate(hb: Heartbeat) -> None:
    """Kafka's checks of a heartbeat's fields. Raises: InvalidGroupRequestError."""
    if hb.epoch == 0:
        if hb.rebalance_timeout_ms < 0:
            raise InvalidGroupRequestError("A member joining (epoch 0) sends its rebalance timeout.")
        if hb.topics is None and hb.regex is None:
            raise InvalidGroupRequestError("A member joining (epoch 0) sends its subscription.")
        if hb.owned:
            raise InvalidGroupRequestError("A member joining (epoch 0) owns no partitions.")
    elif hb.epoch < STATIC_LEAVE_EPOCH:
        raise InvalidGroupRequestError(f"Member epoch {hb.epoch} is not one a member can have.")
    elif hb.epoch > 0 and not hb.member_id:
        raise InvalidGroupRequestError("A member in the group sends its member id.")
    if hb.epoch == STATIC_LEAVE_EPOCH and hb.instance_id is None:
        raise InvalidGroupRequestError("Only a static member (group.instance.id) leaves with epoch -2.")
    if hb.assignor and hb.assignor not in ASSIGNORS:
        raise UnsupportedAssignorError(
            f"Assignor {hb.assignor!r} is not served; group.remote.assignor is one of {', '.join(ASSIGNORS)}."
        )


def validate_consumer_join(assignor: str, session_timeout_ms: int, topics: Iterable[str]) -> list[str]:
    """validate_join for an HTTP member that asks for the consumer protocol: it names a server-side
    assignor. Raises: UnknownAssignorError, InvalidGroupError."""
    if assignor not in ASSIGNORS:
        raise UnknownAssignorError(
            f"Assignor {assignor!r} is not a server-side one; with the consumer protocol use {', '.join(ASSIGNORS)}.",
            assignor=assignor,
        )
    return validate_join(ASSIGNORS[1], session_timeout_ms, topics)  # (range: a consumer's subscription rules)


def _within(owned: Partitions, assigned: Partitions) -> bool:
    return all(ps <= assigned.get(t, frozenset()) for t, ps in owned.items())


def _owns_any(owned: Partitions | None, partitions: Partitions) -> bool:
    """Whether the member still owns any of `partitions` (not having said what it owns: yes)."""
    if owned is None:
        return True
    return any(owned.get(t, frozenset()) & ps for t, ps in partitions.items())


def _check_principal(group_id: str, m: ConsumerMember, principal: str | None) -> None:
    if principal is not None and m.principal and m.principal != principal:
        raise AuthorizationError(
            f"Member {m.member_id!r} of group {group_id!r} was joined with another API key; use the key that "
            "joined it, or join as a new member.",
            group=group_id,
            member_id=m.member_id,
        )
