"""The rebalance job against real group state: lag-aware plans, the server adopting them, races."""

import asyncio

from broker.coordinator import GroupCoordinator
from delta_log import TopicWriter
from delta_log.registry import TopicRegistry
from delta_log.system.groups import REBALANCE_JOB, GroupStore
from delta_log.system.offsets import OffsetCommit
from jobs import rebalance
from tests.integration.conftest import make_batch


async def join_both(coord, topic, ids=(None, None)):
    """Two members in one generation, as clients get there: when the second joins, the first learns
    of the rebalance from its heartbeat and rejoins (without this, whichever join completes first
    may form a generation alone)."""
    if ids == (None, None):
        first = await coord.join("g", topics=[topic], session_timeout_ms=10_000)
        second = asyncio.create_task(coord.join("g", topics=[topic], session_timeout_ms=10_000))
        while not (await coord.heartbeat("g", first.member_id, first.generation)).rebalance:
            await asyncio.sleep(0.01)
        ids = (first.member_id, None)
        a = await coord.join("g", topics=[topic], member_id=ids[0], session_timeout_ms=10_000)
        return a, await second
    a, b = await asyncio.gather(
        coord.join("g", topics=[topic], member_id=ids[0], session_timeout_ms=10_000),
        coord.join("g", topics=[topic], member_id=ids[1], session_timeout_ms=10_000),
    )
    return a, b


def test_a_join_is_answered_when_its_rebalance_completes_though_the_next_one_began(storage, settings, topic_factory):
    """CI once saw a new member's first join refused UNKNOWN_MEMBER: its rebalance completed, and
    another member joined before its request woke, so it waited on in the next rebalance, where it
    had not rejoined, and was dropped. Kafka answers every pending join at completion instead."""
    topic = topic_factory(partitions=2)

    async def scenario():
        coord = GroupCoordinator(TopicRegistry(settings), GroupStore(storage), sync_interval_s=3600)
        await coord.start()
        a = await coord.join("g", topics=[topic], session_timeout_ms=10_000)
        b = asyncio.create_task(coord.join("g", topics=[topic], session_timeout_ms=10_000))
        g = coord.group("g")
        while not g.rebalancing:
            await asyncio.sleep(0.01)
        # In one turn of the loop, while b's request sleeps: a rejoins, the generation completes,
        # and c joins (the interleaving CI hit by chance, forced here on the group's own state).
        g.join(now=coord.clock(), topics=[topic], member_id=a.member_id, instance_id=None,
               session_timeout_ms=10_000, assignor="range")  # fmt: skip
        g.complete({topic: 2})
        g.join(now=coord.clock(), topics=[topic], member_id=None, instance_id=None,
               session_timeout_ms=10_000, assignor="range")  # fmt: skip
        joined = await asyncio.wait_for(b, 5)  # before the fix: dropped at the 10 s deadline
        assert joined.generation == a.generation + 1 and len(joined.assignment[topic]) == 1
        hb = await coord.heartbeat("g", joined.member_id, joined.generation)
        assert hb.rebalance  # it learns of the next rebalance as Kafka's members do, and rejoins
        await coord.stop()

    asyncio.run(scenario())


def test_a_completion_decided_before_the_next_rebalance_began_does_not_complete_that_one(
    storage, settings, topic_factory
):
    """Churn under Kafka's clients showed members answered for generation N, then UNKNOWN_MEMBER_ID
    on their SyncGroup milliseconds later: a second completer (a join's wait, the expiry loop)
    had decided to complete while the group was ready, waited for the group's lock while the first
    completed and persisted generation N, and a new member joined meanwhile; it then completed that
    new rebalance at once, dropping every member that had not had the time to rejoin it."""
    topic = topic_factory(partitions=2)

    async def scenario():
        coord = GroupCoordinator(TopicRegistry(settings), GroupStore(storage), sync_interval_s=3600)
        await coord.start()
        a = await coord.join("g", topics=[topic], session_timeout_ms=10_000)
        g = coord.group("g")
        b = asyncio.create_task(coord.join("g", topics=[topic], session_timeout_ms=10_000))
        while not g.rebalancing:
            await asyncio.sleep(0.01)
        g.join(now=coord.clock(), topics=[topic], member_id=a.member_id, instance_id=None,
               session_timeout_ms=10_000, assignor="range")  # fmt: skip
        assert g.ready_to_complete(coord.clock())
        async with coord._lock(g):  # a completer holds the lock (as while it persists a generation)
            late = asyncio.create_task(coord._complete_rebalance(g))  # decided now: the group is ready
            await asyncio.sleep(0.05)
            g.complete({topic: 2})  # the first completer's generation
            c, settled = g.join(now=coord.clock(), topics=[topic], member_id=None, instance_id=None,
                                session_timeout_ms=10_000, assignor="range")  # fmt: skip
            assert not settled and g.rebalancing  # a newcomer began the next rebalance
        await asyncio.wait_for(late, 5)
        assert g.rebalancing and set(g.members) == {a.member_id, (await b).member_id, c.member_id}
        await coord.stop()

    asyncio.run(scenario())


