"""The transaction coordinator (broker.transactions) on a real registry and real Delta tables:
staged records are invisible until commit, a commit lands each topic in one Delta commit with the
group offsets after, and a decision a crash left half done is finished exactly once by the next
coordinator (a restart, or another gateway taking the id over)."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import threading
from collections.abc import Mapping
from dataclasses import replace as dataclasses_replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from broker import transactions as broker_transactions
from broker.notifier import CommitNotifier
from broker.produce import Decoded, Produce, ProduceService
from broker.transactions import MAX_LANDINGS, MAX_QUEUED, CommitOffsets, TransactionCoordinator, TxnBatch
from conf import TransactionSettings
from delta_log.core import transactions as rules
from delta_log.core.acl import ANONYMOUS, principal_of
from delta_log.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    StorageUnavailableError,
    TransactionalIdAuthorizationError,
)
from delta_log.log.writer import AppendRequest, AppendResult
from delta_log.registry import TopicRegistry
from delta_log.system.offsets import OffsetCommit
from delta_log.system.transactions import SCHEMA, TABLE, TransactionStaging, TransactionStore


@pytest.fixture
def registry(settings):
    reg = TopicRegistry(settings)
    for name in ("a", "b"):
        reg.catalog.create_topic(name, partitions=2)
    yield reg
    reg.close()


def _coordinator(
    registry: TopicRegistry, gate: asyncio.Event | None = None
) -> tuple[ProduceService, TransactionCoordinator]:
    """A produce service and its transaction coordinator; `gate`: landings wait until it is set."""
    produce = ProduceService(registry)

    async def land(topic: str, request: AppendRequest) -> AppendResult:
        if gate is not None:
            await gate.wait()
        return await produce.append(topic, request)

    coordinator = TransactionCoordinator(
        registry, TransactionSettings(), land=land, commit_offsets=_offsets_writer(registry)
    )
    produce.transactions = coordinator
    return produce, coordinator


def _offsets_writer(registry: TopicRegistry) -> CommitOffsets:
    """Writes a landing's group offsets to the registry's offsets table, as the group coordinator does."""

    async def commit_offsets(commits: Mapping[str, list[OffsetCommit]], transaction: tuple[str, int]) -> None:
        rows = [c for group in sorted(commits) for c in commits[group]]
        await asyncio.to_thread(lambda: registry.offsets.commit(rows, transaction=transaction))

    return commit_offsets


def _unit(tid: str, topic: str, partition: int, txn: rules.Txn, sequence: int, *values: bytes) -> Produce:
    table = pa.table(
        {
            "key": pa.array([None] * len(values), pa.binary()),
            "value": pa.array(values, pa.binary()),
            "partition": pa.array([partition] * len(values), pa.int64()),
        }
    )
    return Produce(
        topic=topic,
        partition=partition,
        size=table.nbytes,
        decode=lambda: Decoded(table, transactional=TxnBatch(txn.producer_id, txn.producer_epoch, sequence)),
        transactional_id=tid,
    )


def _values(registry: TopicRegistry, topic: str) -> list[tuple[int, int, bytes]]:
    rows = DeltaTable(registry.storage.topic_uri(topic)).to_pyarrow_table().to_pylist()
    return sorted((r["partition"], r["offset"], r["value"]) for r in rows)


def _version_naming(uri: str, app_id: str, number: int) -> int:
    """The first version of a table whose Delta app transaction `app_id` reached `number`."""
    latest = DeltaTable(uri).version()
    return next(v for v in range(latest + 1) if DeltaTable(uri, version=v).transaction_version(app_id) == number)


async def _open_transaction(produce: ProduceService, coordinator: TransactionCoordinator) -> rules.Txn:
    txn = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)
    added = await coordinator.add_partitions(
        ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, [("a", 0), ("a", 1), ("b", 0)]
    )
    assert set(added.values()) == {None}
    units = [
        _unit("t1", "a", 0, txn, 0, b"a0", b"a1"),
        _unit("t1", "a", 1, txn, 0, b"a2"),
        _unit("t1", "b", 0, txn, 0, b"b0"),
        _unit("t1", "a", 0, txn, 2, b"a3"),
    ]
    await produce.produce(ANONYMOUS, units)
    for u in units:
        assert (await produce.acked(u)).base_offset == -1  # offsets are assigned at commit
    await coordinator.add_offsets(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, "g")
    await _stage_offset(coordinator, txn, 42)
    return txn


async def _committed_behind_a_gate(
    registry: TopicRegistry,
) -> tuple[asyncio.Event, ProduceService, TransactionCoordinator, rules.Txn]:
    """t1's first transaction (`_open_transaction`) committed as Kafka's EndTxn does (answered once
    decided), its landing held until the returned gate is set."""
    gate = asyncio.Event()
    produce, coordinator = _coordinator(registry, gate)
    await coordinator.start()
    txn = await _open_transaction(produce, coordinator)
    await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True, wait=False)
    return gate, produce, coordinator, txn


async def _stage_offset(
    coordinator: TransactionCoordinator, txn: rules.Txn, offset: int, *, implicit: bool = False
) -> None:
    """TxnOffsetCommit of t1's producer: group g's offset of b/1 (`implicit`: v5, adding the group)."""
    await coordinator.stage_offsets(
        ANONYMOUS,
        "t1",
        "g",
        txn.producer_id,
        txn.producer_epoch,
        [OffsetCommit(group="g", topic="b", partition=1, offset=offset)],
        implicit=implicit,
    )


async def _write_v2(
    produce: ProduceService, coordinator: TransactionCoordinator, unit: Produce, txn: rules.Txn, offset: int
) -> None:
    """Transaction version 2's writes, each adding to the transaction: `unit` (Produce v12) and
    group g's offset of b/1 (TxnOffsetCommit v5)."""
    unit.adds_to_transaction = True
    await produce.produce(ANONYMOUS, [unit])
    await produce.acked(unit)
    await _stage_offset(coordinator, txn, offset, implicit=True)


