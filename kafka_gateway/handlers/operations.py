"""What Kafka's operator tools and consoles ask a cluster about its brokers' disks, leaders,
reassignments: DescribeLogDirs (kafka-log-dirs, and the consoles' topic sizes), ElectLeaders
(kafka-leader-election) and ListPartitionReassignments (kafka-reassign-partitions --list),
answered truthfully for one copy per partition on a shared root (kafka-transactions' APIs are in
kafka_gateway.handlers.transactions):

- A gateway's one "log dir" is the storage root; it holds the partitions the gateway leads, each
  with the bytes of its files in the topic's Delta table (a `log` topic's unflushed acks are not
  counted: they are in the write-ahead log, not yet in the table).
- A partition's leader is its owner gateway, which is always the one replica: an election is never
  needed (ELECTION_NOT_NEEDED), and no reassignment is ever in progress.

Cluster rights, as Kafka's: ElectLeaders needs ALTER on the cluster (here: admin on every topic and
group, `Principal.administers_all`, what the maintenance jobs need), DescribeLogDirs and
ListPartitionReassignments DESCRIBE on it (admin on some topic, as GET /cluster); a key without them
is answered CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from broker import admin
from delta_log.errors import AuthorizationError
from kafka_gateway.apis import api
from kafka_gateway.errors import code_of, message_of
from kafka_gateway.session import Session

#: DescribeLogDirs' total_bytes and usable_bytes when not known
UNKNOWN_BYTES = -1


def _log_dirs(conn: Session, request: Any) -> dict[str, Any]:
    assert conn.principal is not None
    wanted = None if request.topics is None else {str(t.topic): {int(p) for p in t.partitions} for t in request.topics}
    try:
        sizes = admin.partition_sizes(conn.services.registry, conn.principal, None if wanted is None else list(wanted))
    except AuthorizationError:  # v1-2 have no top-level error: no log dir is described to them
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "results": []}
    me = conn.brokers.me.node_id
    topics = []
    for name, parts in sizes.items():
        if isinstance(parts, Exception):
            continue  # Kafka leaves out what it cannot describe
        leaders = conn.brokers.leaders(name, len(parts))  # the topic's every partition, as Metadata
        asked = None if wanted is None else wanted[name]
        led = [
            {"partition_index": p.partition, "partition_size": p.size_bytes, "offset_lag": 0, "is_future_key": False}
            for p in parts
            if leaders[p.partition] == me and (asked is None or p.partition in asked)
        ]
        if led:
            topics.append({"name": name, "partitions": led})
    root = str(conn.services.registry.storage.root)
    return {
        "throttle_time": 0,
        "error_code": 0,
        "results": [
            {
                "error_code": 0,
                "log_dir": root,
                "topics": topics,
                "total_bytes": UNKNOWN_BYTES,
                "usable_bytes": UNKNOWN_BYTES,
            }
        ],
    }


@api(35, "DescribeLogDirs", 1, 4)
async def describe_log_dirs(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return await asyncio.to_thread(_log_dirs, conn, request)


@api(43, "ElectLeaders", 0, 2)
async def elect_leaders(conn: Session, request: Any, version: int) -> dict[str, Any]:
    """Every partition already has its one possible leader. For all partitions (a null list) Kafka
    answers only those it elected: none here."""
    assert conn.principal is not None
    if not conn.principal.administers_all():
        message = "Electing leaders needs admin on every topic and group (Kafka: ALTER on the cluster)."
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "replica_election_results": [
                {
                    "topic": str(t.topic),
                    "partition_result": [
                        {
                            "partition_id": p,
                            "error_code": ErrorCode.cluster_authorization_failed,
                            "error_message": message,
                        }
                        for p in t.partitions
                    ],
                }
                for t in request.topic_partitions or ()
            ],
        }
    results = []
    for t in request.topic_partitions or ():
        name = str(t.topic)
        error: Exception | None = None
        try:
            n = await asyncio.to_thread(admin.describe_topic, conn.services.registry, conn.principal, name)
            partitions = n[0].partitions
        except Exception as exc:
            error, partitions = exc, 0
        leaders = conn.brokers.leaders(name, partitions) if error is None else []
        out = []
        for p in t.partitions:
            if error is not None:
                out.append({"partition_id": p, "error_code": code_of(error), "error_message": message_of(error)})
            elif not 0 <= p < partitions:
                out.append(
                    {
                        "partition_id": p,
                        "error_code": ErrorCode.unknown_topic_or_partition,
                        "error_message": f"Topic {name!r} has partitions 0-{partitions - 1}.",
                    }
                )
            elif leaders[p] < 0:
                out.append(
                    {
                        "partition_id": p,
                        "error_code": ErrorCode.eligible_leaders_not_available,
                        "error_message": "No live gateway owns it now; one takes it over within the member timeout.",
                    }
                )
            else:
                out.append(
                    {
                        "partition_id": p,
                        "error_code": ErrorCode.election_not_needed,
                        "error_message": "Its owner gateway is its leader and only replica.",
                    }
                )
        results.append({"topic": name, "partition_result": out})
    return {"throttle_time": 0, "error_code": 0, "replica_election_results": results}


@api(46, "ListPartitionReassignments", 0, 0)
async def list_partition_reassignments(conn: Session, request: Any, version: int) -> dict[str, Any]:
    assert conn.principal is not None
    if not conn.principal.allows("admin", None):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": "Listing reassignments needs admin on some topic (Kafka: DESCRIBE on the cluster).",
            "topics": [],
        }
    return {"throttle_time": 0, "error_code": 0, "error_message": None, "topics": []}
