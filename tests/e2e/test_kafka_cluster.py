"""Two gateways on one root as a Kafka cluster: each is a broker, partitions are led by their owner
gateway, a group spans both, and kill -9 of one under produce load loses and duplicates nothing
acked (idempotent producers retried at the survivor)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e import kafka_wire
from tests.e2e.server import ServerProcess
from tests.e2e.test_cluster import FAST_MEMBERSHIP, wait_for
from topiclake import Consumer as HttpConsumer

pytestmark = pytest.mark.slow


def gateway(root) -> ServerProcess:
    return ServerProcess(root, env=FAST_MEMBERSHIP).start()


def brokers_seen(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return len(admin.list_topics(timeout=10).brokers)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("kcluster") / "data"
    servers = [gateway(root) for _ in range(2)]
    wait_for(lambda: all(brokers_seen(s.kafka) == 2 for s in servers), what="2 brokers in Metadata")
    yield servers
    for s in servers:
        s.stop()


def records_of(url: str, topic: str, partitions: int) -> dict[int, list[tuple[int, str]]]:
    """Every record of every partition, as (offset, value), read over HTTP page by page."""
    out: dict[int, list[tuple[int, str]]] = {}
    for p in range(partitions):
        out[p], offset, hw = [], 0, 1
        while offset < hw:
            body = httpx.get(
                f"{url}/topics/{topic}/partitions/{p}/records",
                params={"offset": offset, "max_records": 100000, "value_format": "string"},
                timeout=60,
            ).json()
            out[p] += [(r["offset"], r["value"]) for r in body["records"]]
            offset, hw = body["next_offset"], body["high_watermark"]
    return out


def test_partitions_are_led_by_both_gateways_and_a_client_of_one_writes_to_the_others(pair):
    first, second = pair
    admin = AdminClient({"bootstrap.servers": first.kafka})
    admin.create_topics([NewTopic("spread", 16, 1)])["spread"].result(30)  # 8 fell to one gateway 2 times in 256
    md = admin.list_topics(timeout=10)
    leaders = {p.leader for p in md.topics["spread"].partitions.values()}
    assert leaders == set(md.brokers)  # both gateways lead some of the 16 partitions
    delivered: list = []
    p = Producer({"bootstrap.servers": first.kafka, "enable.idempotence": True, "linger.ms": 5})
    for i in range(400):
        p.produce("spread", key=str(i).encode(), value=str(i).encode(), on_delivery=lambda e, m: delivered.append(e))
    assert p.flush(60) == 0
    assert delivered.count(None) == 400

    # the other gateway sees the commits within its reader's refresh interval
    def all_seen() -> dict | None:
        stored = records_of(second.url, "spread", 16)
        return stored if sum(len(v) for v in stored.values()) == 400 else None

    stored = wait_for(all_seen, what="400 records seen by the other gateway")
    assert all(len(v) for v in stored.values())

    # one group, one member bootstrapped on each gateway: the partitions are split between them
    members = [
        Consumer({"bootstrap.servers": s.kafka, "group.id": "spread-readers", "auto.offset.reset": "earliest"})
        for s in pair
    ]
    for c in members:
        c.subscribe(["spread"])
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 90
    while (len(seen) < 400 or any(len(c.assignment()) != 8 for c in members)) and time.monotonic() < deadline:
        for c in members:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                seen.add((m.partition(), m.offset()))
    parts = [{tp.partition for tp in c.assignment()} for c in members]
    for c in members:
        c.close()
    assert len(seen) == 400
    assert len(parts[0]) == 8 and len(parts[1]) == 8 and not parts[0] & parts[1]


@pytest.mark.parametrize("config", [{}, {"topiclake.ack.mode": "log"}], ids=["table", "log"])
def test_kill_9_of_a_gateway_under_produce_load_loses_and_duplicates_nothing_acked(tmp_path_factory, config):
    """On `log` topics the survivor takes the victim's partitions over once their write-ahead
    leases end, replaying the victim's log first; producers are told NOT_LEADER meanwhile."""
    root = tmp_path_factory.mktemp("kkill") / "data"
    survivor = gateway(root)
    victim: ServerProcess | None = None
    try:
        victim = gateway(root)  # (inside the try: a victim that fails to start still stops the survivor)
        wait_for(lambda: brokers_seen(survivor.kafka) == 2, what="2 brokers")
        admin = AdminClient({"bootstrap.servers": survivor.kafka})
        admin.create_topics([NewTopic("load", 4, 1, config=config)])["load"].result(30)
        acked: list[str] = []
        failed: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            p = Producer(
                {
                    "bootstrap.servers": f"{survivor.kafka},{victim.kafka}",
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 2,
                    "message.timeout.ms": 120_000,
                }
            )

            def done(err, msg) -> None:
                (failed if err else acked).append(msg.value().decode())

            i = 0
            while not stop.is_set():
                p.produce("load", key=str(i).encode(), value=f"r{i}".encode(), on_delivery=done)
                p.poll(0)
                i += 1
                if i % 200 == 0:
                    time.sleep(0.05)
            p.flush(150)

        t = threading.Thread(target=produce)
        t.start()
        wait_for(lambda: len(acked) > 2000, timeout=60, what="acks before the kill")
        victim.kill9()
        before = len(acked)
        wait_for(lambda: len(acked) > before + 2000, timeout=90, what="acks from the survivor after the kill")
        stop.set()
        t.join(180)
        assert not t.is_alive()
        assert failed == [], f"{len(failed)} records were not delivered (the survivor should lead every partition)"
        stored = records_of(survivor.url, "load", 4)
        values = [v for recs in stored.values() for _, v in recs]
        for recs in stored.values():  # contiguous offsets in every partition
            assert [o for o, _ in recs] == list(range(len(recs)))
        assert len(values) == len(set(values)), "a record was written twice"
        missing = set(acked) - set(values)
        assert not missing, f"{len(missing)} acked records are gone"
    finally:
        survivor.stop()
        if victim is not None:
            victim.stop()


