"""Admin over Kafka: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs (all through broker.admin, the same rules and ACLs as HTTP).

- Replication factors are accepted and not used: a topic is one Delta table on the root's storage,
  whose durability is the storage's (one copy, never a second table).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from broker import admin, groups
from delta_log.core.topic_config import DEFAULT_CONFIG
from delta_log.errors import InvalidConfigError, TopiclakeError
from kafka_gateway.apis import api
from kafka_gateway.errors import code_of, message_of
from kafka_gateway.session import Session

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
GROUP_RESOURCE = 32
#: DescribeConfigs' config sources
DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_SOURCE = 5
GROUP_CONFIG_SOURCE = 8
#: IncrementalAlterConfigs' operations
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
#: a topic id that names no topic (Kafka's Uuid.ZERO_UUID)
ZERO_ID = uuid.UUID(int=0)


def _error(exc: Exception) -> dict[str, Any]:
    return {"error_code": code_of(exc), "error_message": message_of(exc)}


def _create(conn: Session, request: Any, version: int) -> dict[str, Any]:
    assert conn.principal is not None
    out = []
    for t in request.topics:
        partitions = t.num_partitions
        if partitions == -1:
            partitions = len(t.assignments) or conn.services.settings.server.default_partitions
        config = {c.name: c.value for c in t.configs}
        entry: dict[str, Any] = {"name": t.name, "error_code": 0, "error_message": None}
        try:
            created = admin.create_topic(
                conn.services.registry,
                conn.principal,
                t.name,
                partitions=partitions,
                config=config,
                validate_only=request.validate_only if version >= 1 else False,
            )
            d = created.description
            entry |= {
                "num_partitions": d.partitions,
                "replication_factor": 1,
                "configs": [
                    {
                        "name": k,
                        "value": v,
                        "read_only": False,
                        "config_source": DYNAMIC_TOPIC_CONFIG if k in config else DEFAULT_SOURCE,
                        "is_sensitive": False,
                    }
                    for k, v in sorted(d.config.values.items())
                ],
            }
        except TopiclakeError as exc:
            entry |= _error(exc) | {"num_partitions": -1, "replication_factor": -1}
        out.append(entry)
    return {"throttle_time": 0, "topics": out}


@api(19, "CreateTopics", 2, 7)
async def create_topics(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return await asyncio.to_thread(_create, conn, request, version)


def _delete(conn: Session, names: list[str], ids: list[uuid.UUID], refused: list[dict[str, Any]]) -> dict[str, Any]:
    """One result per name and per id, as Kafka's: an id no topic has is UNKNOWN_TOPIC_ID; one of a
    topic the key may not delete is TOPIC_AUTHORIZATION_FAILED, its name shown only to a key that
    may describe it. `refused`: the results of entries refused before."""
    assert conn.principal is not None
    registry = conn.services.registry
    out: list[dict[str, Any]] = list(refused)
    by_id = admin.topics_by_id(registry, set(ids))
    wanted: list[tuple[str, uuid.UUID | None, bool]] = [(name, None, True) for name in names]
    for asked in ids:
        name = by_id.get(asked)
        if name is None:
            out.append(
                _refusal(None, asked, ErrorCode.unknown_topic_id, "No topic has this id (Metadata gives each topic's).")
            )
        else:
            wanted.append((name, asked, conn.principal.allows("describe", name)))
    for name, topic_id, named in wanted:
        try:
            if topic_id is None:
                with contextlib.suppress(TopiclakeError):  # the delete below says what is wrong
                    topic_id = registry.reader(name).topic_id
            admin.delete_topic(registry, conn.principal, name)
            out.append({"name": name, "topic_id": topic_id, "error_code": 0, "error_message": None})
        except TopiclakeError as exc:
            # a key that may not describe the topic learns nothing of it, its name included
            shown = _error(exc) if named else {"error_code": code_of(exc), "error_message": None}
            out.append({"name": name if named else None, "topic_id": topic_id} | shown)
    return {"throttle_time": 0, "responses": out}


def _refusal(name: str | None, topic_id: uuid.UUID | None, code: int, message: str) -> dict[str, Any]:
    return {"name": name, "topic_id": topic_id, "error_code": code, "error_message": message}


@api(20, "DeleteTopics", 1, 6)
async def delete_topics(conn: Session, request: Any, version: int) -> dict[str, Any]:
    if version < 6:
        return await asyncio.to_thread(_delete, conn, list(request.topic_names), [], [])
    names, ids, refused = [], [], []
    for t in request.topics:  # by name or by id, as Kafka checks them
        has_id = t.topic_id not in (None, ZERO_ID)
        if t.name and has_id:
            refused.append(
                _refusal(
                    t.name, t.topic_id, ErrorCode.invalid_request, "Name a topic by its name or by its id, not both."
                )
            )
        elif t.name:
            names.append(t.name)
        elif has_id:
            ids.append(t.topic_id)
        else:
            refused.append(_refusal(None, ZERO_ID, ErrorCode.invalid_request, "Neither topic name nor id were given."))
    return await asyncio.to_thread(_delete, conn, names, ids, refused)


def _add_partitions(conn: Session, request: Any) -> dict[str, Any]:
    assert conn.principal is not None
    out = []
    for t in request.topics:
        try:
            admin.add_partitions(
                conn.services.registry, conn.principal, t.name, t.count, validate_only=request.validate_only
            )
            out.append({"name": t.name, "error_code": 0, "error_message": None})
        except TopiclakeError as exc:
            out.append({"name": t.name} | _error(exc))
    return {"throttle_time": 0, "results": out}


@api(37, "CreatePartitions", 0, 3)
async def create_partitions(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return await asyncio.to_thread(_add_partitions, conn, request)


def _config_entry(name: str, value: str, source: int) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "read_only": False,
        "config_source": source,
        "is_default": source == DEFAULT_SOURCE,
        "is_sensitive": False,
        "synonyms": [],
        "config_type": 0,
        "documentation": None,
    }


def _describe_topic_configs(conn: Session, r: Any) -> list[dict[str, Any]]:
    """Raises: TopiclakeError."""
    assert conn.principal is not None
    d, _ = admin.describe_topic(conn.services.registry, conn.principal, r.resource_name)
    keys = set(r.configuration_keys) if r.configuration_keys is not None else None
    return [
        _config_entry(k, v, DEFAULT_SOURCE if DEFAULT_CONFIG.get(k) == v else DYNAMIC_TOPIC_CONFIG)
        for k, v in sorted(d.config.values.items())
        if keys is None or k in keys
    ]


async def _describe_group_configs(conn: Session, r: Any) -> list[dict[str, Any]]:
    """Raises: TopiclakeError."""
    assert conn.principal is not None
    entries = await groups.describe_group_config(conn.services.coordinator, conn.principal, r.resource_name)
    keys = set(r.configuration_keys) if r.configuration_keys is not None else None
    return [
        _config_entry(e.name, e.value, DEFAULT_SOURCE if e.is_default else GROUP_CONFIG_SOURCE)
        for e in entries
        if keys is None or e.name in keys
    ]


@api(32, "DescribeConfigs", 1, 4)
async def describe_configs(conn: Session, request: Any, version: int) -> dict[str, Any]:
    results = []
    for r in request.resources:
        base = {"resource_type": r.resource_type, "resource_name": r.resource_name, "error_message": None}
        try:
            if r.resource_type == BROKER_RESOURCE:
                configs: list[dict[str, Any]] = []
            elif r.resource_type == TOPIC_RESOURCE:
                configs = await asyncio.to_thread(_describe_topic_configs, conn, r)
            elif r.resource_type == GROUP_RESOURCE:
                configs = await _describe_group_configs(conn, r)
            else:
                results.append(base | {"error_code": ErrorCode.invalid_request, "configs": []})
                continue
        except TopiclakeError as exc:
            results.append(base | _error(exc) | {"configs": []})
            continue
        results.append(base | {"error_code": 0, "configs": configs})
    return {"throttle_time": 0, "results": results}


def _incremental_updates(r: Any, what: str) -> dict[str, str | None]:
    """IncrementalAlterConfigs' SET and DELETE of one resource. Raises: InvalidConfigError."""
    updates: dict[str, str | None] = {}
    for c in r.configs:
        if c.config_operation == SET:
            updates[c.name] = c.value
        elif c.config_operation == DELETE:
            updates[c.name] = None
        else:
            raise InvalidConfigError(
                f"{c.name}: APPEND and SUBTRACT are for list configs; {what} configs here are single values.",
                key=c.name,
            )
    return updates