async def _resumed_by_a_successor(
    registry: TopicRegistry, coordinator: TransactionCoordinator, partitions: set[tuple[str, int]]
) -> tuple[ProduceService, TransactionCoordinator]:
    """`coordinator` stops with t1's first transaction open (never saved); the next coordinator
    finds it open, with `partitions` and group g."""
    assert TransactionStore(registry.storage).load("t1")["t1"].txn.state == rules.EMPTY  # not saved
    await coordinator.stop()
    produce, successor = _coordinator(registry)
    await successor.start()
    resumed = successor.state("t1")
    assert resumed.state == rules.ONGOING and resumed.number == 1
    assert resumed.partitions == partitions and resumed.groups == {"g"}
    return produce, successor


def test_a_producer_goes_on_while_a_full_batch_lands_and_waits_once_max_queued_are_behind(registry):
    """With its landings held, a version-2 producer decides MAX_QUEUED transactions (twice the
    batch that lands together) without waiting; its next write waits for a landing, and goes on
    once one has landed. All land, in order."""

    async def main() -> None:
        gate = asyncio.Event()
        produce, coordinator = _coordinator(registry, gate)
        await coordinator.start()
        current = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)

        def write(value: bytes) -> Produce:
            unit = _unit("t1", "a", 0, current, 0, value)
            unit.adds_to_transaction = True  # Produce v12
            return unit

        for n in range(MAX_QUEUED):
            unit = write(f"v{n}".encode())
            await produce.produce(ANONYMOUS, [unit])
            await asyncio.wait_for(produce.acked(unit), 30)  # never waits for a landing
            current = await coordinator.end_txn(
                ANONYMOUS, "t1", current.producer_id, current.producer_epoch, commit=True, bump=True, wait=False
            )
        beyond = write(b"beyond")

        async def written() -> None:
            await produce.produce(ANONYMOUS, [beyond])
            await produce.acked(beyond)

        waiting = asyncio.ensure_future(written())
        await asyncio.sleep(0.5)
        assert not waiting.done() and _values(registry, "a") == []
        gate.set()
        await asyncio.wait_for(waiting, 30)
        await coordinator.end_txn(
            ANONYMOUS, "t1", current.producer_id, current.producer_epoch, commit=True, bump=True, wait=True
        )
        assert [v for _, _, v in _values(registry, "a")] == [*(f"v{n}".encode() for n in range(MAX_QUEUED)), b"beyond"]
        await coordinator.stop()

    asyncio.run(main())


def _landed_batches(registry: TopicRegistry, topic: str, count: int, value: bytes) -> list[int]:
    """With its landings held, a version-2 producer decides `count` transactions of `value` into
    partition 0 of `topic`; once released, how many transactions each topic commit landed."""

    async def main() -> int:
        gate = asyncio.Event()
        produce, coordinator = _coordinator(registry, gate)
        await coordinator.start()
        current = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)
        for _ in range(count):
            unit = _unit("t1", topic, 0, current, 0, value)
            unit.adds_to_transaction = True  # Produce v12
            await produce.produce(ANONYMOUS, [unit])
            await produce.acked(unit)
            current = await coordinator.end_txn(
                ANONYMOUS, "t1", current.producer_id, current.producer_epoch, commit=True, bump=True, wait=False
            )
        gate.set()
        await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)  # answered once all have landed
        await coordinator.stop()
        return current.producer_id

    producer_id = asyncio.run(main())
    uri = registry.storage.topic_uri(topic)
    numbers = [
        DeltaTable(uri, version=v).transaction_version(f"p-t{producer_id}-0") or 0
        for v in range(DeltaTable(uri).version() + 1)
    ]
    landed = sorted(set(numbers))
    assert landed[-1] == count and len(_values(registry, topic)) == count
    return [b - a for a, b in itertools.pairwise(landed)]


def test_decisions_queued_behind_a_landing_land_together_up_to_max_landings(registry):
    """Decisions queued while a landing is held land together behind it: MAX_LANDINGS to a topic
    commit, at most."""
    batches = _landed_batches(registry, "a", MAX_LANDINGS + 3, b"v")
    assert max(batches) == MAX_LANDINGS and sum(batches) == MAX_LANDINGS + 3


def test_decisions_land_together_up_to_max_landing_bytes_of_staged_records(registry, monkeypatch):
    """A landing reads its transactions' records into memory at once, so decisions join one only
    up to MAX_LANDING_BYTES of staged records (the first whatever its size)."""
    monkeypatch.setattr(broker_transactions, "MAX_LANDING_BYTES", 25_000)  # two 10 KB transactions, not three
    batches = _landed_batches(registry, "b", 7, b"x" * 10_000)
    assert max(batches) == 2 and sum(batches) == 7


def test_a_commit_lands_each_topic_once_and_the_offsets_after(registry):
    async def main() -> None:
        produce, coordinator = _coordinator(registry)
        await coordinator.start()
        txn = await _open_transaction(produce, coordinator)
        assert _values(registry, "a") == [] and _values(registry, "b") == []
        assert await coordinator.unstable("g") == {("b", 1)}
        versions = {t: DeltaTable(registry.storage.topic_uri(t)).version() for t in ("a", "b")}
        await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True)
        assert _values(registry, "a") == [(0, 0, b"a0"), (0, 1, b"a1"), (0, 2, b"a3"), (1, 0, b"a2")]
        assert _values(registry, "b") == [(0, 0, b"b0")]
        for t, v in versions.items():  # one Delta commit per topic, all its partitions in it
            assert DeltaTable(registry.storage.topic_uri(t)).version() == v + 1
        registry.offsets.load()
        assert registry.offsets.committed("g")[("b", 1)].offset == 42
        assert await coordinator.unstable("g") == set()
        # time travel: the offsets commit and each topic's commit name the transaction (Delta app
        # transactions), so the input position that goes with an output version is found
        landed = _version_naming(registry.storage.system_uri("consumer_offsets"), f"t{txn.producer_id}", 1)
        rows = DeltaTable(registry.storage.system_uri("consumer_offsets"), version=landed).to_pyarrow_table()
        assert 42 in rows.column("offset").to_pylist()
        assert _version_naming(registry.storage.topic_uri("a"), f"p-t{txn.producer_id}-0", 1) == versions["a"] + 1
        assert coordinator.state("t1").state == rules.COMPLETE_COMMIT
        # a retried EndTxn is answered again and lands nothing twice
        await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True)
        assert len(_values(registry, "a")) == 4
        await coordinator.stop()

    asyncio.run(main())


