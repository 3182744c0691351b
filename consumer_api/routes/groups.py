"""Consumer groups over HTTP: join, heartbeat, leave, commit and read offsets, describe, reset.
The rules (Kafka's ACLs, generations, fencing) are broker.groups' and the coordinator's; the routes
decode, call and encode.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from broker import groups
from consumer_api.schemas import (
    CommitRequest,
    CommittedOffsets,
    GroupInfo,
    GroupList,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinRequest,
    JoinResponse,
    LagAt,
    LagHistory,
    LagInfo,
    MemberInfo,
    PartitionLagAt,
    PartitionOffset,
    ResetRequest,
)
from ingest_gateway.kit.dependencies import CoordinatorDep, PrincipalDep, RegistryDep
from ingest_gateway.kit.forwarding import FORWARDED_BY, FORWARDED_FOR
from ingest_gateway.kit.params import (
    MAX_JSON_INT,
    AfterQuery,
    GroupPath,
    LimitQuery,
    MemberPath,
    SearchQuery,
    check_json_int,
)

router = APIRouter(prefix="/groups", tags=["consumer groups"])


@router.post("/{group}/members", response_model=JoinResponse)
async def join(
    group: GroupPath, body: JoinRequest, request: Request, principal: PrincipalDep, coordinator: CoordinatorDep
) -> JoinResponse:
    """Join (or rejoin) a group; returns when the group is stable, with this member's partitions (in a
    consumer-protocol group at once, with the partitions that are free for it)."""
    client_id = body.client_id if body.client_id is not None else request.headers.get("user-agent", "")[:255]
    r = await groups.join(
        coordinator,
        principal,
        group,
        topics=body.topics,
        member_id=body.member_id,
        instance_id=body.instance_id,
        session_timeout_ms=body.session_timeout_ms,
        assignor=body.assignor,
        client=(client_id, _client_host(request)),
        group_protocol=body.group_protocol,
    )
    return JoinResponse(
        group=group, member_id=r.member_id, generation=r.generation, assignment=r.assignment, members=r.members
    )


def _client_host(request: Request) -> str:
    """Where the member's client connects from, as Kafka shows it (`/10.0.0.7`): for a join another
    gateway forwarded, the address the client reached that gateway from."""
    if FORWARDED_BY in request.headers and (first := request.headers.get(FORWARDED_FOR)):
        return f"/{first[:64]}"
    return f"/{request.client.host}" if request.client else ""


@router.post("/{group}/members/{member_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(
    group: GroupPath,
    member_id: MemberPath,
    body: HeartbeatRequest,
    principal: PrincipalDep,
    coordinator: CoordinatorDep,
) -> HeartbeatResponse:
    """Keep the session alive; `rebalance: true` means commit what you processed and join again."""
    r = await groups.heartbeat(coordinator, principal, group, member_id, body.generation)
    return HeartbeatResponse(generation=r.generation, rebalance=r.rebalance, assignment=r.assignment)


@router.delete("/{group}/members/{member_id}", status_code=204)
async def leave(
    group: GroupPath, member_id: MemberPath, principal: PrincipalDep, coordinator: CoordinatorDep
) -> Response:
    """Leave the group (its partitions go to the others)."""
    await groups.leave(coordinator, principal, group, member_id)
    return Response(status_code=204)


@router.post("/{group}/offsets", response_model=CommittedOffsets)
async def commit(
    group: GroupPath, body: CommitRequest, principal: PrincipalDep, coordinator: CoordinatorDep
) -> CommittedOffsets:
    """Commit offsets (durable before the answer). Refused with 409 FENCED_MEMBER unless the
    member owns every partition in the group's current generation."""
    for o in body.offsets:
        check_json_int("offset", o.offset)
    await groups.commit(
        coordinator,
        principal,
        group,
        [
            groups.Offset(topic=o.topic, partition=o.partition, offset=o.offset, metadata=o.metadata)
            for o in body.offsets
        ],
        member_id=body.member_id,
        generation=body.generation,
    )
    return CommittedOffsets(group=group, offsets=body.offsets)


@router.get("/{group}/offsets", response_model=CommittedOffsets)
async def committed(group: GroupPath, principal: PrincipalDep, coordinator: CoordinatorDep) -> CommittedOffsets:
    """The group's committed offsets, of the topics this key may describe."""
    offsets = await groups.committed(coordinator, principal, group)
    return CommittedOffsets(
        group=group,
        offsets=[
            PartitionOffset(topic=t, partition=p, offset=c.offset, metadata=c.metadata)
            for (t, p), c in sorted(offsets.items())
        ],
    )