def _alter_topic(conn: Session, r: Any, incremental: bool, validate_only: bool) -> None:
    """Raises: TopiclakeError."""
    assert conn.principal is not None
    d, _ = admin.describe_topic(conn.services.registry, conn.principal, r.resource_name)
    updates: dict[str, object]
    if incremental:
        updates = dict(_incremental_updates(r, "topic"))
    else:  # AlterConfigs replaces the whole set: what it leaves out returns to its default
        given = {c.name: c.value for c in r.configs}  # an unknown key is refused (INVALID_CONFIG)
        updates = {k: None for k in d.config.values if k in DEFAULT_CONFIG} | given
    admin.alter_config(conn.services.registry, conn.principal, r.resource_name, updates, validate_only=validate_only)


async def _alter(conn: Session, request: Any, incremental: bool) -> dict[str, Any]:
    assert conn.principal is not None
    out = []
    for r in request.resources:
        base = {"resource_type": r.resource_type, "resource_name": r.resource_name}
        try:
            if r.resource_type == TOPIC_RESOURCE:
                await asyncio.to_thread(_alter_topic, conn, r, incremental, request.validate_only)
            elif r.resource_type == GROUP_RESOURCE and incremental:  # (Kafka's AlterConfigs has no groups)
                await groups.alter_group_config(
                    conn.services.coordinator,
                    conn.principal,
                    r.resource_name,
                    _incremental_updates(r, "group"),
                    validate_only=request.validate_only,
                )
            else:
                why = (
                    "Topic configs, and group configs with IncrementalAlterConfigs, can be changed here; "
                    "gateway settings are in topiclake.toml."
                )
                out.append(base | {"error_code": ErrorCode.invalid_request, "error_message": why})
                continue
        except TopiclakeError as exc:
            out.append(base | _error(exc))
            continue
        out.append(base | {"error_code": 0, "error_message": None})
    return {"throttle_time": 0, "responses": out}


@api(44, "IncrementalAlterConfigs", 0, 1)
async def incremental_alter_configs(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return await _alter(conn, request, True)


@api(33, "AlterConfigs", 0, 2)
async def alter_configs(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return await _alter(conn, request, False)
