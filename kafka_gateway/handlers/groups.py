"""Groups over Kafka's classic protocol, on the gateway's one coordinator (broker.coordinator),
so a consumer group may have members on both protocols. A group is served one of two ways, chosen
when its first member joins:

- **The coordinator assigns** (a "consumer" group whose first member offers an eager assignor the
  coordinator runs: Kafka's `range`, `roundrobin`, `sticky`; the way HTTP members are served, so
  such a group may mix HTTP and Kafka members). Every Kafka member is a follower: JoinGroup names
  no member as leader, and SyncGroup hands each member the coordinator's assignment as Kafka's
  ConsumerProtocolAssignment. A Kafka member that also offers `cooperative-sticky` may join such a
  group, served as sticky.
- **The leader assigns**, as Kafka itself runs every group: any other protocol type (Kafka
  Connect's "connect" workers, Schema Registry's leader election) or a consumer group whose members
  offer only assignors the coordinator does not run (`cooperative-sticky` alone, Kafka Streams'
  `stream`, custom ones). JoinGroup picks the protocol by Kafka's vote and a leader, and hands the
  leader every member's metadata; the leader's SyncGroup hands each member its opaque assignment.
  Consumer assignments are read for the partitions they name, so commits are still checked
  against the owner (invariant 5). HTTP members cannot join such a group.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from broker import groups
from delta_log.core.acl import NO_OPERATIONS, kafka_operations
from delta_log.core.consumer_group import Heartbeat
from delta_log.core.group_rules import leader_assignor, leader_assigns
from delta_log.core.group_state import GroupState
from delta_log.errors import (
    AuthorizationError,
    GroupSubscribedToTopicError,
    MemberIdRequiredError,
    TopiclakeError,
)
from kafka_gateway import messages
from kafka_gateway.apis import api
from kafka_gateway.errors import code_of, message_of
from kafka_gateway.messages import millis
from kafka_gateway.session import Session

#: Kafka's eager protocol names -> the coordinator's assignors
EAGER = {"range": "range", "roundrobin": "roundrobin", "sticky": "sticky"}
#: and what a member may also join a coordinator-assigned group with
JOINABLE = EAGER | {"cooperative-sticky": "sticky"}
#: JoinGroup's leader where the coordinator assigns: nobody, so every member syncs as a follower
NO_LEADER = "topiclake-coordinator"


def _choose(
    existing: GroupState | None, protocol_type: str, offered: list[tuple[str, bytes]]
) -> tuple[str, str] | None:
    """(the protocol name this member is served, the coordinator's assignor or the leader-assigned
    marker) for a JoinGroup; None: the member does not fit the group."""
    if existing is not None and existing.members:
        if existing.leader_assigns:
            return offered[0][0], leader_assignor(protocol_type)  # GroupState checks the type and the vote
        if protocol_type != "consumer":
            return None
        return next(((n, JOINABLE[n]) for n, _ in offered if JOINABLE.get(n) == existing.assignor), None)
    if protocol_type == "consumer":
        eager = next(((n, EAGER[n]) for n, _ in offered if n in EAGER), None)
        if eager is not None:
            return eager
    return offered[0][0], leader_assignor(protocol_type)


@api(11, "JoinGroup", 0, 9)
async def join_group(conn: Session, request: Any, version: int) -> Any:
    group = request.group_id
    fail = {"generation_id": -1, "protocol_name": None, "leader": "", "member_id": request.member_id, "members": []}
    coordinator = conn.services.coordinator
    offered = [(str(p.name), bytes(p.metadata)) for p in request.protocols]
    protocol_type = str(request.protocol_type or "")
    chosen = (
        _choose(groups.classic_group(coordinator, group), protocol_type, offered) if offered and protocol_type else None
    )
    if chosen is None:
        return fail | {"error_code": ErrorCode.inconsistent_group_protocol}
    name, assignor = chosen
    leader_mode = leader_assigns(assignor)
    topics: list[str] = []
    owned: dict[str, list[int]] = {}
    if protocol_type == "consumer":  # every consumer assignor's metadata is a ConsumerProtocolSubscription
        try:
            topics, owned = messages.parse_subscription(dict(offered)[name])
        except messages.MalformedFrameError:
            return fail | {"error_code": ErrorCode.inconsistent_group_protocol}
    assert conn.principal is not None
    principal = conn.principal
    session_ms = int(millis(request.session_timeout))
    rebalance = getattr(request, "rebalance_timeout", None)  # v1+: the consumer's max.poll.interval.ms
    rebalance_ms = int(millis(rebalance)) if rebalance is not None else 0

    async def answer() -> dict[str, Any]:
        try:
            result = await groups.join(
                coordinator,
                principal,
                group,
                topics=topics,
                member_id=request.member_id or None,
                instance_id=getattr(request, "group_instance_id", None),
                session_timeout_ms=session_ms,
                assignor=assignor,
                protocols=offered if leader_mode else (),
                missing_topics_ok=True,  # a consumer may subscribe before the topic exists
                client=(conn.client_id or "", f"/{conn.peer}"),
                rebalance_timeout_ms=rebalance_ms,
                require_member_id=version >= 4,  # KIP-394
                protocol_type=protocol_type,
                embedded=offered if protocol_type == "consumer" else (),
                owned=owned,
            )
        except MemberIdRequiredError as exc:
            return fail | {"error_code": ErrorCode.member_id_required, "member_id": exc.details["member_id"]}
        except TopiclakeError as exc:
            return fail | {"error_code": code_of(exc)}
        answer: dict[str, Any] = {
            "throttle_time": 0,
            "error_code": 0,
            "generation_id": result.generation,
            "protocol_type": protocol_type,
            "protocol_name": name,
            "leader": NO_LEADER,
            "skip_assignment": False,
            "member_id": result.member_id,
            "members": [],
        }
        if leader_mode:
            answer |= {
                "protocol_name": result.protocol,
                "leader": result.leader or "",
                "members": [
                    {"member_id": mid, "group_instance_id": instance, "metadata": metadata}
                    for mid, instance, metadata in result.member_metadata
                ],
            }
            if result.replaced is not None and result.leader == result.member_id:
                # a static leader back in a Stable group keeps the assignment (Kafka's KIP-345
                # handling): from v9 it is told to skip assigning; before, it is answered as a
                # follower (the leader it replaced), so it syncs for its own assignment only
                if version >= 9:
                    answer["skip_assignment"] = True
                else:
                    answer |= {"leader": result.replaced, "members": []}
        return answer

    return answer()


@api(14, "SyncGroup", 0, 5)
async def sync_group(conn: Session, request: Any, version: int) -> Any:
    group = request.group_id
    base = {"throttle_time": 0, "protocol_type": "consumer", "protocol_name": None, "assignment": b""}
    assert conn.principal is not None
    try:  # a classic member of a consumer-protocol group (Kafka's online upgrade): its partitions
        assigned = await groups.classic_sync(
            conn.services.coordinator,
            conn.principal,
            group,
            request.member_id,
            request.generation_id,
            getattr(request, "group_instance_id", None),
        )
    except TopiclakeError as exc:
        return base | {"error_code": code_of(exc)}
    if assigned is not None:
        return base | {
            "error_code": 0,
            "protocol_name": getattr(request, "protocol_name", None),
            "assignment": messages.encode_assignment(assigned),
        }
    g = groups.classic_group(conn.services.coordinator, group)
    if g is not None and g.leader_assigns:
        return _sync_from_leader(conn, request, g)
    try:
        assigned = groups.assignment(
            conn.services.coordinator, conn.principal, group, request.member_id, request.generation_id
        )
    except TopiclakeError as exc:
        return base | {"error_code": code_of(exc)}
    return base | {
        "error_code": 0,
        "protocol_name": getattr(request, "protocol_name", None),
        "assignment": messages.encode_assignment(assigned),
    }


def _sync_from_leader(conn: Session, request: Any, g: GroupState) -> Any:
    """SyncGroup where the leader assigns: the leader's carries everyone's assignment; each
    member's answer waits for it."""
    base = {"throttle_time": 0, "protocol_type": g.protocol_type, "protocol_name": g.protocol, "assignment": b""}
    wrong_type = getattr(request, "protocol_type", None) not in (None, g.protocol_type)
    wrong_name = getattr(request, "protocol_name", None) not in (None, g.protocol)
    if wrong_type or wrong_name:
        return base | {"error_code": ErrorCode.inconsistent_group_protocol}
    assignments: dict[str, tuple[bytes, dict[str, list[int]]]] = {}
    for a in request.assignments:
        data = bytes(a.assignment)
        try:
            named = messages.decode_assignment(data) if g.protocol_type == "consumer" else {}
        except messages.MalformedFrameError:
            return base | {"error_code": ErrorCode.inconsistent_group_protocol}
        assignments[str(a.member_id)] = (data, named)
    assert conn.principal is not None
    principal = conn.principal

    async def answer() -> dict[str, Any]:
        try:
            data = await groups.sync(
                conn.services.coordinator,
                principal,
                g.group_id,
                request.member_id,
                request.generation_id,
                assignments,
                instance_id=getattr(request, "group_instance_id", None),
            )
        except TopiclakeError as exc:
            return base | {"error_code": code_of(exc)}
        return base | {"error_code": 0, "protocol_name": g.protocol, "assignment": data}

    return answer()