def test_kafkas_end_txn_is_answered_once_decided_and_the_next_transaction_goes_on_while_it_lands(registry):
    """Kafka's EndTxn (wait=False) is answered once the decision is saved, and the records land
    behind the producer: its next transaction (version 2: the epoch EndTxn v5 gave, its Produce v12
    adding the partition itself) begins, stages and is decided while the first is still landing;
    both land in order, together, under the last one's number. Every save of the id carries the
    decisions not landed yet. A retried EndTxn (the epoch before the bump) is answered from the
    saved decision; a new producer of the id (InitProducerId) waits for them all."""

    async def main() -> None:
        gate = asyncio.Event()
        produce, coordinator = _coordinator(registry, gate)
        await coordinator.start()
        txn = await _open_transaction(produce, coordinator)
        decided = await coordinator.end_txn(
            ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True, bump=True, wait=False
        )
        assert decided.state == rules.PREPARE_COMMIT and decided.producer_epoch == txn.producer_epoch + 1
        nxt = _unit("t1", "b", 1, decided, 0, b"next")
        nxt.adds_to_transaction = True  # Produce v12
        await produce.produce(ANONYMOUS, [nxt])
        assert (await produce.acked(nxt)).base_offset == -1
        assert coordinator.state("t1").state == rules.ONGOING
        assert _values(registry, "a") == [] and _values(registry, "b") == []  # the first is still landing
        # begun by its write, the second transaction is not saved (its staged file records it): the
        # id's row is still the first one's decision
        saved = TransactionStore(registry.storage).load("t1")["t1"]
        assert saved.txn.state == rules.PREPARE_COMMIT and saved.txn.number == 1
        second = await coordinator.end_txn(
            ANONYMOUS, "t1", decided.producer_id, decided.producer_epoch, commit=True, bump=True, wait=False
        )
        assert second.producer_epoch == decided.producer_epoch + 1
        third = _unit("t1", "b", 0, second, 0, b"third")
        third.adds_to_transaction = True
        await produce.produce(ANONYMOUS, [third])
        await produce.acked(third)
        last = await coordinator.end_txn(
            ANONYMOUS, "t1", second.producer_id, second.producer_epoch, commit=True, bump=True, wait=False
        )
        saved = TransactionStore(registry.storage).load("t1")["t1"]
        assert saved.txn.state == rules.PREPARE_COMMIT and len(saved.decision["earlier"]) == 2
        # a retried EndTxn is answered from the saved decision, landed or not
        again = await coordinator.end_txn(
            ANONYMOUS, "t1", second.producer_id, second.producer_epoch, commit=True, bump=True, wait=False
        )
        assert again.producer_epoch == last.producer_epoch
        assert _values(registry, "a") == [] and _values(registry, "b") == []
        versions = {t: DeltaTable(registry.storage.topic_uri(t)).version() for t in ("a", "b")}
        gate.set()
        await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)  # a new producer: once all landed
        assert len(_values(registry, "a")) == 4
        assert _values(registry, "b") == [(0, 0, b"b0"), (0, 1, b"third"), (1, 0, b"next")]
        # the first lands alone (it was landing when the others were decided), the next two together
        assert DeltaTable(registry.storage.topic_uri("a")).version() == versions["a"] + 1
        assert DeltaTable(registry.storage.topic_uri("b")).version() == versions["b"] + 2
        assert _version_naming(registry.storage.topic_uri("b"), f"p-t{txn.producer_id}-1", 3) == versions["b"] + 2
        registry.offsets.load()
        assert registry.offsets.committed("g")[("b", 1)].offset == 42
        with pytest.raises(ProducerFencedError):  # the first epoch's transactions are over
            await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True, bump=True)
        await coordinator.stop()

    asyncio.run(main())


async def _commit_to_b0(
    produce: ProduceService, coordinator: TransactionCoordinator, txn: rules.Txn, value: bytes, *, wait: bool = False
) -> rules.Txn:
    """A transaction of version 2 of the id t1 writing `value` to b/0, committed (`wait`: until it
    landed); the id's state after it (its next producer epoch)."""
    unit = _unit("t1", "b", 0, txn, 0, value)
    unit.adds_to_transaction = True
    await produce.produce(ANONYMOUS, [unit])
    await produce.acked(unit)
    return await coordinator.end_txn(
        ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True, bump=True, wait=wait
    )


def test_under_load_decisions_land_together_after_a_gap_that_a_waiting_request_cuts_short(registry):
    """After a landing, an id's next one waits a gap (3x as long as that landing took, at most
    transactions.max_landing_gap_ms): the decisions taken meanwhile land together, one Delta
    commit a topic. A request that waits for its landing (HTTP's commit) does not wait the gap,
    and a decision taken after it lands at once."""

    async def main() -> None:
        produce = ProduceService(registry)
        landed: asyncio.Queue[float] = asyncio.Queue()

        async def land(topic: str, request: AppendRequest) -> AppendResult:
            await asyncio.sleep(0.2)  # a landing that takes 0.2 s: a gap of 0.6 s after it
            result = await produce.append(topic, request)
            landed.put_nowait(loop.time())
            return result

        loop = asyncio.get_running_loop()
        coordinator = TransactionCoordinator(
            registry, TransactionSettings(max_landing_gap_ms=600), land=land, commit_offsets=_offsets_writer(registry)
        )
        produce.transactions = coordinator
        await coordinator.start()
        txn = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)

        async def commit(value: bytes, *, wait: bool = False) -> None:
            nonlocal txn
            txn = await _commit_to_b0(produce, coordinator, txn, value, wait=wait)

        def values() -> list[bytes]:
            return [v for _, _, v in _values(registry, "b")]

        await commit(b"1")
        first = await asyncio.wait_for(landed.get(), 10)  # no landing before it: at once
        version = DeltaTable(registry.storage.topic_uri("b")).version()
        await commit(b"2")
        await commit(b"3")
        assert values() == [b"1"]  # in the gap
        together = await asyncio.wait_for(landed.get(), 10)
        assert together - first >= 0.5 and landed.empty()
        assert values() == [b"1", b"2", b"3"]
        assert DeltaTable(registry.storage.topic_uri("b")).version() == version + 1  # one commit for both
        began = loop.time()
        await commit(b"4", wait=True)  # right after a landing: the gap is cut short for it
        assert loop.time() - began < 0.6 and values() == [b"1", b"2", b"3", b"4"]
        await asyncio.wait_for(landed.get(), 1)
        await asyncio.sleep(0.7)  # idle past the gap
        began = loop.time()
        await commit(b"5")
        assert await asyncio.wait_for(landed.get(), 10) - began < 0.5
        await coordinator.stop()

    asyncio.run(main())


