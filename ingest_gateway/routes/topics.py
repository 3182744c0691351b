"""Topic administration routes."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool

from consumer_api.params import TopicPath
from delta_log.core.acl import authorize
from delta_log.core.value_schemas import parse_schema, subject_for
from delta_log.log.catalog import TopicDescription
from delta_log.log.reader import TopicReader
from ingest_gateway.dependencies import PrincipalDep, RegistryDep
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


def _info(d: TopicDescription, reader: TopicReader | None = None) -> TopicInfo:
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
    )


@router.post("", status_code=201, response_model=TopicInfo, response_model_exclude_none=True)
def create_topic(body: CreateTopic, registry: RegistryDep, principal: PrincipalDep) -> TopicInfo:
    """Create a topic (a Delta table partitioned by `partition`), with its value schema if given."""
    authorize(principal, "admin", body.name)  # admin implies produce, which registering needs
    registered = None
    if body.value_schema is not None:
        # Schema first, so a refused one leaves nothing behind and no record is ever unchecked;
        # the topic's own checks first, so a refused topic registers nothing.
        schema = parse_schema(body.value_schema.schema_type, body.value_schema.schema_text)
        registry.catalog.check_new_topic(body.name, partitions=body.partitions, config=body.config)
        subject = subject_for(body.name)
        v = registry.schemas.register(subject, schema)
        registered = RegisteredSchema(subject=subject, version=v.version, id=v.schema_id)
    d = registry.catalog.create_topic(body.name, partitions=body.partitions, config=body.config)
    return _info(d).model_copy(update={"value_schema": registered})


@router.get("", response_model=TopicList)
def list_topics(registry: RegistryDep, principal: PrincipalDep) -> TopicList:
    """List topics this key may see."""
    names = registry.catalog.list_topics()
    return TopicList(topics=[n for n in names if principal.allows("describe", n)])


@router.get("/{topic}", response_model=TopicInfo)
def describe_topic(topic: TopicPath, registry: RegistryDep, principal: PrincipalDep) -> TopicInfo:
    """Describe a topic: config and, per partition, log start offset and high watermark."""
    authorize(principal, "describe", topic)
    desc, reader = registry.describe_topic(topic)
    return _info(desc, reader)


@router.patch("/{topic}/config", response_model=TopicInfo, response_model_exclude_none=True)
def alter_config(topic: TopicPath, body: AlterConfig, registry: RegistryDep, principal: PrincipalDep) -> TopicInfo:
    """Set topic config keys (null resets a key to its default)."""
    authorize(principal, "admin", topic)
    return _info(registry.alter_config(topic, body.config))


@router.post("/{topic}/partitions", response_model=TopicInfo, response_model_exclude_none=True)
def add_partitions(topic: TopicPath, body: AddPartitions, registry: RegistryDep, principal: PrincipalDep) -> TopicInfo:
    """Raise the partition count (never lower)."""
    authorize(principal, "admin", topic)
    return _info(registry.add_partitions(topic, body.count))


@router.delete("/{topic}", status_code=204)
async def delete_topic(topic: TopicPath, registry: RegistryDep, principal: PrincipalDep) -> Response:
    """Delete a topic and its data."""
    authorize(principal, "admin", topic)
    await run_in_threadpool(registry.delete_topic, topic)
    return Response(status_code=204)