def test_server_adopts_the_jobs_lag_aware_assignment_through_a_rebalance(storage, settings, topic_factory):
    topic = topic_factory(partitions=4)
    TopicWriter(storage, topic, settings.writer).append(make_batch(4000, partition_of=lambda i: i % 2, topic=topic))

    async def scenario():
        store = GroupStore(storage)
        coord = GroupCoordinator(TopicRegistry(settings), store, sync_interval_s=3600)
        await coord.start()
        a, b = await join_both(coord, topic)
        # range: one member owns partitions 0 and 1 (all the backlog), the other 2 and 3 (none)
        loaded = a if a.assignment[topic] == [0, 1] else b
        assert loaded.assignment == {topic: [0, 1]}
        await coord.persist_heartbeats()

        report = await asyncio.to_thread(rebalance.run, None, settings)
        [plan] = report.groups
        assert plan["action"] == "balance" and plan["lag_before"][loaded.member_id] == 4000
        assert max(plan["lag_after"].values()) == 2000
        assert store.load()["g"].writer == REBALANCE_JOB

        await coord.sync()
        assert coord.group("g").state == "PreparingRebalance"
        hb = await coord.heartbeat("g", a.member_id, a.generation)
        assert hb.rebalance  # members commit under their generation, then rejoin
        await coord.commit(
            "g",
            [OffsetCommit(group="g", topic=topic, partition=0, offset=0)],
            member_id=loaded.member_id,
            generation=loaded.generation,
        )
        a2, b2 = await join_both(coord, topic, (a.member_id, b.member_id))
        assert a2.generation == plan["generation"] == a.generation + 1
        lag = {a2.member_id: a2.assignment[topic], b2.member_id: b2.assignment[topic]}
        assert sorted(p for ps in lag.values() for p in ps) == [0, 1, 2, 3]
        assert all(len({0, 1} & set(ps)) == 1 for ps in lag.values())  # one backlog each
        # the group table's latest row is the server's, at the job's generation
        latest = store.load()["g"]
        assert latest.generation == plan["generation"] and latest.writer == "server"
        await coord.stop()

    asyncio.run(scenario())


def test_a_job_planned_on_a_stale_snapshot_loses_to_the_server(storage, settings, topic_factory):
    topic = topic_factory(partitions=2)

    async def scenario():
        store = GroupStore(storage)
        coord = GroupCoordinator(TopicRegistry(settings), store, sync_interval_s=3600)
        await coord.start()
        await join_both(coord, topic)
        job_store = GroupStore(storage)
        state = job_store.load()
        stale = state["g"]
        await coord.persist_heartbeats()  # the server writes the group after the job read it
        from dataclasses import replace

        assert not job_store.save_if_unchanged([replace(stale, generation=stale.generation + 1, writer=REBALANCE_JOB)])
        assert store.load()["g"].generation == stale.generation
        await coord.stop()

    asyncio.run(scenario())


def test_persisted_heartbeats_are_wall_clock_and_compaction_keeps_the_latest_row(storage, settings, topic_factory):
    topic = topic_factory(partitions=1)

    async def scenario():
        store = GroupStore(storage)
        coord = GroupCoordinator(TopicRegistry(settings), store, sync_interval_s=3600)
        await coord.start()
        await coord.join("g", topics=[topic], session_timeout_ms=10_000)
        import time

        for _ in range(3):
            await coord.persist_heartbeats()
        [m] = store.load()["g"].members
        assert abs(m.last_heartbeat_ms - time.time() * 1000) < 5000
        assert store.compact(min_rows=1)
        assert len(store._dt.to_pyarrow_table()) == 1
        assert store.load()["g"].members[0].member_id == m.member_id
        await coord.stop()

    asyncio.run(scenario())


def test_the_jobs_lag_counts_from_the_log_start_offset(storage, settings, topic_factory):
    """Records retention removed are not lag: a group with no commit lags by what is stored."""
    import time

    from delta_log.maintenance.retention import apply_retention
    from delta_log.system.groups import GroupRecord, MemberRecord

    topic = topic_factory(partitions=2, retention_ms=1000)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(3):
        w.append(make_batch(10, partition_of=lambda i: 0, topic=topic))
    w.append(make_batch(5, partition_of=lambda i: 1, topic=topic))
    now_ms = int(time.time() * 1000)
    assert apply_retention(storage, topic, settings.writer, now_ms=now_ms + 60_000).committed  # every segment expired
    w.append(make_batch(4, partition_of=lambda i: 0, topic=topic))  # partition 0: log start 30, high watermark 34

    def member(mid, partition):
        return MemberRecord(
            member_id=mid,
            instance_id=None,
            topics=(topic,),
            session_timeout_ms=30_000,
            assignment={topic: [partition]},
            last_heartbeat_ms=now_ms,
        )

    GroupStore(storage).save(
        [
            GroupRecord(
                group="g",
                generation=1,
                state="Stable",
                assignor="range",
                members=(member("a", 0), member("b", 1)),
                updated_at_us=now_ms * 1000,
            )
        ]
    )
    [plan] = rebalance.run(None, settings).groups
    assert plan["lag_before"] == {"a": 4, "b": 0}  # not 34 and 5: offsets below the log start are gone