def test_a_busy_id_lands_a_few_at_a_time_until_a_consumer_waits_for_its_topic(registry):
    """While no consumer waits for new records of its topics, an id's next landing waits
    transactions.unwatched_landing_gap_ms after its last; a consumer that begins to wait on one
    of them cuts that to the shorter gap (transactions.max_landing_gap_ms), which a decision taken
    while one waits gets from the start."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        produce = ProduceService(registry)
        notifier = CommitNotifier(loop)
        landed: asyncio.Queue[float] = asyncio.Queue()

        async def land(topic: str, request: AppendRequest) -> AppendResult:
            result = await produce.append(topic, request)
            landed.put_nowait(loop.time())
            return result

        settings = TransactionSettings(max_landing_gap_ms=50, unwatched_landing_gap_ms=3000)
        coordinator = TransactionCoordinator(registry, settings, land=land, commit_offsets=_offsets_writer(registry))
        coordinator.watched = notifier.watched  # as broker.services wires them
        notifier.wait_listeners.append(coordinator.reader_waits)
        produce.transactions = coordinator
        await coordinator.start()
        txn = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)

        async def commit(value: bytes) -> float:
            """Committed; when it was decided."""
            nonlocal txn
            txn = await _commit_to_b0(produce, coordinator, txn, value)
            return loop.time()

        def values() -> list[bytes]:
            return [v for _, _, v in _values(registry, "b")]

        await commit(b"1")
        await asyncio.wait_for(landed.get(), 10)  # no landing before it: at once
        await commit(b"2")
        await asyncio.sleep(0.6)
        assert values() == [b"1"]  # no consumer waits: the long gap, well past the short one
        consumer = asyncio.ensure_future(notifier.wait("b", 0, 30))  # a fetch at b/0's end
        began = loop.time()
        assert await asyncio.wait_for(landed.get(), 2) - began < 1.0
        assert values() == [b"1", b"2"]
        decided = await commit(b"3")  # the consumer still waits (nothing here wakes it)
        assert await asyncio.wait_for(landed.get(), 2) - decided < 1.0
        assert values() == [b"1", b"2", b"3"]
        consumer.cancel()
        await coordinator.stop()

    asyncio.run(main())


def test_a_producer_whose_epoch_stays_stages_its_next_transaction_apart_while_the_last_lands(registry):
    """Transaction version 1 (librdkafka; HTTP alike): the epoch stays across transactions, so a
    decided transaction's staging is sealed (set apart under its number) and the next one, under
    the same epoch, is added to and written while the first lands; each lands with its own records."""

    async def main() -> None:
        gate, produce, coordinator, txn = await _committed_behind_a_gate(registry)
        added = await coordinator.add_partitions(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, [("b", 1)])
        assert set(added.values()) == {None}
        nxt = _unit("t1", "b", 1, txn, 3, b"next")
        await produce.produce(ANONYMOUS, [nxt])
        assert (await produce.acked(nxt)).base_offset == -1
        staging = TransactionStaging(registry.storage)
        first = staging.staged("t1", txn.producer_id, txn.producer_epoch, sealed=1)
        assert len(first.records) == 4 and len(first.offsets) == 1
        assert [r.topic for r in staging.staged("t1", txn.producer_id, txn.producer_epoch).records] == ["b"]
        assert _values(registry, "b") == []
        gate.set()
        await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True)
        assert len(_values(registry, "a")) == 4
        assert _values(registry, "b") == [(0, 0, b"b0"), (1, 0, b"next")]
        assert coordinator.state("t1").state == rules.COMPLETE_COMMIT
        await coordinator.stop()

    asyncio.run(main())


def test_sealing_again_moves_in_what_was_staged_since(registry):
    """A decision taken again after a crash between sealing and saving it seals again: what was
    staged since is moved into the sealed staging, nothing is lost or left behind."""
    staging = TransactionStaging(registry.storage)
    rows = pa.table({"value": pa.array([b"x"], pa.binary())})
    staging.write_records("t9", 7, 0, "a", 0, 0, rows)
    assert staging.seal("t9", 7, 0, 5) == 5
    staging.write_records("t9", 7, 0, "a", 1, 0, rows)
    assert staging.seal("t9", 7, 0, 5) == 5
    assert [(r.topic, r.partition) for r in staging.staged("t9", 7, 0, sealed=5).records] == [("a", 0), ("a", 1)]
    assert staging.staged("t9", 7, 0).records == ()


def test_a_producers_staging_is_one_directory_whose_file_names_carry_topics_and_groups(registry):
    """Staged files sit in one directory a producer (each transaction makes and deletes its own,
    and on local disk a directory costs what a file does), their names carrying topic, partition,
    sequence and group, dots and slashes included; staging in the nested directories earlier
    versions wrote is read as well, so an upgrade lands what they staged."""
    staging = TransactionStaging(registry.storage)
    rows = pa.table({"value": pa.array([b"x"], pa.binary())})
    staging.write_records("t9", 7, 0, "x.y", 1, 5, rows)
    staging.write_records("t9", 7, 0, "x.y", 0, 9, rows, lane="producer-1")
    staging.write_records("t9", 7, 0, "a", 0, 2, rows)
    staging.stage_offsets("t9", 7, 0, "g.1/2", [{"topic": "a", "partition": 0, "offset": 3}])
    staging.stage_offsets("t9", 7, 0, "g.1/2", [{"topic": "a", "partition": 0, "offset": 4}])
    staging.record_added("t9", 7, 0, [("a", 1)], ["g.1/2"])
    root = os.path.join(staging.base, staging.name("t9", 7, 0))
    assert all(os.path.isfile(os.path.join(root, name)) for name in os.listdir(root))
    found = staging.staged("t9", 7, 0)
    assert [(r.topic, r.partition, r.base_sequence) for r in found.records] == [
        ("a", 0, 2),
        ("x.y", 0, 9),
        ("x.y", 1, 5),
    ]
    assert staging.read_records("t9", 7, 0, found.records) == [rows] * 3
    assert [o["offset"] for o in staging.read_offsets("t9", 7, 0, found.offsets)] == [3, 4]
    assert {o.group for o in found.offsets} == {"g.1/2"}
    assert staging.read_added("t9", 7, 0, found) == ([("a", 1)], ["g.1/2"])

    old = os.path.join(staging.base, staging.name("t9", 8, 0))  # as earlier versions staged
    os.makedirs(os.path.join(old, "records", "x.y", "1"))
    path = os.path.join(old, "records", "x.y", "1", "0000000003.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    os.makedirs(os.path.join(old, "offsets", "g.1%2F2"))
    with open(os.path.join(old, "offsets", "g.1%2F2", f"{1:020d}-abcdef12.json"), "w") as f:
        f.write('[{"topic": "a", "partition": 1, "offset": 7}]')
    found = staging.staged("t9", 8, 0)
    assert [(r.topic, r.partition, r.base_sequence) for r in found.records] == [("x.y", 1, 3)]
    assert staging.read_records("t9", 8, 0, found.records) == [rows]
    assert staging.read_offsets("t9", 8, 0, found.offsets) == [
        {"group": "g.1/2", "topic": "a", "partition": 1, "offset": 7}
    ]
    # a retry of that request, unacked before an upgrade, staged again flat: one file, not two
    staging.write_records("t9", 8, 0, "x.y", 1, 3, rows)
    found = staging.staged("t9", 8, 0)
    assert [(r.topic, r.base_sequence, "/" in r.path) for r in found.records] == [("x.y", 3, False)]

    long_topic, long_group = "t." * 110 + "z", "g" * 200  # a flat name past 200 bytes: directories
    staging.write_records("t9", 9, 0, long_topic, 0, 1, rows)
    staging.stage_offsets("t9", 9, 0, long_group, [{"topic": long_topic, "partition": 0, "offset": 1}])
    found = staging.staged("t9", 9, 0)
    assert [(r.topic, r.partition, r.base_sequence) for r in found.records] == [(long_topic, 0, 1)]
    assert staging.read_records("t9", 9, 0, found.records) == [rows]
    assert [o["group"] for o in staging.read_offsets("t9", 9, 0, found.offsets)] == [long_group]


def test_a_roll_forward_that_fails_at_takeover_is_retried_and_the_next_producer_waits_for_it(registry):
    """The gateway taking an id over cannot land its decision at first (storage trouble): the
    landing is retried, and a new producer of the id (InitProducerId) is answered once it landed,
    with every record in the tables once."""

    async def main() -> None:
        produce, coordinator = _coordinator(registry, asyncio.Event())  # landings never run
        await coordinator.start()
        txn = await _open_transaction(produce, coordinator)
        await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True, wait=False)
        await coordinator.stop()
        failures = [StorageUnavailableError("the disk is away")]
        successor_produce = ProduceService(registry)

        async def land(topic: str, request: AppendRequest) -> AppendResult:
            if failures:
                raise failures.pop()
            return await successor_produce.append(topic, request)

        successor = TransactionCoordinator(
            registry, TransactionSettings(), land=land, commit_offsets=_offsets_writer(registry)
        )
        await successor.start()  # its roll-forward fails once: logged, and retried
        assert successor.state("t1").state == rules.PREPARE_COMMIT
        newer = await successor.init_producer_id(ANONYMOUS, "t1", 60_000)
        assert newer.producer_epoch == txn.producer_epoch + 1 and not failures
        assert len(_values(registry, "a")) == 4 and _values(registry, "b") == [(0, 0, b"b0")]
        await successor.stop()

    asyncio.run(main())


def test_offsets_staged_at_the_groups_gateway_are_unstable_until_the_ids_coordinator_lands_them(registry):
    """On a cluster TxnOffsetCommit reaches the group's coordinator, which may not coordinate the
    transactional id: its OffsetFetch (require_stable) answers UNSTABLE_OFFSET_COMMIT for the
    staged partitions until the id's coordinator, another gateway, has landed them, and no longer."""

    async def main() -> None:
        produce, coordinator = _coordinator(registry)
        await coordinator.start()
        txn = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)
        await coordinator.add_offsets(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, "g")
        groups_gateway = TransactionCoordinator(
            registry, TransactionSettings(), land=produce.append, commit_offsets=_no_offsets, owns=lambda tid: False
        )
        commit = OffsetCommit(group="g", topic="b", partition=1, offset=7)
        await groups_gateway.stage_offsets(ANONYMOUS, "t1", "g", txn.producer_id, txn.producer_epoch, [commit])
        assert await groups_gateway.unstable("g") == {("b", 1)}
        await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True)
        registry.offsets.load()
        assert registry.offsets.committed("g")[("b", 1)].offset == 7
        assert await groups_gateway.unstable("g") == set()
        await coordinator.stop()

    asyncio.run(main())


