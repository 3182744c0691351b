"""The cluster as Kafka brokers: each live gateway with a Kafka listener is a broker; a
partition's leader is its owner gateway, a group's coordinator is its coordinator gateway.

A gateway that is not a member of a cluster (an app embedded in a test or a notebook) is the only
broker, leader of everything."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from broker.cluster import Cluster, GatewayRecord
from delta_log.core.ownership import group_resource, transaction_resource


def node_id_for(address: str) -> int:
    """A broker id derived from the advertised "host:port": the same after a restart at the same
    address, so clients' cached metadata stays right (31 bits: Kafka's ids are non-negative int32)."""
    return zlib.crc32(address.encode()) & 0x7FFF_FFFF


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int
    gateway_id: str | None = None

    @classmethod
    def of(cls, record: GatewayRecord) -> Broker | None:
        if not record.kafka:
            return None
        host, _, port = record.kafka.rpartition(":")
        return cls(record.node_id, host.strip("[]"), int(port), record.gateway_id)


class BrokerView:
    """Who leads and coordinates what, as Kafka clients must be told (this gateway's view)."""

    def __init__(self, me: Broker, cluster: Cluster | None) -> None:
        self.me = me
        self.cluster = cluster

    def brokers(self) -> list[Broker]:
        if self.cluster is None:
            return [self.me]
        found = [b for r in self.cluster.members if (b := Broker.of(r)) is not None]
        return found or [self.me]

    def _broker_of(self, gateway_id: str | None) -> Broker | None:
        if gateway_id is None or self.cluster is None:
            return None
        record = self.cluster.member(gateway_id)
        return Broker.of(record) if record is not None else None

    def leaders(self, topic: str, partitions: int) -> list[int]:
        """Each partition's leader's node id (-1: no live leader; clients retry)."""
        if self.cluster is None:
            return [self.me.node_id] * partitions
        out = []
        for owner in self.cluster.partition_owners(topic, partitions):
            b = self._broker_of(owner)
            out.append(b.node_id if b is not None else -1)
        return out

    def leads(self, topic: str, partition: int, partitions: int) -> bool:
        """Whether this gateway may append to the partition (its owner, or produce is not routed)."""
        if self.cluster is None or not self.cluster.settings.route_produce:
            return True
        owners = self.cluster.partition_owners(topic, partitions)
        return 0 <= partition < partitions and owners[partition] == self.cluster.me.gateway_id

    def coordinator(self, key: str, *, transaction: bool = False) -> Broker | None:
        """The coordinator of group `key` (of transactional id `key` if `transaction`)."""
        if self.cluster is None:
            return self.me
        owner = self.cluster.owner(transaction_resource(key) if transaction else group_resource(key))
        return self._broker_of(owner.gateway_id) if owner is not None else None
