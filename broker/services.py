"""The services of one gateway process, built once by the composition root and shared by every
front door (ingest_gateway's HTTP app and kafka_gateway's listener run on one event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.cluster import Cluster
from broker.coordinator import GroupCoordinator
from broker.fetch import FetchService
from broker.notifier import CommitNotifier
from broker.produce import ProduceService
from broker.transactions import TransactionCoordinator
from conf import Settings
from delta_log.core.ownership import transaction_resource
from delta_log.registry import TopicRegistry as TopicRegistry


@dataclass(slots=True, kw_only=True)
class Services:
    settings: Settings
    registry: TopicRegistry
    notifier: CommitNotifier
    coordinator: GroupCoordinator
    #: None for a gateway that is not a member of a cluster (an embedded app in tests)
    cluster: Cluster | None = None
    produce: ProduceService = field(init=False)  # produce, whichever door a record came by
    fetch: FetchService = field(init=False)  # fetch and its long-poll, whichever door asked
    transactions: TransactionCoordinator = field(init=False)  # Kafka's transactions, for every face

    def __post_init__(self) -> None:
        self.produce = ProduceService(self.registry, self.cluster)
        self.fetch = FetchService(self.registry, self.notifier)
        cluster = self.cluster
        self.transactions = TransactionCoordinator(
            self.registry,
            self.settings.transactions,
            land=self.produce.append,
            commit_offsets=self.coordinator.commit_transactional,
            owns=(lambda tid: cluster.owns(transaction_resource(tid))) if cluster is not None else None,
        )
        self.produce.transactions = self.transactions
        # a busy producer's transactions land a few at a time unless a consumer here waits for them
        self.transactions.watched = self.notifier.watched
        self.notifier.wait_listeners.append(self.transactions.reader_waits)