async def _no_offsets(commits: Mapping[str, list[OffsetCommit]], transaction: tuple[str, int]) -> None:
    raise AssertionError("a gateway that does not coordinate the id lands nothing")


def test_decisions_saved_behind_a_producer_are_carried_out_by_the_next_coordinator(registry):
    """A coordinator stops (its process dies) with two decided transactions not landed, the second
    saved with the first as an earlier decision: the gateway that takes the id over lands both,
    each once, in order, and the group's offsets are the second's."""

    async def main() -> None:
        produce, coordinator = _coordinator(registry, asyncio.Event())  # landings never run
        await coordinator.start()
        txn = await _open_transaction(produce, coordinator)
        decided = await coordinator.end_txn(
            ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True, bump=True, wait=False
        )
        await _write_v2(produce, coordinator, _unit("t1", "b", 0, decided, 0, b"next"), decided, 43)
        await coordinator.end_txn(
            ANONYMOUS, "t1", decided.producer_id, decided.producer_epoch, commit=True, bump=True, wait=False
        )
        await coordinator.stop()
        _, successor = _coordinator(registry)
        await successor.start()
        assert successor.state("t1").state == rules.COMPLETE_COMMIT
        assert len(_values(registry, "a")) == 4
        assert _values(registry, "b") == [(0, 0, b"b0"), (0, 1, b"next")]
        registry.offsets.load()
        assert registry.offsets.committed("g")[("b", 1)].offset == 43
        await successor.stop()

    asyncio.run(main())