@router.get("", response_model=GroupList, response_model_exclude_none=True)
async def list_groups(
    principal: PrincipalDep,
    coordinator: CoordinatorDep,
    search: SearchQuery = "",
    after: AfterQuery = "",
    limit: LimitQuery = None,
) -> GroupList:
    """Every group with members or committed offsets that this key may describe, by name; a page
    of them with `limit` (then `next` names the last one: pass it as `after` for the next page)."""
    found, last = await groups.summaries(coordinator, principal, search=search, after=after, limit=limit)
    out: list[dict[str, str | int]] = [
        {"group": s.group, "state": s.state, "members": s.members, "generation": s.generation} for s in found
    ]
    return GroupList(groups=out, next=last)


@router.get("/{group}/lag-history", response_model=LagHistory)
async def lag_history(
    group: GroupPath,
    principal: PrincipalDep,
    coordinator: CoordinatorDep,
    registry: RegistryDep,
    since_ms: Annotated[
        int | None,
        Query(ge=0, le=MAX_JSON_INT, description="Window start, epoch ms (default: an hour before its end)."),
    ] = None,
    until_ms: Annotated[
        int | None, Query(ge=1, le=MAX_JSON_INT, description="Window end, epoch ms (default: now).")
    ] = None,
    points: Annotated[int, Query(ge=1, le=groups.MAX_LAG_POINTS, description="Moments, evenly over the window.")] = 30,
) -> LagHistory:
    """The group's lag over time, from Delta time travel: at each moment, its committed offsets as
    the offsets table held them against each topic's high watermark then (of the topics this key
    may describe); partitions the group had not committed yet are not counted. A moment before
    the table's retained history, or before the group's first commit, has `lag` null."""
    await groups.describe(coordinator, principal, group)  # the group exists, and the key may describe it
    # a window given only by a start after now ends just after that start (its points are now's)
    until = until_ms if until_ms is not None else max(int(time.time() * 1000), (since_ms or 0) + 1)
    since = since_ms if since_ms is not None else max(until - 3_600_000, 0)
    found = await run_in_threadpool(
        groups.lag_history, registry, principal, group, since_ms=since, until_ms=until, points=points
    )
    return LagHistory(
        group=group,
        points=[
            LagAt(at_ms=p.at_ms, lag=p.lag, partitions=[PartitionLagAt(**asdict(r)) for r in p.partitions])
            for p in found
        ],
    )


@router.get("/{group}", response_model=GroupInfo)
async def describe(group: GroupPath, principal: PrincipalDep, coordinator: CoordinatorDep) -> GroupInfo:
    """State, generation, members and assignment, committed offsets and lag per partition (of the
    topics this key may describe)."""

    g, lag = await groups.describe(coordinator, principal, group)
    return GroupInfo(
        group=group,
        state=g.state,
        generation=g.generation,
        assignor=g.assignor,
        members=[
            MemberInfo(
                member_id=m.member_id,
                instance_id=m.instance_id,
                topics=m.topics,
                session_timeout_ms=m.session_timeout_ms,
                assignment=m.assignment,
                client_id=m.client_id,
                client_host=m.client_host,
            )
            for m in groups.visible_members(principal, g)
        ],
        lag=[
            LagInfo(
                topic=r.topic,
                partition=r.partition,
                committed_offset=r.committed_offset,
                high_watermark=r.high_watermark,
                log_start_offset=r.log_start_offset,
                lag=r.lag,
            )
            for r in lag
        ],
    )


@router.post("/{group}/offsets/reset", response_model=CommittedOffsets)
async def reset(
    group: GroupPath, body: ResetRequest, principal: PrincipalDep, coordinator: CoordinatorDep
) -> CommittedOffsets:
    """Admin: move a group's committed offsets (earliest, latest, timestamp, explicit) while it has no members."""
    offsets = await groups.reset(
        coordinator,
        principal,
        group,
        body.topic,
        body.to,
        timestamp=body.timestamp,
        offset=body.offset,
        partitions=body.partitions,
    )
    return CommittedOffsets(
        group=group,
        offsets=[
            PartitionOffset(topic=body.topic, partition=p, offset=o, metadata="reset") for p, o in offsets.items()
        ],
    )