def _epochs(bootstrap: str, group: str) -> tuple[int, dict[str, int]]:
    """The group's epoch and each member's, as its coordinator at `bootstrap` describes them."""
    with kafka_wire.connect(bootstrap) as s:
        g = kafka_wire.call(s, 69, 0, group_ids=(group,), include_authorized_operations=False).groups[0]
    assert g.error_code == 0, g
    return int(g.group_epoch), {m.member_id: int(m.member_epoch) for m in g.members}


def test_a_consumer_protocol_group_across_gateways_survives_a_kill_9_of_its_coordinator(tmp_path_factory):
    """KIP-848 members bootstrapped on two gateways, and an HTTP member in the same group (the
    consumer protocol, both gateways' URLs); the group's coordinator is killed with kill -9
    mid-read. The survivor takes the group over from its last snapshot, as Kafka loads a group on
    a new coordinator: the members go on under their member ids, with their partitions; every
    record is read, none past what was produced."""
    root = tmp_path_factory.mktemp("k848kill") / "data"
    env = FAST_MEMBERSHIP | {"TOPICLAKE_SERVER__CONSUMER_GROUP_HEARTBEAT_INTERVAL_MS": "500"}
    servers = [ServerProcess(root, env=env).start() for _ in range(2)]
    members: list[Consumer] = []
    http: HttpConsumer | None = None
    try:
        wait_for(lambda: all(brokers_seen(s.kafka) == 2 for s in servers), what="2 brokers in Metadata")
        both = ",".join(s.kafka for s in servers)
        admin = AdminClient({"bootstrap.servers": both})
        admin.create_topics([NewTopic("k848", 6, 1)])["k848"].result(30)
        p = Producer({"bootstrap.servers": both, "enable.idempotence": True, "linger.ms": 5})
        for i in range(3000):
            p.produce("k848", key=str(i).encode(), value=str(i).encode())
        assert p.flush(60) == 0
        members = [
            Consumer(
                {
                    "bootstrap.servers": f"{s.kafka},{other.kafka}",
                    "group.id": "k848-readers",
                    "group.protocol": "consumer",
                    "auto.offset.reset": "earliest",
                    "auto.commit.interval.ms": 200,
                }
            )
            for s, other in (servers, servers[::-1])
        ]
        for c in members:
            c.subscribe(["k848"])
        http = HttpConsumer(
            [s.url for s in servers],
            "k848-readers",
            group_protocol="consumer",
            auto_offset_reset="earliest",
            heartbeat_interval_ms=500,
            auto_commit_interval_ms=200,
            max_poll_records=50,
        )
        http.subscribe(["k848"])
        seen: set[bytes] = set()

        def read_until(done, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while not done() and time.monotonic() < deadline:
                for c in members:  # what each has queued, without waiting long on an idle one
                    seen.update(m.value() for m in c.consume(500, timeout=0.05) if m.error() is None)
                seen.update(r.value for r in http.poll(0.05))

        def shared() -> bool:
            return all(len(c.assignment()) == 2 for c in members) and len(http.assignment()) == 2

        read_until(lambda: len(seen) >= 1000 and shared(), 60)
        assert shared()
        port = admin.describe_consumer_groups(["k848-readers"])["k848-readers"].result(30).coordinator.port
        coordinator = next(s for s in servers if s.kafka.endswith(f":{port}"))
        survivor = next(s for s in servers if s is not coordinator)
        before = _epochs(coordinator.kafka, "k848-readers")
        coordinator.kill9()
        p = Producer({"bootstrap.servers": survivor.kafka, "enable.idempotence": True, "message.timeout.ms": 60000})
        for i in range(3000, 4000):
            p.produce("k848", key=str(i).encode(), value=str(i).encode())
        assert p.flush(90) == 0
        read_until(lambda: len(seen) == 4000, 90)
        assert seen == {str(i).encode() for i in range(4000)}
        after = AdminClient({"bootstrap.servers": survivor.kafka})
        described = after.describe_consumer_groups(["k848-readers"])["k848-readers"].result(30)
        assert len(described.members) == 3
        # restored, not rejoined: a member that rejoins (fenced, or unknown to the new coordinator)
        # comes back at epoch 0 and moves the group's epoch on; here nobody started over
        assert _epochs(survivor.kafka, "k848-readers") == before
    finally:
        for c in members:
            c.close()
        if http is not None:
            http.close()
        for s in servers:
            s.stop()