def test_a_transaction_begun_by_writes_is_not_saved_and_the_next_coordinator_resumes_it_from_its_staging(
    registry,
):
    """A transaction of version 2 begun by its writes (Produce v12, TxnOffsetCommit v5) is not
    saved: its staged files are its durable record. A coordinator that dies with it open leaves a
    successor that finds it in the staging, open, with its partitions and groups, so its producer
    goes on and commits it whole; one whose producer died too is aborted at its timeout, counted
    from its first staged write."""

    async def main() -> None:
        produce, coordinator = _coordinator(registry)
        await coordinator.start()
        txn = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)
        await _write_v2(produce, coordinator, _unit("t1", "a", 0, txn, 0, b"one"), txn, 7)
        assert coordinator.state("t1").state == rules.ONGOING
        produce, successor = await _resumed_by_a_successor(registry, coordinator, {("a", 0)})
        second = _unit("t1", "b", 0, txn, 0, b"two")
        second.adds_to_transaction = True
        await produce.produce(ANONYMOUS, [second])
        await produce.acked(second)
        await successor.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True, bump=True)
        assert _values(registry, "a") == [(0, 0, b"one")] and _values(registry, "b") == [(0, 0, b"two")]
        registry.offsets.load()
        assert registry.offsets.committed("g")[("b", 1)].offset == 7
        await successor.stop()

        # the producer dies too: its transaction is aborted at its timeout
        produce, coordinator = _coordinator(registry)
        await coordinator.start()
        txn = await coordinator.init_producer_id(ANONYMOUS, "t1", 1_000)
        lost = _unit("t1", "a", 1, txn, 0, b"lost")
        lost.adds_to_transaction = True
        await produce.produce(ANONYMOUS, [lost])
        await produce.acked(lost)
        await coordinator.stop()
        _, successor = _coordinator(registry)
        await successor.start()
        assert successor.state("t1").state == rules.ONGOING
        for _ in range(100):  # woken by the timer
            if successor.state("t1").state == rules.COMPLETE_ABORT:
                break
            await asyncio.sleep(0.05)
        assert successor.state("t1").state == rules.COMPLETE_ABORT
        assert _values(registry, "a") == [(0, 0, b"one")]
        staging = TransactionStaging(registry.storage)
        assert staging.staged("t1", txn.producer_id, txn.producer_epoch).records == ()
        await successor.stop()

    asyncio.run(main())


def test_what_add_partitions_and_add_offsets_added_survives_a_takeover_without_a_save(registry):
    """Version 1's AddPartitionsToTxn and AddOffsetsToTxn are kept in the producer's staging, not
    saved to the state table: a successor finds the transaction open with every partition and group
    added (none written yet), so the producer's writes to them pass KIP-890's check there and its
    commit lands them; a partition never added is still refused."""

    async def main() -> None:
        _, coordinator = _coordinator(registry)
        await coordinator.start()
        txn = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)
        await coordinator.add_partitions(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, [("a", 0), ("b", 1)])
        await coordinator.add_offsets(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, "g")
        produce, successor = await _resumed_by_a_successor(registry, coordinator, {("a", 0), ("b", 1)})
        units = [_unit("t1", "a", 0, txn, 0, b"x"), _unit("t1", "b", 1, txn, 0, b"y")]
        await produce.produce(ANONYMOUS, units)
        for u in units:
            await produce.acked(u)
        outside = _unit("t1", "a", 1, txn, 0, b"not added")
        await produce.produce(ANONYMOUS, [outside])
        with pytest.raises(InvalidTxnStateError):
            await produce.acked(outside)
        await successor.stage_offsets(
            ANONYMOUS,
            "t1",
            "g",
            txn.producer_id,
            txn.producer_epoch,
            [OffsetCommit(group="g", topic="b", partition=0, offset=3)],
        )
        await successor.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True)
        assert _values(registry, "a") == [(0, 0, b"x")] and _values(registry, "b") == [(1, 0, b"y")]
        registry.offsets.load()
        assert registry.offsets.committed("g")[("b", 0)].offset == 3
        await successor.stop()

    asyncio.run(main())


def test_a_committed_transaction_whose_topic_was_deleted_before_it_landed_lands_the_rest(registry):
    """A topic deleted between a commit's decision and its landing (its records would have gone
    with the topic): the landing lands the other topics' records and the offsets, and the id goes
    on, where retrying the deleted topic would hold the producer's next transactions forever."""

    async def main() -> None:
        gate, _, coordinator, _ = await _committed_behind_a_gate(registry)
        await asyncio.to_thread(registry.delete_topic, "a")
        gate.set()
        await asyncio.wait_for(coordinator.init_producer_id(ANONYMOUS, "t1", 60_000), 30)  # once it landed
        assert _values(registry, "b") == [(0, 0, b"b0")]
        registry.offsets.load()
        assert registry.offsets.committed("g")[("b", 1)].offset == 42
        await coordinator.stop()

    asyncio.run(main())


def test_an_abort_and_a_fenced_producer_leave_nothing_in_any_table(registry):
    async def main() -> None:
        produce, coordinator = _coordinator(registry)
        await coordinator.start()
        txn = await _open_transaction(produce, coordinator)
        await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=False)
        txn = await _open_transaction(produce, coordinator)
        newer = await coordinator.init_producer_id(ANONYMOUS, "t1", 60_000)  # a new producer of the id
        assert newer.producer_epoch == txn.producer_epoch + 2  # one bump fenced and aborted, one is its own
        with pytest.raises(ProducerFencedError):
            await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True)
        stale = _unit("t1", "a", 0, txn, 3, b"zombie")
        await produce.produce(ANONYMOUS, [stale])
        with pytest.raises(ProducerFencedError):
            await produce.acked(stale)
        outside = _unit("t1", "b", 1, newer, 0, b"not added")
        await produce.produce(ANONYMOUS, [outside])
        with pytest.raises(InvalidTxnStateError):  # KIP-890: a partition not in the transaction
            await produce.acked(outside)
        assert _values(registry, "a") == [] and _values(registry, "b") == []
        registry.offsets.load()
        assert registry.offsets.committed("g") == {}
        await coordinator.stop()

    asyncio.run(main())


