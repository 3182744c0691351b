"""Consumer groups: join, heartbeat, leave, commit and read offsets, describe, reset."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response

from consumer_api.dependencies import CoordinatorDep, PrincipalDep
from consumer_api.schemas import (
    CommitRequest,
    CommittedOffsets,
    GroupInfo,
    GroupList,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinRequest,
    JoinResponse,
    LagInfo,
    MemberInfo,
    PartitionOffset,
    ResetRequest,
)
from delta_log.core.acl import authorize
from delta_log.system.offsets import OffsetCommit

router = APIRouter(prefix="/groups", tags=["consumer groups"])


@router.post("/{group}/members", response_model=JoinResponse)
async def join(group: str, body: JoinRequest, principal: PrincipalDep, coordinator: CoordinatorDep) -> JoinResponse:
    """Join (or rejoin) a group; returns when the group is stable, with this member's partitions."""
    for t in body.topics:
        authorize(principal, "consume", t)
    r = await coordinator.join(
        group,
        topics=body.topics,
        member_id=body.member_id,
        instance_id=body.instance_id,
        session_timeout_ms=body.session_timeout_ms,
        assignor=body.assignor,
    )
    return JoinResponse(
        group=group, member_id=r.member_id, generation=r.generation, assignment=r.assignment, members=r.members
    )


@router.post("/{group}/members/{member_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(
    group: str, member_id: str, body: HeartbeatRequest, principal: PrincipalDep, coordinator: CoordinatorDep
) -> HeartbeatResponse:
    """Keep the session alive; `rebalance: true` means commit what you processed and join again."""
    r = await coordinator.heartbeat(group, member_id, body.generation)
    return HeartbeatResponse(generation=r.generation, rebalance=r.rebalance, assignment=r.assignment)


@router.delete("/{group}/members/{member_id}", status_code=204)
async def leave(group: str, member_id: str, principal: PrincipalDep, coordinator: CoordinatorDep) -> Response:
    """Leave the group (its partitions go to the others)."""
    await coordinator.leave(group, member_id)
    return Response(status_code=204)


@router.post("/{group}/offsets", response_model=CommittedOffsets)
async def commit(
    group: str, body: CommitRequest, principal: PrincipalDep, coordinator: CoordinatorDep
) -> CommittedOffsets:
    """Commit offsets (durable before the answer). Refused with 409 FENCED_MEMBER unless the
    member owns every partition in the group's current generation."""
    for o in body.offsets:
        authorize(principal, "consume", o.topic)
    now_us = int(time.time() * 1e6)
    commits = [
        OffsetCommit(
            group=group,
            topic=o.topic,
            partition=o.partition,
            offset=o.offset,
            metadata=o.metadata,
            member_id=body.member_id or "",
            generation=body.generation if body.generation is not None else -1,
            commit_timestamp_us=now_us,
        )
        for o in body.offsets
    ]
    await coordinator.commit(group, commits, member_id=body.member_id, generation=body.generation)
    return CommittedOffsets(group=group, offsets=body.offsets)


@router.get("/{group}/offsets", response_model=CommittedOffsets)
async def committed(group: str, principal: PrincipalDep, coordinator: CoordinatorDep) -> CommittedOffsets:
    """The group's committed offsets."""
    offsets = await coordinator.committed(group)
    return CommittedOffsets(
        group=group,
        offsets=[
            PartitionOffset(topic=t, partition=p, offset=c.offset, metadata=c.metadata)
            for (t, p), c in sorted(offsets.items())
        ],
    )


@router.get("", response_model=GroupList)
async def list_groups(principal: PrincipalDep, coordinator: CoordinatorDep) -> GroupList:
    """Every group with members or committed offsets."""
    out: list[dict[str, str | int]] = []
    for name in await coordinator.group_names():
        g = coordinator.all_groups().get(name)
        out.append(
            {
                "group": name,
                "state": g.state if g else "Empty",
                "members": len(g.members) if g else 0,
                "generation": g.generation if g else 0,
            }
        )
    return GroupList(groups=out)


@router.get("/{group}", response_model=GroupInfo)
async def describe(group: str, principal: PrincipalDep, coordinator: CoordinatorDep) -> GroupInfo:
    """State, generation, members and assignment, committed offsets and lag per partition."""
    g, lag = await coordinator.describe(group)
    return GroupInfo(
        group=group,
        state=g.state,
        generation=g.generation,
        assignor=g.assignor,
        members=[
            MemberInfo(
                member_id=m.member_id,
                instance_id=m.instance_id,
                topics=sorted(m.topics),
                session_timeout_ms=m.session_timeout_ms,
                assignment=m.assignment,
            )
            for m in g.members.values()
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
    group: str, body: ResetRequest, principal: PrincipalDep, coordinator: CoordinatorDep
) -> CommittedOffsets:
    """Admin: move a group's committed offsets (earliest, latest, timestamp, explicit) while it has no members."""
    authorize(principal, "admin", body.topic)
    offsets = await coordinator.reset(
        group, body.topic, body.to, timestamp=body.timestamp, offset=body.offset, partitions=body.partitions
    )
    return CommittedOffsets(
        group=group,
        offsets=[
            PartitionOffset(topic=body.topic, partition=p, offset=o, metadata="reset") for p, o in offsets.items()
        ],
    )