@api(12, "Heartbeat", 0, 4)
async def heartbeat(conn: Session, request: Any, version: int) -> Any:
    assert conn.principal is not None
    try:
        r = await groups.heartbeat(
            conn.services.coordinator,
            conn.principal,
            request.group_id,
            request.member_id,
            request.generation_id,
            instance_id=getattr(request, "group_instance_id", None),
        )
    except TopiclakeError as exc:
        return {"throttle_time": 0, "error_code": code_of(exc)}
    return {"throttle_time": 0, "error_code": ErrorCode.rebalance_in_progress if r.rebalance else 0}


@api(13, "LeaveGroup", 0, 5)
async def leave_group(conn: Session, request: Any, version: int) -> Any:
    group = request.group_id
    assert conn.principal is not None
    ids = [(request.member_id, None)] if version < 3 else [(m.member_id, m.group_instance_id) for m in request.members]
    members = []
    for member_id, instance_id in ids:
        try:
            await groups.leave(conn.services.coordinator, conn.principal, group, member_id, instance_id=instance_id)
            code = 0
        except AuthorizationError:  # the whole request is refused, as on Kafka
            return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "members": []}
        except TopiclakeError as exc:
            code = code_of(exc)
        members.append({"member_id": member_id, "group_instance_id": instance_id, "error_code": code})
    top = members[0]["error_code"] if version < 3 and members else 0
    return {"throttle_time": 0, "error_code": top, "members": members}


