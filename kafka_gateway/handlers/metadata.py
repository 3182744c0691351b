"""Metadata, DescribeCluster and FindCoordinator: the cluster as Kafka brokers."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from broker import admin
from delta_log.core.acl import NO_OPERATIONS, kafka_operations
from delta_log.core.topic_config import INTERNAL_TOPICS
from delta_log.errors import TopiclakeError
from kafka_gateway.apis import api
from kafka_gateway.errors import code_of, message_of
from kafka_gateway.session import Session

#: partitions carry no leader epoch: clients then never ask OffsetForLeaderEpoch to validate
NO_EPOCH = -1


def cluster_id(conn: Session) -> str:
    """One id per storage root (every gateway on it answers the same), in Kafka's form."""
    digest = hashlib.sha256(str(conn.services.registry.storage.root).encode()).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def brokers(conn: Session) -> list[dict[str, Any]]:
    return [{"node_id": b.node_id, "host": b.host, "port": b.port, "rack": None} for b in conn.brokers.brokers()]


def internal_topic_id(conn: Session, name: str) -> uuid.UUID:
    """An internal topic's id: one per storage root and name, as every gateway on it answers."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{conn.services.registry.storage.root}#{name}")


def _topic(conn: Session, name: str, operations: bool) -> dict[str, Any]:
    """One topic's metadata, or its error; `operations`: with what the key may do with it."""
    assert conn.principal is not None
    if not conn.principal.allows("describe", name):
        return {"name": name, "error_code": ErrorCode.topic_authorization_failed, "partitions": []}
    granted = kafka_operations(conn.principal, "topic", name) if operations else NO_OPERATIONS
    internal = name in INTERNAL_TOPICS
    try:
        if internal:
            n, topic_id = INTERNAL_TOPICS[name], internal_topic_id(conn, name)
        else:
            reader = conn.services.registry.reader(name)
            n, topic_id = reader.config.partitions, reader.topic_id
    except TopiclakeError as exc:
        return {"name": name, "error_code": code_of(exc), "partitions": [], "topic_authorized_operations": granted}
    leaders = conn.brokers.leaders(name, n)
    return {
        "name": name,
        "topic_id": topic_id,
        "error_code": 0,
        "is_internal": internal,
        "partitions": [
            {
                "error_code": 0 if leader >= 0 else ErrorCode.leader_not_available,
                "partition_index": p,
                "leader_id": leader,
                "leader_epoch": NO_EPOCH,
                "replica_nodes": [leader] if leader >= 0 else [],
                "isr_nodes": [leader] if leader >= 0 else [],
                "offline_replicas": [],
            }
            for p, leader in enumerate(leaders)
        ],
        "topic_authorized_operations": granted,
    }


def _metadata(conn: Session, names: list[str] | None, request: Any = None) -> dict[str, Any]:
    assert conn.principal is not None
    registry = conn.services.registry
    if names is None:  # every topic this key may describe (others are not even named)
        names = [n for n in [*registry.catalog.list_topics(), *INTERNAL_TOPICS] if conn.principal.allows("describe", n)]
    return {
        "throttle_time": 0,
        "brokers": brokers(conn),
        "cluster_id": cluster_id(conn),
        "controller_id": conn.brokers.me.node_id,
        "topics": [_topic(conn, n, getattr(request, "include_topic_authorized_operations", False)) for n in names],
        "cluster_authorized_operations": _cluster_operations(conn, request),
    }


def _cluster_operations(conn: Session, request: Any) -> int:
    """What the key may do with the cluster, when the request asks (Metadata v8-10, DescribeCluster)."""
    assert conn.principal is not None
    if getattr(request, "include_cluster_authorized_operations", False):
        return kafka_operations(conn.principal, "cluster")
    return NO_OPERATIONS


def _by_ids(conn: Session, topics: Any, request: Any) -> dict[str, Any]:
    """Metadata for topics named by id (v10+; the consumer protocol's clients ask so for the
    topics of their assignment): each id's topic, or UNKNOWN_TOPIC_ID."""
    wanted = [t.topic_id for t in topics if not t.name]
    found = admin.topics_by_id(conn.services.registry, set(wanted))
    answer = _metadata(conn, [t.name for t in topics if t.name] + [found[i] for i in wanted if i in found], request)
    answer["topics"] += [
        {"name": None, "topic_id": i, "error_code": ErrorCode.unknown_topic_id, "partitions": []}
        for i in wanted
        if i not in found
    ]
    return answer


@api(3, "Metadata", 0, 12)
async def metadata(conn: Session, request: Any, version: int) -> dict[str, Any]:
    topics = request.topics
    if topics and any(not t.name for t in topics):
        return await asyncio.to_thread(_by_ids, conn, topics, request)
    names = None if topics is None or (version == 0 and not topics) else [t.name for t in topics]
    return await asyncio.to_thread(_metadata, conn, names, request)


@api(60, "DescribeCluster", 0, 1)
async def describe_cluster(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "error_code": 0,
        "endpoint_type": 1,
        "cluster_id": cluster_id(conn),
        "controller_id": conn.brokers.me.node_id,
        "brokers": [
            {"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": None} for b in brokers(conn)
        ],
        "cluster_authorized_operations": _cluster_operations(conn, request),
    }


GROUP_KEY = 0
TRANSACTION_KEY = 1


def _coordinator(conn: Session, key: str, key_type: int) -> dict[str, Any]:
    assert conn.principal is not None
    none = {"key": key, "node_id": -1, "host": "", "port": -1}
    if key_type == TRANSACTION_KEY:
        if not conn.principal.allows_transactional_id("describe", key):
            return none | {
                "error_code": ErrorCode.transactional_id_authorization_failed,
                "error_message": "No ACL for this transactional id.",
            }
    elif key_type != GROUP_KEY:  # share groups (KIP-932) are not served
        return none | {"error_code": ErrorCode.invalid_request, "error_message": "Unknown coordinator key type."}
    elif not conn.principal.allows_group("describe", key):
        return none | {"error_code": ErrorCode.group_authorization_failed, "error_message": "No ACL for this group."}
    try:
        b = conn.brokers.coordinator(key, transaction=key_type == TRANSACTION_KEY)
    except TopiclakeError as exc:
        return none | {"error_code": code_of(exc), "error_message": message_of(exc)}
    if b is None:
        return none | {"error_code": ErrorCode.coordinator_not_available, "error_message": "No live gateway; retry."}
    return {"key": key, "node_id": b.node_id, "host": b.host, "port": b.port, "error_code": 0, "error_message": None}


@api(10, "FindCoordinator", 0, 6)
async def find_coordinator(conn: Session, request: Any, version: int) -> dict[str, Any]:
    key_type = getattr(request, "key_type", GROUP_KEY)
    if version >= 4:  # batched
        return {
            "throttle_time": 0,
            "coordinators": [_coordinator(conn, k, key_type) for k in request.coordinator_keys],
        }
    found = _coordinator(conn, request.key, key_type)
    return {"throttle_time": 0, **found}