def test_an_http_join_waiting_in_a_classic_rebalance_goes_on_in_the_consumer_group_it_became(
    storage, settings, topic_factory
):
    """A consumer-protocol member upgrades the group while a new HTTP member's join waits for the
    classic rebalance: the join is answered from the consumer-protocol group, under the member id
    it was given (no second member left behind), with nobody holding a partition twice."""
    from delta_log.core.consumer_group import Heartbeat

    topic = topic_factory(partitions=4)

    async def scenario():
        coord = GroupCoordinator(TopicRegistry(settings), GroupStore(storage), sync_interval_s=3600)
        await coord.start()
        a = await coord.join("g", topics=[topic], session_timeout_ms=10_000)
        b = asyncio.create_task(coord.join("g", topics=[topic], session_timeout_ms=10_000))
        while not coord.group("g").rebalancing:
            await asyncio.sleep(0.01)
        kafka = Heartbeat(member_id="k", epoch=0, rebalance_timeout_ms=30_000, topics=(topic,))
        _, cg = await coord.consumer_heartbeat("g", kafka)
        joined = await asyncio.wait_for(b, 5)
        assert "g" in coord.consumer_groups and "g" not in coord.groups
        assert sorted(cg.members) == sorted([a.member_id, joined.member_id, "k"])
        assert joined.generation == cg.members[joined.member_id].epoch
        hb = await coord.heartbeat("g", a.member_id, a.generation)
        assert hb.rebalance  # a holds all four and must give some up: it joins again, having committed
        a = await coord.join("g", topics=[topic], member_id=a.member_id, session_timeout_ms=10_000)
        held = [p for m in cg.members.values() for p in m.assigned.get(topic, ())]
        assert len(held) == len(set(held)) and len(a.assignment[topic]) < 4
        await coord.stop()

    asyncio.run(scenario())


def test_a_consumer_protocol_member_is_assigned_a_topic_created_a_moment_before_it_joined(
    storage, settings, topic_factory
):
    """The coordinator looks at the catalog at most once a second, but a member naming a topic it
    does not know yet makes it look now: the topic's partitions come in the answer to the join, as
    Kafka's do, not a heartbeat interval (5 s) later."""
    from delta_log.core.consumer_group import Heartbeat

    first = topic_factory(partitions=2)

    async def scenario():
        coord = GroupCoordinator(TopicRegistry(settings), GroupStore(storage), sync_interval_s=3600)
        await coord.start()
        answer, _ = await coord.consumer_heartbeat(
            "a", Heartbeat(member_id="m1", epoch=0, rebalance_timeout_ms=30_000, topics=(first,))
        )
        assert answer.assignment == {first: frozenset({0, 1})}
        created = topic_factory(partitions=3)  # within the second the catalog was looked at
        answer, _ = await coord.consumer_heartbeat(
            "b", Heartbeat(member_id="m2", epoch=0, rebalance_timeout_ms=30_000, topics=(created,))
        )
        assert answer.assignment == {created: frozenset({0, 1, 2})}
        await coord.stop()

    asyncio.run(scenario())


def test_a_topic_that_cannot_be_read_for_a_moment_stays_in_the_consumer_groups_view(
    storage, settings, topic_factory, monkeypatch
):
    """The coordinator reads every topic again when the catalog changes (a topic created elsewhere).
    A topic whose table cannot be read just then (an object store's 503) keeps its partitions in
    the groups' view: dropped, every group subscribed to it would have them all revoked, and given
    back a second later. What could not be read is read again at the next look, though the catalog
    did not change again; a deleted topic still leaves."""
    from delta_log.errors import StorageUnavailableError

    kept = topic_factory(partitions=3)

    async def scenario():
        registry = TopicRegistry(settings)
        coord = GroupCoordinator(registry, GroupStore(storage), sync_interval_s=3600)
        await coord.start()
        assert (await coord.topics(fresh=True)).counts[kept] == 3
        kept_id = coord.topic_ids()[kept]
        readable = registry.reader
        down: set[str] = {kept}

        def failing(name):
            if name in down:
                raise StorageUnavailableError("Could not read the topic's log: SlowDown (503).")
            return readable(name)

        monkeypatch.setattr(registry, "reader", failing)
        added = topic_factory(partitions=2)  # moves the catalog's marker
        down.add(added)
        seen = await coord.topics(fresh=True)
        assert (seen.counts[kept], coord.topic_ids()[kept]) == (3, kept_id)
        assert added not in seen.counts  # never read yet: not known
        down.clear()
        assert (await coord.topics(fresh=True)).counts[added] == 2  # the same marker, read again
        registry.catalog.delete_topic(kept)
        assert kept not in (await coord.topics(fresh=True)).counts
        await coord.stop()

    asyncio.run(scenario())