@api(8, "OffsetCommit", 2, 9)
async def offset_commit(conn: Session, request: Any, version: int) -> Any:
    assert conn.principal is not None
    principal = conn.principal
    group = request.group_id
    generation = getattr(request, "generation_id_or_member_epoch", getattr(request, "generation_id", -1))
    offsets = [
        groups.Offset(
            topic=t.name, partition=p.partition_index, offset=p.committed_offset, metadata=p.committed_metadata or ""
        )
        for t in request.topics
        for p in t.partitions
    ]

    async def answer() -> dict[str, Any]:
        denied: set[str] = set()
        code = ErrorCode.none
        try:
            denied = await groups.commit(
                conn.services.coordinator,
                principal,
                group,
                offsets,
                member_id=request.member_id or None,
                generation=generation if generation >= 0 else None,
                skip_denied=True,
            )
        except TopiclakeError as exc:
            code = code_of(exc)
        topics: dict[str, list[dict[str, Any]]] = {}
        for o in offsets:
            each = ErrorCode.topic_authorization_failed if o.topic in denied else code
            topics.setdefault(o.topic, []).append({"partition_index": o.partition, "error_code": each})
        return {"throttle_time": 0, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

    return answer()


async def _fetched(
    conn: Session, group: str, wanted: Any, member_id: str | None = None, epoch: int = -1, stable: bool = False
) -> dict[str, Any]:
    """One group's committed offsets, of the requested topics (none named: every topic it
    committed that this key may describe); `member_id`, `epoch`: the member asking (v9+);
    `stable` (v7+'s require_stable): a partition whose offset an open transaction commits is
    answered UNSTABLE_OFFSET_COMMIT (the consumer retries) instead of its older offset."""
    assert conn.principal is not None
    try:
        committed = await groups.committed(
            conn.services.coordinator, conn.principal, group, member_id=member_id, epoch=epoch, missing_ok=True
        )
    except TopiclakeError as exc:
        return {"group_id": group, "topics": [], "error_code": code_of(exc)}
    if not wanted:  # null, or (the admin client's --describe) empty: every committed topic
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(committed):
            by_topic.setdefault(t, []).append(p)
        pairs = list(by_topic.items())
    else:
        pairs = [(t.name, list(t.partition_indexes)) for t in wanted]
    topics = []
    unstable = await conn.services.transactions.unstable(group) if stable else set()
    for name, partitions in pairs:
        denied = not conn.principal.allows("describe", name)
        parts = []
        for p in partitions:
            c = committed.get((name, p))
            code = ErrorCode.unstable_offset_commit if (name, p) in unstable else ErrorCode.none
            parts.append(
                {
                    "partition_index": p,
                    "committed_offset": c.offset if c is not None else -1,
                    "committed_leader_epoch": -1,
                    "metadata": c.metadata if c is not None else "",
                    "error_code": ErrorCode.topic_authorization_failed if denied else code,
                }
            )
        topics.append({"name": name, "partitions": parts})
    return {"group_id": group, "topics": topics, "error_code": ErrorCode.none}


@api(9, "OffsetFetch", 1, 9)
async def offset_fetch(conn: Session, request: Any, version: int) -> Any:
    if version >= 8:
        stable = bool(request.require_stable)
        fetched = [
            await _fetched(
                conn, g.group_id, g.topics, getattr(g, "member_id", None), getattr(g, "member_epoch", -1), stable
            )
            for g in request.groups
        ]
        return {"throttle_time": 0, "groups": fetched}
    one = await _fetched(conn, request.group_id, request.topics, stable=bool(getattr(request, "require_stable", False)))
    return {"throttle_time": 0, "topics": one["topics"], "error_code": one["error_code"]}


@api(16, "ListGroups", 0, 5)
async def list_groups(conn: Session, request: Any, version: int) -> Any:
    assert conn.principal is not None
    states = set(getattr(request, "states_filter", ()) or ())
    types = {str(t).lower() for t in getattr(request, "types_filter", ()) or ()}
    found, _ = await groups.summaries(conn.services.coordinator, conn.principal)
    return {
        "throttle_time": 0,
        "error_code": 0,
        "groups": [
            {"group_id": s.group, "protocol_type": s.protocol_type, "group_state": s.state, "group_type": s.group_type}
            for s in found
            if (not states or s.state in states) and (not types or s.group_type in types)
        ],
    }


async def _described(conn: Session, group: str) -> dict[str, Any]:
    assert conn.principal is not None
    base: dict[str, Any] = {
        "group_id": group,
        "group_state": "Dead",
        "protocol_type": "",
        "protocol_data": "",
        "members": [],
    }
    try:
        g = await groups.describe_classic(conn.services.coordinator, conn.principal, group)
    except TopiclakeError as exc:
        return base | {"error_code": code_of(exc), "error_message": message_of(exc)}
    if g is None:
        return base | {"error_code": 0}
    members = []
    for m in groups.visible_members(conn.principal, g):
        metadata, assignment = m.leader_metadata, m.leader_assignment
        members.append(
            {
                "member_id": m.member_id,
                "group_instance_id": m.instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": messages.encode_subscription(m.topics) if metadata is None else metadata,
                "member_assignment": messages.encode_assignment(m.assignment) if assignment is None else assignment,
            }
        )
    return base | {
        "error_code": 0,
        "group_state": g.state,
        "protocol_type": g.protocol_type,
        "protocol_data": (g.protocol if g.leader_assigns else g.assignor) if g.members else "",
        "members": members,
    }


def _with_operations(conn: Session, described: dict[str, Any], asked: bool) -> dict[str, Any]:
    """A described group with what the key may do with it, when asked and not refused (Kafka's)."""
    assert conn.principal is not None
    granted = asked and described["error_code"] == 0
    return described | {
        "authorized_operations": kafka_operations(conn.principal, "group", described["group_id"])
        if granted
        else NO_OPERATIONS
    }


@api(15, "DescribeGroups", 0, 5)
async def describe_groups(conn: Session, request: Any, version: int) -> Any:
    asked = bool(getattr(request, "include_authorized_operations", False))
    return {
        "throttle_time": 0,
        "groups": [_with_operations(conn, await _described(conn, g), asked) for g in request.groups],
    }


@api(42, "DeleteGroups", 0, 2)
async def delete_groups(conn: Session, request: Any, version: int) -> Any:
    assert conn.principal is not None
    results = []
    for group in request.groups_names:
        try:
            await groups.delete_group(conn.services.coordinator, conn.principal, group)
            code = ErrorCode.none
        except TopiclakeError as exc:
            code = code_of(exc)
        results.append({"group_id": group, "error_code": code})
    return {"throttle_time": 0, "results": results}


@api(47, "OffsetDelete", 0, 0)
async def offset_delete(conn: Session, request: Any, version: int) -> Any:
    assert conn.principal is not None
    wanted = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    top, each, denied = ErrorCode.none, ErrorCode.none, set()
    try:
        denied = await groups.delete_offsets(conn.services.coordinator, conn.principal, request.group_id, wanted)
    except GroupSubscribedToTopicError:
        each = ErrorCode.group_subscribed_to_topic  # Kafka reports it per partition
    except TopiclakeError as exc:
        top = code_of(exc)
    topics: dict[str, list[dict[str, Any]]] = {}
    for t, p in wanted:
        code = ErrorCode.topic_authorization_failed if t in denied else each
        topics.setdefault(t, []).append({"partition_index": p, "error_code": code})
    return {
        "throttle_time": 0,
        "error_code": top,
        # a group-level error answers for the whole request: no topics, as on Kafka
        "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()] if top == 0 else [],
    }


# -- the consumer protocol (KIP-848) ----------------------------------------------------------------
#: ConsumerGroupDescribe's member types (v1): classic-protocol and consumer-protocol members
CLASSIC_MEMBER, CONSUMER_MEMBER = 0, 1


def _assignment(
    ids: Mapping[str, uuid.UUID], partitions: Mapping[str, frozenset[int]], *, names: bool = False
) -> dict[str, Any]:
    return {
        "topic_partitions": [
            {"topic_id": ids[t], "partitions": sorted(ps)} | ({"topic_name": t} if names else {})
            for t, ps in sorted(partitions.items())
            if t in ids
        ]
    }


@api(68, "ConsumerGroupHeartbeat", 0, 1)
async def consumer_group_heartbeat(conn: Session, request: Any, version: int) -> Any:
    assert conn.principal is not None
    principal = conn.principal
    coordinator = conn.services.coordinator
    rebalance = millis(request.rebalance_timeout)

    async def answer() -> dict[str, Any]:
        ids = await groups.topic_ids(coordinator)  # the owned partitions are named by topic id
        by_id = {topic_id: name for name, topic_id in ids.items()}
        owned = None
        if request.topic_partitions is not None:
            owned = {
                by_id[t.topic_id]: frozenset(int(p) for p in t.partitions)
                for t in request.topic_partitions
                if t.topic_id in by_id  # a topic deleted meanwhile: nothing to own
            }
        hb = Heartbeat(
            member_id=request.member_id,
            epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=int(rebalance) if rebalance >= 0 else -1,
            topics=None if request.subscribed_topic_names is None else tuple(request.subscribed_topic_names),
            regex=getattr(request, "subscribed_topic_regex", None),
            assignor=request.server_assignor,
            owned=owned,
            client_id=conn.client_id or "",
            client_host=f"/{conn.peer}",
        )
        try:
            result, group = await groups.consumer_heartbeat(coordinator, principal, request.group_id, hb)
        except TopiclakeError as exc:
            return {
                "throttle_time": 0,
                "error_code": code_of(exc),
                "error_message": message_of(exc),
                "member_id": None,
                "member_epoch": -1,
                "heartbeat_interval": 0,
                "assignment": None,
            }
        return {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": None,
            "member_id": result.member_id,
            "member_epoch": result.epoch,
            "heartbeat_interval": group.heartbeat_interval_ms,
            "assignment": None  # (by the ids as the heartbeat read them: a topic created meanwhile is in)
            if result.assignment is None
            else _assignment(groups.known_topic_ids(coordinator), result.assignment),
        }

    return answer()


@api(69, "ConsumerGroupDescribe", 0, 1)
async def consumer_group_describe(conn: Session, request: Any, version: int) -> Any:
    assert conn.principal is not None
    coordinator = conn.services.coordinator
    ids = await groups.topic_ids(coordinator)
    found = await groups.consumer_groups(coordinator, conn.principal, list(request.group_ids))
    described = []
    for name, g in zip(request.group_ids, found, strict=True):
        if isinstance(g, TopiclakeError):
            described.append(
                {
                    "group_id": name,
                    "error_code": code_of(g),
                    "error_message": message_of(g),
                    "group_state": "Dead",
                    "group_epoch": -1,
                    "assignment_epoch": -1,
                    "assignor_name": "",
                    "members": [],
                }
            )
            continue
        members = [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "rack_id": m.rack_id,
                "member_epoch": m.epoch,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topic_names": sorted(m.topics),
                "subscribed_topic_regex": m.regex,
                "assignment": _assignment(ids, m.assigned, names=True),
                "target_assignment": _assignment(ids, g.target.get(m.member_id, {}), names=True),
                "member_type": CONSUMER_MEMBER if m.classic is None else CLASSIC_MEMBER,
            }
            for m in g.members.values()
        ]
        described.append(
            {
                "group_id": name,
                "error_code": 0,
                "error_message": None,
                "group_state": g.state,
                "group_epoch": g.epoch,
                "assignment_epoch": g.assignment_epoch,
                "assignor_name": g.assignor,
                "members": members,
            }
        )
    asked = request.include_authorized_operations
    return {"throttle_time": 0, "groups": [_with_operations(conn, d, asked) for d in described]}
