"""Topic administration routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool

from broker import admin
from broker.admin import TopicDescription, TopicReader
from ingest_gateway.kit.dependencies import PrincipalDep, RegistryDep
from ingest_gateway.kit.params import AfterQuery, LimitQuery, SearchQuery, TopicPath
from ingest_gateway.schemas import (
    AddPartitions,
    AlterConfig,
    CreateTopic,
    PartitionInfo,
    RegisteredSchema,
    TopicInfo,
    TopicList,
)

router = APIRouter(prefix="/topics", tags=["topics"])


def _info(d: TopicDescription, reader: TopicReader | None = None, table_lag_s: float | None = None) -> TopicInfo:
    parts = None
    if reader is not None:
        parts = [
            PartitionInfo(
                partition=p.partition,
                log_start_offset=p.log_start_offset,
                high_watermark=p.high_watermark,
                segments=p.segments,
                size_bytes=p.size_bytes,
            )
            for p in reader.partition_offsets()
        ]
    return TopicInfo(
        name=d.name,
        partitions=d.partitions,
        config=dict(d.config.values),
        table_version=d.table_version,
        partition_offsets=parts,
        table_lag_ms=None if table_lag_s is None else int(table_lag_s * 1000),
    )


@router.post("", status_code=201, response_model=TopicInfo, response_model_exclude_none=True)
def create_topic(body: CreateTopic, registry: RegistryDep, principal: PrincipalDep) -> TopicInfo:
    """Create a topic (a Delta table partitioned by `partition`), with its value schema if given."""
    schema = body.value_schema
    created = admin.create_topic(
        registry,
        principal,
        body.name,
        partitions=body.partitions,
        config=body.config,
        value_schema=admin.ValueSchema(schema_type=schema.schema_type, schema_text=schema.schema_text)
        if schema is not None
        else None,
    )
    registered = None
    if created.schema is not None:
        subject, version, schema_id = created.schema
        registered = RegisteredSchema(subject=subject, version=version, id=schema_id)
    return _info(created.description).model_copy(update={"value_schema": registered})


@router.get("", response_model=TopicList, response_model_exclude_none=True)
def list_topics(
    registry: RegistryDep,
    principal: PrincipalDep,
    search: SearchQuery = "",
    after: AfterQuery = "",
    limit: LimitQuery = None,
) -> TopicList:
    """List topics this key may see, by name; a page of them with `limit` (then `next` names the
    last one: pass it as `after` for the next page)."""
    names, last = admin.list_topics(registry, principal, search=search, after=after, limit=limit)
    return TopicList(topics=names, next=last)


@router.get("/{topic}", response_model=TopicInfo)
def describe_topic(topic: TopicPath, registry: RegistryDep, principal: PrincipalDep) -> TopicInfo:
    """Describe a topic: config and, per partition, log start offset and high watermark."""
    description, reader = admin.describe_topic(registry, principal, topic)
    return _info(description, reader, registry.table_lag_s(topic))


@router.get("/{topic}/throughput")
def throughput(
    topic: TopicPath,
    registry: RegistryDep,
    principal: PrincipalDep,
    commits: Annotated[
        int, Query(ge=1, le=admin.MAX_THROUGHPUT_COMMITS, description="How many of the latest appends.")
    ] = 200,
) -> dict[str, object]:
    """The topic's latest appends from its Delta history, oldest first: when each was committed,
    how many records and file bytes it added (every gateway's, and the Spark sink's). A rate over
    time is theirs to bucket; the console draws its sparklines from this."""
    appended = admin.throughput(registry, principal, topic, commits)
    return {"topic": topic, "commits": [{"at_ms": t, "records": r, "bytes": b} for t, r, b in appended]}


@router.patch("/{topic}/config", response_model=TopicInfo, response_model_exclude_none=True)
def alter_config(topic: TopicPath, body: AlterConfig, registry: RegistryDep, principal: PrincipalDep) -> TopicInfo:
    """Set topic config keys (null resets a key to its default)."""
    return _info(admin.alter_config(registry, principal, topic, body.config))


@router.post("/{topic}/partitions", response_model=TopicInfo, response_model_exclude_none=True)
def add_partitions(topic: TopicPath, body: AddPartitions, registry: RegistryDep, principal: PrincipalDep) -> TopicInfo:
    """Raise the partition count (never lower)."""
    return _info(admin.add_partitions(registry, principal, topic, body.count))


@router.delete("/{topic}", status_code=204)
async def delete_topic(topic: TopicPath, registry: RegistryDep, principal: PrincipalDep) -> Response:
    """Delete a topic and its data."""
    await run_in_threadpool(admin.delete_topic, registry, principal, topic)
    return Response(status_code=204)