def test_a_decision_left_half_done_by_a_crash_is_finished_once_by_the_next_coordinator(registry, tmp_path):
    """The coordinator dies after saving PrepareCommit (before landing), then again after landing
    (before dropping the staging and saving CompleteCommit): each next coordinator rolls the
    decision forward, and the records are in the tables exactly once."""

    async def main() -> None:
        produce, coordinator = _coordinator(registry)
        await coordinator.start()
        txn = await _open_transaction(produce, coordinator)
        store, staging = TransactionStore(registry.storage), TransactionStaging(registry.storage)
        # the decision as EndTxn saves it, and then the process is gone
        ending = rules.end(coordinator.state("t1"), "t1", txn.producer_id, txn.producer_epoch, commit=True, now_ms=0)
        staged = staging.staged("t1", txn.producer_id, txn.producer_epoch)
        decision = {
            "producer_id": txn.producer_id,
            "staged_epoch": txn.producer_epoch,
            "records": [[s.topic, s.partition, s.base_sequence, s.path] for s in staged.records],
            "offsets": [[o.group, o.path] for o in staged.offsets],
        }
        store.save(ending.txn, store.coordinator_epoch("t1"), decision)
        kept = tmp_path / "staged"
        shutil.copytree(staging._dir("t1", txn.producer_id, txn.producer_epoch), kept)
        await coordinator.stop()

        _, restarted = _coordinator(registry)
        await restarted.start()  # finds PrepareCommit: lands, commits offsets, completes
        assert restarted.state("t1").state == rules.COMPLETE_COMMIT
        landed = _values(registry, "a") + _values(registry, "b")
        assert len(landed) == 5
        await restarted.stop()

        # the second crash: everything landed, but the staging and CompleteCommit were not saved
        shutil.copytree(kept, staging._dir("t1", txn.producer_id, txn.producer_epoch))
        store.save(ending.txn, store.coordinator_epoch("t1"), decision)
        _, again = _coordinator(registry)
        await again.start()
        assert again.state("t1").state == rules.COMPLETE_COMMIT
        assert _values(registry, "a") + _values(registry, "b") == landed  # not twice
        assert staging.staged("t1", txn.producer_id, txn.producer_epoch).records == ()
        await again.stop()

    asyncio.run(main())


def test_an_open_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(registry):
    async def main() -> None:
        produce, coordinator = _coordinator(registry)
        await coordinator.start()
        txn = await coordinator.init_producer_id(ANONYMOUS, "t1", 1_000)
        await coordinator.add_partitions(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, [("a", 0)])
        unit = _unit("t1", "a", 0, txn, 0, b"late")
        await produce.produce(ANONYMOUS, [unit])
        await produce.acked(unit)
        for _ in range(100):  # woken by the timer, not a poll of ours
            if coordinator.state("t1").state == rules.COMPLETE_ABORT:
                break
            await asyncio.sleep(0.05)
        assert coordinator.state("t1").state == rules.COMPLETE_ABORT
        with pytest.raises(ProducerFencedError):
            await coordinator.end_txn(ANONYMOUS, "t1", txn.producer_id, txn.producer_epoch, commit=True)
        assert _values(registry, "a") == []
        await coordinator.stop()

    asyncio.run(main())


def test_a_key_needs_write_on_the_transactional_id(registry):
    async def main() -> None:
        _, coordinator = _coordinator(registry)
        key = principal_of("k", {"a": ["produce"]}, None, {"app-*": ["write"]})
        assert (await coordinator.init_producer_id(key, "app-1", 60_000)).producer_epoch == 0
        with pytest.raises(TransactionalIdAuthorizationError):
            await coordinator.init_producer_id(key, "other", 60_000)
        legacy = principal_of("old", {"a": ["produce"]}, None)  # a key file without transactional_ids
        assert legacy.allows_transactional_id("write", "anything")
        reader = principal_of("r", {"a": ["consume"]}, None)
        with pytest.raises(TransactionalIdAuthorizationError):
            await coordinator.init_producer_id(reader, "app-1", 60_000)

    asyncio.run(main())


def test_the_state_table_compacts_to_a_row_per_id_and_forgets_idle_ids(registry):
    store = TransactionStore(registry.storage)
    epochs = {tid: store.claim(tid) for tid in ("busy", "idle", "open")}
    idle = rules.Txn(transactional_id="idle", producer_id=1, producer_epoch=0, timeout_ms=1000, updated_ms=10)
    store.save(idle, epochs["idle"])
    opened = rules.Txn(
        transactional_id="open", producer_id=2, producer_epoch=0, timeout_ms=1000, state=rules.ONGOING, updated_ms=10
    )
    store.save(opened, epochs["open"])
    for epoch in range(5):
        busy = rules.Txn(
            transactional_id="busy", producer_id=3, producer_epoch=epoch, timeout_ms=1000, updated_ms=10**9
        )
        store.save(busy, epochs["busy"])
    before = store.load()
    assert not store.compact(min_rows=100)  # not enough rows saved since the last rewrite
    assert store.compact(min_rows=7, expire_before_ms=10**6)
    after = store.load()
    assert set(after) == {"busy", "open"}  # the idle id is forgotten; an open transaction never is
    assert after["busy"] == before["busy"] and after["open"] == before["open"]
    assert len(store.storage.read_system_table(store._dt, SCHEMA)) == 2
    store.save(dataclasses_replace(busy, producer_epoch=9), epochs["busy"])  # the epochs still fence
    assert store.load()["busy"].txn.producer_epoch == 9


