"""Consumer groups: join, heartbeat, leave, commit and read offsets, describe, reset."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from consumer_api.dependencies import CoordinatorDep, RegistryDep, authorize
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
from delta_log.errors import GroupNotEmptyError, InvalidOffsetError, UnknownGroupError
from delta_log.offsets import OffsetCommit
from delta_log.registry import TopicRegistry

router = APIRouter(prefix="/groups", tags=["consumer groups"])


@router.post("/{group}/members", response_model=JoinResponse)
async def join(group: str, body: JoinRequest, request: Request, coordinator: CoordinatorDep) -> JoinResponse:
    """Join (or rejoin) a group; returns when the group is stable, with this member's partitions."""
    for t in body.topics:
        authorize(request, "consume", t)
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
    group: str, member_id: str, body: HeartbeatRequest, coordinator: CoordinatorDep
) -> HeartbeatResponse:
    """Keep the session alive; `rebalance: true` means commit what you processed and join again."""
    r = await coordinator.heartbeat(group, member_id, body.generation)
    return HeartbeatResponse(generation=r.generation, rebalance=r.rebalance, assignment=r.assignment)


@router.delete("/{group}/members/{member_id}", status_code=204)
async def leave(group: str, member_id: str, coordinator: CoordinatorDep) -> Response:
    """Leave the group (its partitions go to the others)."""
    await coordinator.leave(group, member_id)
    return Response(status_code=204)


@router.post("/{group}/offsets", response_model=CommittedOffsets)
async def commit(group: str, body: CommitRequest, request: Request, coordinator: CoordinatorDep) -> CommittedOffsets:
    """Commit offsets (durable before the answer). Refused with 409 FENCED_MEMBER unless the
    member owns every partition in the group's current generation."""
    for o in body.offsets:
        authorize(request, "consume", o.topic)
        if o.offset < 0:
            raise InvalidOffsetError(f"Offset must be >= 0; got {o.offset}.", offset=o.offset)
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


def _committed(registry: TopicRegistry, group: str) -> list[PartitionOffset]:
    registry.offsets.load()  # commits by other writers (Spark queries with groupId, other servers)
    return [
        PartitionOffset(topic=t, partition=p, offset=c.offset, metadata=c.metadata)
        for (t, p), c in sorted(registry.offsets.committed(group).items())
    ]


@router.get("/{group}/offsets", response_model=CommittedOffsets)
async def committed(group: str, registry: RegistryDep, coordinator: CoordinatorDep) -> CommittedOffsets:
    """The group's committed offsets."""
    offsets = await run_in_threadpool(_committed, registry, group)
    if not offsets and group not in coordinator.all_groups():
        raise UnknownGroupError(f"Group {group!r} has no members and no committed offsets.", group=group)
    return CommittedOffsets(group=group, offsets=offsets)


@router.get("", response_model=GroupList)
async def list_groups(registry: RegistryDep, coordinator: CoordinatorDep) -> GroupList:
    """Every group with members or committed offsets."""
    await run_in_threadpool(registry.offsets.load)
    names = set(coordinator.all_groups()) | set(await run_in_threadpool(registry.offsets.groups))
    out: list[dict[str, str | int]] = []
    for name in sorted(names):
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


def _lag(registry: TopicRegistry, group: str, topics: set[str]) -> list[LagInfo]:
    registry.offsets.load()
    committed = registry.offsets.committed(group)
    topics = topics | {t for t, _ in committed}
    rows = []
    for t in sorted(topics):
        try:
            parts = registry.reader(t).partition_offsets()
        except Exception:
            continue  # a deleted topic
        for p in parts:
            c = committed.get((t, p.partition))
            base = c.offset if c is not None else p.log_start_offset
            rows.append(
                LagInfo(
                    topic=t,
                    partition=p.partition,
                    committed_offset=c.offset if c else None,
                    high_watermark=p.high_watermark,
                    log_start_offset=p.log_start_offset,
                    lag=max(0, p.high_watermark - max(base, p.log_start_offset)),
                )
            )
    return rows


@router.get("/{group}", response_model=GroupInfo)
async def describe(group: str, registry: RegistryDep, coordinator: CoordinatorDep) -> GroupInfo:
    """State, generation, members and assignment, committed offsets and lag per partition."""
    g = coordinator.all_groups().get(group)
    await run_in_threadpool(registry.offsets.load)
    has_offsets = bool(await run_in_threadpool(registry.offsets.committed, group))
    if g is None and not has_offsets:
        raise UnknownGroupError(f"Group {group!r} does not exist.", group=group)
    members = list(g.members.values()) if g else []
    topics = {t for m in members for t in m.topics}
    lag = await run_in_threadpool(_lag, registry, group, topics)
    return GroupInfo(
        group=group,
        state=g.state if g else "Empty",
        generation=g.generation if g else 0,
        assignor=g.assignor if g else "range",
        members=[
            MemberInfo(
                member_id=m.member_id,
                instance_id=m.instance_id,
                topics=sorted(m.topics),
                session_timeout_ms=m.session_timeout_ms,
                assignment=m.assignment,
            )
            for m in members
        ],
        lag=lag,
    )


@router.post("/{group}/offsets/reset", response_model=CommittedOffsets)
async def reset(
    group: str, body: ResetRequest, request: Request, registry: RegistryDep, coordinator: CoordinatorDep
) -> CommittedOffsets:
    """Admin: move a group's committed offsets (earliest, latest, timestamp, explicit) while it has no members."""
    authorize(request, "admin", body.topic)
    g = coordinator.all_groups().get(group)
    if g is not None and g.members:
        raise GroupNotEmptyError(f"Group {group!r} has {len(g.members)} active members.", group=group)
    reader = await run_in_threadpool(registry.reader, body.topic)
    infos = {i.partition: i for i in await run_in_threadpool(reader.partition_offsets)}
    parts = body.partitions if body.partitions is not None else sorted(infos)
    offsets = []
    for p in parts:
        if p not in infos:
            await run_in_threadpool(reader.fetch, p, 0)  # raises UNKNOWN_PARTITION
        info = infos[p]
        if body.to == "earliest":
            off = info.log_start_offset
        elif body.to == "latest":
            off = info.high_watermark
        elif body.to == "timestamp":
            if body.timestamp is None:
                raise InvalidOffsetError("to=timestamp needs a timestamp (epoch ms).")
            found = await run_in_threadpool(reader.offset_for_timestamp, p, body.timestamp)
            off = info.high_watermark if found is None else found
        else:
            if body.offset is None or not info.log_start_offset <= body.offset <= info.high_watermark:
                raise InvalidOffsetError(
                    f"to=offset needs an offset within [{info.log_start_offset}, {info.high_watermark}] "
                    f"for partition {p}.",
                    partition=p,
                )
            off = body.offset
        offsets.append(PartitionOffset(topic=body.topic, partition=p, offset=off, metadata="reset"))
    now_us = int(time.time() * 1e6)
    await coordinator.commit(
        group,
        [
            OffsetCommit(
                group=group,
                topic=o.topic,
                partition=o.partition,
                offset=o.offset,
                metadata="reset",
                commit_timestamp_us=now_us,
            )
            for o in offsets
        ],
        member_id=None,
        generation=None,
    )
    return CommittedOffsets(group=group, offsets=offsets)