def test_a_compaction_cleans_the_state_tables_log_and_a_store_left_behind_still_saves(registry, monkeypatch):
    """The rewrite deletes log entries but the newest SYSTEM_LOG_KEEP_VERSIONS (and those younger
    than SYSTEM_LOG_MIN_AGE_S), as a busy id writes a version a save, and the files it replaced
    once as old. A store whose version was
    cleaned from under it (another gateway's, idle meanwhile) reads the table again and saves;
    a new one loads every id from the checkpoint and the entries left."""
    from delta_log.table import storage as storage_module

    monkeypatch.setattr(storage_module, "SYSTEM_LOG_KEEP_VERSIONS", 10)
    monkeypatch.setattr(storage_module, "SYSTEM_LOG_MIN_AGE_S", 0.0)
    busy, behind = TransactionStore(registry.storage), TransactionStore(registry.storage)
    epochs = {tid: busy.claim(tid) for tid in ("a", "b")}
    behind.save(rules.Txn(transactional_id="b", producer_id=2, producer_epoch=0, timeout_ms=1000), epochs["b"])
    for epoch in range(40):
        busy.save(rules.Txn(transactional_id="a", producer_id=1, producer_epoch=epoch, timeout_ms=1000), epochs["a"])
    log_dir = os.path.join(registry.storage.fs_path(registry.storage.system_uri(TABLE)), "_delta_log")
    entries = lambda: sorted(f for f in os.listdir(log_dir) if f.endswith(".json"))  # noqa: E731
    assert busy.compact(min_rows=1)  # checkpointed at its rewrite; the ten versions before it need the log
    assert len(entries()) > 40
    for epoch in range(40, 55):
        busy.save(rules.Txn(transactional_id="a", producer_id=1, producer_epoch=epoch, timeout_ms=1000), epochs["a"])
    assert busy.compact(min_rows=1)  # now they start from that checkpoint
    assert len(entries()) < 20 and not os.path.exists(os.path.join(log_dir, f"{1:020d}.json"))
    table_dir = os.path.dirname(log_dir)  # the files the rewrites replaced are gone: only the live one is left
    assert [f for f in os.listdir(table_dir) if f.endswith(".parquet")] == [
        os.path.basename(u) for u in DeltaTable(registry.storage.system_uri(TABLE)).file_uris()
    ]
    config = DeltaTable(registry.storage.system_uri(TABLE)).metadata().configuration
    assert config["delta.deletedFileRetentionDuration"] == "interval 10 seconds"  # tombstones: seconds, not a week
    behind.save(rules.Txn(transactional_id="b", producer_id=2, producer_epoch=1, timeout_ms=1000), epochs["b"])
    busy.save(rules.Txn(transactional_id="a", producer_id=1, producer_epoch=55, timeout_ms=1000), epochs["a"])
    loaded = TransactionStore(registry.storage).load()
    assert (loaded["a"].txn.producer_epoch, loaded["b"].txn.producer_epoch) == (55, 1)


def test_saves_go_on_while_a_compaction_writes_and_none_is_lost(registry):
    """A compaction reads the rows and writes their file without the store's lock (on local disk,
    once the table has its system properties), so a save does not wait for it; it then commits
    the file in place of those it read, and the rows saved meanwhile, in files of their own, stay."""
    store = TransactionStore(registry.storage)
    epochs = {tid: store.claim(tid) for tid in ("a", "b", "c")}

    def save(tid: str, epoch: int) -> None:
        store.save(rules.Txn(transactional_id=tid, producer_id=1, producer_epoch=epoch, timeout_ms=1000), epochs[tid])

    for tid in epochs:
        save(tid, 0)
    assert store.compact(min_rows=1)  # the first: through delta-rs, which sets the table's properties
    for epoch in (1, 2):
        save("a", epoch)
    own = store._own
    assert own is not None
    write_file, saved_meanwhile = own.write_file, threading.Event()

    def write_file_while_saving(*args, **kwargs):
        own.write_file = write_file  # type: ignore[method-assign]  # (the saves below write files too)
        saver = threading.Thread(target=lambda: (save("b", 5), save("c", 7), saved_meanwhile.set()))
        saver.start()
        saver.join(timeout=30)  # the lock held here would keep the saves waiting: the test fails
        return write_file(*args, **kwargs)

    own.write_file = write_file_while_saving  # type: ignore[method-assign]
    try:
        assert store.compact(min_rows=1)
    finally:
        own.write_file = write_file  # type: ignore[method-assign]
    assert saved_meanwhile.is_set()
    for loaded in (store.load(), TransactionStore(registry.storage).load()):
        assert {tid: s.txn.producer_epoch for tid, s in loaded.items()} == {"a": 2, "b": 5, "c": 7}
    # the rewritten file plus the two saved during the rewrite: nothing else is live
    assert len(DeltaTable(registry.storage.system_uri(TABLE)).file_uris()) == 3
    assert store.compact(min_rows=1)
    assert len(DeltaTable(registry.storage.system_uri(TABLE)).file_uris()) == 1
    assert {tid: s.txn.producer_epoch for tid, s in store.load().items()} == {"a": 2, "b": 5, "c": 7}
    assert store.load("b")["b"].txn.producer_epoch == 5  # the rewritten file's statistics name its ids


def test_loading_one_id_reads_the_files_that_may_hold_it_and_no_other(registry):
    """A gateway taking an id over (InitProducerId, a failover) reads that id's saved rows, not
    every id's saved since the last compaction (up to 256 files, 0.3-0.6 s before): each saved
    row's file carries its id as Delta statistics (minValues, maxValues), and a rewritten file
    the statistics delta-rs wrote, which cut values to 64 characters."""
    store = TransactionStore(registry.storage)
    long_id = "x" * 40 + "y" * 200  # longer than delta-rs keeps in its statistics
    ids = [long_id, *(f"id-{i}" for i in range(6))]
    epochs = {tid: store.claim(tid) for tid in [*ids, "zz"]}

    def save(tid: str, producer_id: int, epoch: int = 0) -> None:
        txn = rules.Txn(transactional_id=tid, producer_id=producer_id, producer_epoch=epoch, timeout_ms=1000)
        store.save(txn, epochs[tid])

    for n, tid in enumerate(ids):
        save(tid, n)
    uri = registry.storage.system_uri(TABLE)
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    assert sorted(actions.column("min.transactional_id").to_pylist()) == sorted(ids)
    assert actions.column("max.transactional_id").to_pylist() == actions.column("min.transactional_id").to_pylist()
    assert store.compact(min_rows=1)  # one file for them all, with delta-rs's statistics
    save("id-3", 3, epoch=1)
    save("zz", 99)  # past every id the rewritten file holds
    assert store.load(long_id)[long_id].txn.producer_id == 0  # found in the rewritten file
    assert store.load("id-3")["id-3"].txn.producer_epoch == 1
    # what it reads: with every other file gone, zz still loads, and all ids do not
    for path in DeltaTable(uri).file_uris():
        if pq.read_table(path).column("transactional_id").to_pylist() != ["zz"]:
            os.unlink(path)
    assert store.load("zz")["zz"].txn.producer_id == 99
    with pytest.raises(StorageUnavailableError):
        store.load()
