"""Kafka 4's consumer group protocol (KIP-848: ConsumerGroupHeartbeat, ConsumerGroupDescribe) on a
gateway started as users start it, driven by librdkafka (`group.protocol=consumer`), Kafka's Java
consumer and its kafka-consumer-groups tool (4.3.1), and franz-go (kgo.ServerSideBalancer)."""

from __future__ import annotations

import collections
import datetime
import itertools
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from confluent_kafka import Consumer, ConsumerGroupType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from bench.kafka_broker import ensure_jars, java
from tests.e2e import kafka_wire
from tests.e2e.churn import close_consumer
from tests.e2e.server import REPO, ServerProcess
from topiclake import Consumer as HttpConsumer

pytestmark = pytest.mark.slow

_ids = itertools.count()

#: members heartbeat every 0.5 s and are removed after 6 s of silence (Kafka's defaults: 5 s, 45 s)
FAST_CONSUMER_GROUPS = {
    "TOPICLAKE_SERVER__CONSUMER_GROUP_HEARTBEAT_INTERVAL_MS": "500",
    "TOPICLAKE_SERVER__CONSUMER_GROUP_SESSION_TIMEOUT_MS": "6000",
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("k848") / "data", env=FAST_CONSUMER_GROUPS).start()
    yield srv
    srv.stop()


@pytest.fixture
def admin(gateway):
    return AdminClient({"bootstrap.servers": gateway.kafka})


def new_topic(admin: AdminClient, partitions: int, prefix: str = "c848") -> str:
    name = f"{prefix}-{next(_ids)}"
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def produce(gateway, topic: str, values: range, partition: int | None = None) -> None:
    p = Producer({"bootstrap.servers": gateway.kafka, "linger.ms": 5})
    for i in values:
        if partition is None:
            p.produce(topic, key=str(i).encode(), value=str(i).encode())
        else:
            p.produce(topic, key=str(i).encode(), value=str(i).encode(), partition=partition)
    assert p.flush(60) == 0


def member(gateway, group: str, **conf) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": gateway.kafka,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            **conf,
        }
    )


def held(c: Consumer) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


def shared_evenly(live: list[Consumer], partitions: int) -> bool:
    """Whether the members hold equal shares of the partitions; a partition held twice fails."""
    sets = [set(held(c)) for c in live]
    assert sum(len(s) for s in sets) == len(set().union(*sets)), sets  # no partition held twice
    return sorted(len(s) for s in sets) == [partitions // len(live)] * len(live)


def poll_until(consumers: list[Consumer], done, timeout: float = 30.0, got: list | None = None) -> list:
    """Poll every consumer in turn until `done()`; the records read (appended to `got`)."""
    got = [] if got is None else got
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        for c in consumers:  # what each has queued, without waiting long on the idle ones
            got += [m for m in c.consume(500, timeout=0.05) if m.error() is None]
    assert done(), "timed out"
    return got


def test_members_join_crash_and_every_record_is_read(gateway, admin, tmp_path):
    """Three worker processes: one reads alone, a second joins (incremental revocation: no
    partition has two owners), then the first is killed with kill -9 (its partitions move after
    the session timeout). Every record is read; the only records read twice are those the killed
    one read after its last commit."""
    topic = new_topic(admin, 6)
    group = f"g-{topic}"
    produce(gateway, topic, range(0, 3000))
    out = [tmp_path / f"w{i}.txt" for i in range(2)]

    def worker(path):
        cmd = [sys.executable, "-m", "tests.e2e.kafka_848_worker", gateway.kafka, group, topic, str(path)]
        return subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)

    def lines(path) -> list[tuple[int, int, str]]:
        if not path.exists():
            return []
        return [(int(p), int(o), v) for p, o, v in (line.split() for line in path.read_text().splitlines())]

    first = worker(out[0])
    second = None
    try:
        deadline = time.monotonic() + 60
        while len(lines(out[0])) < 500 and time.monotonic() < deadline:
            time.sleep(0.2)
        second = worker(out[1])
        while sorted(_held_by_members(admin, group)) != [3, 3] and time.monotonic() < deadline:
            time.sleep(0.2)
        produce(gateway, topic, range(3000, 6000))
        while not lines(out[1]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lines(out[1]), "the second member never got partitions"
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = len(lines(out[0]))
        produce(gateway, topic, range(6000, 9000))
        while time.monotonic() < deadline + 30:
            values = {v for path in out for _, _, v in lines(path)}
            if len(values) == 9000:
                break
            time.sleep(0.5)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    assert len(lines(out[0])) == killed_at
    values = collections.Counter(v for path in out for _, _, v in lines(path))
    assert set(values) == {str(i) for i in range(9000)}
    for path in out:  # each member read each of its partitions in order
        last: dict[int, int] = {}
        for p, o, _ in lines(path):
            assert o > last.get(p, -1)
            last[p] = o
    twice = [v for v, n in values.items() if n > 1]
    # read twice: only what the killed member read after its last commit (one batch per partition)
    assert len(twice) <= 6 * 100, len(twice)
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert len(described.members) == 1
    assert sorted(tp.partition for tp in described.members[0].assignment.topic_partitions) == list(range(6))


def _held_by_members(admin: AdminClient, group: str) -> list[int]:
    described = admin.describe_consumer_groups([group])[group].result(30)
    return [len(m.assignment.topic_partitions) for m in described.members]


def test_a_second_member_and_a_graceful_leave_move_partitions_without_a_barrier(gateway, admin):
    topic = new_topic(admin, 6)
    group = f"g-{topic}"
    produce(gateway, topic, range(600))
    a = member(gateway, group)
    a.subscribe([topic])
    read = poll_until([a], lambda: len(held(a)) == 6)
    b = member(gateway, group)
    b.subscribe([topic])
    read += poll_until([a, b], lambda: len(held(a)) == 3 and len(held(b)) == 3)
    assert not set(held(a)) & set(held(b))
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert str(described.type) == "ConsumerGroupType.CONSUMER" and str(described.state) == "ConsumerGroupState.STABLE"
    assert sorted(len(m.assignment.topic_partitions) for m in described.members) == [3, 3]
    poll_until([a, b], lambda: len({m.value() for m in read}) == 600, got=read)
    b.close()  # leaves (epoch -1): a takes everything back
    poll_until([a], lambda: len(held(a)) == 6)
    a.close()
    listed = admin.list_consumer_groups().result(30).valid
    assert any(g.group_id == group and str(g.type) == "ConsumerGroupType.CONSUMER" for g in listed)


def test_a_regex_subscription_is_resolved_by_the_server_and_picks_up_a_topic_created_later(gateway, admin):
    first = new_topic(admin, 2, prefix="rx848")
    produce(gateway, first, range(10))
    c = member(gateway, f"g-{first}")
    c.subscribe([f"^rx848-{first.rsplit('-', 1)[1]}.*|^rx848-late-.*"])
    got_values: set[bytes] = set()
    deadline = time.monotonic() + 30
    while len(got_values) < 10 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got_values.add(m.value())
    later = new_topic(admin, 1, prefix="rx848-late")
    produce(gateway, later, range(10, 15))
    deadline = time.monotonic() + 30
    topics = set()
    while len(got_values) < 15 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got_values.add(m.value())
            topics.add(m.topic())
    c.close()
    assert len(got_values) == 15 and later in topics


def test_a_static_member_leaves_and_its_next_process_gets_its_partitions_back(gateway, admin):
    topic = new_topic(admin, 4)
    group = f"g-{topic}"
    one = member(gateway, group, **{"group.instance.id": "one"})
    two = member(gateway, group, **{"group.instance.id": "two"})
    for c in (one, two):
        c.subscribe([topic])
    poll_until([one, two], lambda: len(held(one)) == 2 and len(held(two)) == 2)
    mine = held(one)
    epoch = admin.describe_consumer_groups([group])[group].result(30)
    one.close()  # a static member leaves for now (epoch -2): its partitions wait for it
    time.sleep(1.5)
    assert held(two) == sorted(set(range(4)) - set(mine))
    back = member(gateway, group, **{"group.instance.id": "one"})
    back.subscribe([topic])
    poll_until([back, two], lambda: held(back) == mine)
    assert held(two) == sorted(set(range(4)) - set(mine))
    assert len(admin.describe_consumer_groups([group])[group].result(30).members) == len(epoch.members)
    for c in (back, two):
        c.close()


def test_the_lag_assignor_chosen_by_name_gives_the_backlogged_partition_a_member_of_its_own(gateway, admin):
    topic = new_topic(admin, 4)
    group = f"g-{topic}"
    produce(gateway, topic, range(2000), partition=0)
    for p in (1, 2, 3):
        produce(gateway, topic, range(10), partition=p)
    # the group has read partitions 1-3 and nothing of 0: a backlog of 2,000 there
    committed = admin.alter_consumer_group_offsets(
        [_offsets(group, [TopicPartition(topic, p, 10) for p in (1, 2, 3)] + [TopicPartition(topic, 0, 0)])]
    )
    committed[group].result(30)
    consumers = [
        member(gateway, group, **{"group.remote.assignor": "lag", "max.partition.fetch.bytes": 1024}) for _ in range(2)
    ]
    for c in consumers:
        c.subscribe([topic])
    poll_until(consumers, lambda: sorted(len(held(c)) for c in consumers) in ([1, 3],), timeout=30)
    alone = next(c for c in consumers if len(held(c)) == 1)
    assert held(alone) == [0]
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert described.partition_assignor == "lag"
    for c in consumers:
        c.close()


def _offsets(group: str, partitions: list[TopicPartition]):
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group, partitions)


def test_an_empty_classic_group_upgrades_and_a_classic_member_then_joins_it(gateway, admin):
    topic = new_topic(admin, 2)
    group = f"g-{topic}"
    produce(gateway, topic, range(20))
    classic = Consumer({"bootstrap.servers": gateway.kafka, "group.id": group, "auto.offset.reset": "earliest"})
    classic.subscribe([topic])
    read = []
    deadline = time.monotonic() + 30
    while len(read) < 10 and time.monotonic() < deadline:
        m = classic.poll(0.2)
        if m is not None and m.error() is None:
            read.append(m)
            classic.commit(message=m, asynchronous=False)
            if len(read) == 10:
                break
    classic.close()
    # empty now: a consumer-protocol member takes the group over and resumes from its commits
    modern = member(gateway, group)
    modern.subscribe([topic])
    rest = []
    deadline = time.monotonic() + 30
    while len(rest) < 10 and time.monotonic() < deadline:
        m = modern.poll(0.2)
        if m is not None and m.error() is None:
            rest.append(m)
    assert {m.value() for m in read} | {m.value() for m in rest} == {str(i).encode() for i in range(20)}
    assert not {m.value() for m in read} & {m.value() for m in rest}
    # a classic member (librdkafka's eager default) joins the consumer group, as Kafka lets it:
    # served by the same machinery, it gets a partition once the other member released it
    late = Consumer({"bootstrap.servers": gateway.kafka, "group.id": group, "auto.offset.reset": "earliest"})
    late.subscribe([topic])
    poll_until([modern, late], lambda: (len(held(modern)), len(held(late))) == (1, 1))
    assert not set(held(modern)) & set(held(late))
    close_consumer(late)
    poll_until([modern], lambda: len(held(modern)) == 2)
    modern.close()


def classic(gateway, group: str, strategy: str = "cooperative-sticky") -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": gateway.kafka,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": strategy,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_a_busy_classic_group_is_upgraded_member_by_member(gateway, admin, strategy):
    """Kafka's online upgrade (group.consumer.migration.policy): two classic members read a
    topic; consumer-protocol members replace them one at a time (a rolling upgrade). The first
    one turns the group into a consumer group with the classic members in it, which keep their
    partitions until they give them up; at every step no partition has two owners, and every record
    is read."""
    topic = new_topic(admin, 6)
    group = f"g-{topic}"
    produce(gateway, topic, range(600))
    old = [classic(gateway, group, strategy) for _ in range(2)]
    for c in old:
        c.subscribe([topic])
    live = list(old)
    got: list = []

    def balanced() -> bool:
        return shared_evenly(live, 6)

    poll_until(live, balanced, timeout=60, got=got)
    for step, leaving in enumerate([None, *old]):
        if step == 1:  # upgraded: one group, the classic members in it beside the new one
            described = admin.describe_consumer_groups([group])[group].result(30)
            assert (described.type, len(described.members)) == (ConsumerGroupType.CONSUMER, 3), described
        if leaving is not None:
            close_consumer(leaving)  # (a classic member leaving mid-rebalance: churn.close_consumer)
            live.remove(leaving)
        new = member(gateway, group)
        new.subscribe([topic])
        live.append(new)
        produce(gateway, topic, range(600 * (step + 1), 600 * (step + 2)))
        poll_until(live, balanced, timeout=60, got=got)
    total = 600 * 4
    poll_until(live, lambda: len({m.value() for m in got}) == total, timeout=60, got=got)
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert len(described.members) == 3
    for c in live:
        close_consumer(c)


def test_the_last_consumer_protocol_member_leaving_turns_the_group_classic_again(gateway, admin):
    """Kafka's online downgrade: two classic members and one that joined with the consumer
    protocol (the group upgraded); when the latter leaves, the group is a classic group again and
    its members rejoin it, sharing every partition, no partition held twice, every record read."""
    topic = new_topic(admin, 6)
    group = f"g-{topic}"
    produce(gateway, topic, range(600))
    live = [classic(gateway, group) for _ in range(2)]
    for c in live:
        c.subscribe([topic])
    got: list = []

    def balanced() -> bool:
        return shared_evenly(live, 6)

    poll_until(live, balanced, timeout=60, got=got)
    new = member(gateway, group)
    new.subscribe([topic])
    live.append(new)
    poll_until(live, balanced, timeout=60, got=got)
    assert admin.describe_consumer_groups([group])[group].result(30).type == ConsumerGroupType.CONSUMER
    close_consumer(new)
    live.remove(new)
    produce(gateway, topic, range(600, 1200))
    poll_until(live, balanced, timeout=60, got=got)
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert (described.type, len(described.members)) == (ConsumerGroupType.CLASSIC, 2), described
    poll_until(live, lambda: len({m.value() for m in got}) == 1200, timeout=60, got=got)
    for c in live:
        close_consumer(c)


class HttpMember:
    """A member over HTTP, driven by hand: join, heartbeat (joining again when told), leave."""

    def __init__(self, gateway, group: str, topic: str, **body) -> None:
        self.url, self.group = f"{gateway.url}/groups/{group}", group
        self.body = {"topics": [topic], "session_timeout_ms": 6000, **body}
        self.joined: dict = {}

    @property
    def held(self) -> set[int]:
        return {p for ps in self.joined.get("assignment", {}).values() for p in ps}

    def join(self) -> set[int]:
        body = self.body | ({"member_id": self.joined["member_id"]} if self.joined else {})
        r = httpx.post(f"{self.url}/members", json=body, timeout=60)
        assert r.status_code == 200, r.text
        self.joined = r.json()
        return self.held

    def tick(self) -> bool:
        """Heartbeat; join again if told to (an HTTP member gives up its partitions by joining
        again, having committed). Whether it did."""
        r = httpx.post(
            f"{self.url}/members/{self.joined['member_id']}/heartbeat",
            json={"generation": self.joined["generation"]},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert {p for ps in r.json()["assignment"].values() for p in ps} == self.held
        if r.json()["rebalance"]:
            self.join()
        return bool(r.json()["rebalance"])

    def commit(self, topic: str, partition: int, offset: int, generation: int | None = None) -> httpx.Response:
        gen = self.joined["generation"] if generation is None else generation
        body = {"member_id": self.joined["member_id"], "generation": gen}
        body["offsets"] = [{"topic": topic, "partition": partition, "offset": offset}]
        return httpx.post(f"{self.url}/offsets", json=body, timeout=30)

    def leave(self) -> None:
        r = httpx.delete(f"{self.url}/members/{self.joined['member_id']}", timeout=30)
        assert r.status_code == 204, r.text


def settle(http: list[HttpMember], kafka: list[Consumer], shares: list[int], timeout: float = 60.0) -> None:
    """Heartbeat the HTTP members and poll the Kafka ones until their partition counts are
    `shares` (in that order); at every step, no partition has two holders."""
    deadline = time.monotonic() + timeout
    while True:
        sets = [m.held for m in http] + [set(held(c)) for c in kafka]
        assert sum(len(s) for s in sets) == len(set().union(*sets)), sets
        if [len(s) for s in sets] == shares:
            return
        assert time.monotonic() < deadline, f"held {sets}, wanted {shares}"
        for c in kafka:
            c.consume(100, timeout=0.05)
        for m in http:
            m.tick()
        time.sleep(0.05)


def test_http_members_on_the_consumer_protocol_share_partitions_with_kafka_members(gateway, admin):
    """An HTTP member that asks for the consumer protocol gets a consumer-protocol group with the
    assignor it names; a librdkafka member on the same protocol joins it and a partition moves to it
    only once the HTTP member, told by its heartbeat, gave it up; commits are at the member's
    generation, as for Kafka's classic members in such a group."""
    topic = new_topic(admin, 6)
    group = f"g-{topic}"
    http = HttpMember(gateway, group, topic, group_protocol="consumer", assignor="uniform")
    assert http.join() == set(range(6))
    bad = httpx.post(
        f"{gateway.url}/groups/{group}/members",
        json={"topics": [topic], "group_protocol": "consumer", "assignor": "roundrobin"},
        timeout=30,
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "UNKNOWN_ASSIGNOR", bad.text
    kafka = member(gateway, group)
    kafka.subscribe([topic])
    settle([http], [kafka], [3, 3])
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert (described.type, len(described.members)) == (ConsumerGroupType.CONSUMER, 2), described
    shown = httpx.get(f"{gateway.url}/groups/{group}", timeout=30).json()
    assert sorted(m["member_id"] for m in shown["members"]) == sorted(m.member_id for m in described.members)
    mine = min(http.held)
    assert http.commit(topic, mine, 0).status_code == 200
    stale = http.commit(topic, mine, 0, generation=http.joined["generation"] - 1)
    assert stale.status_code == 409, stale.text
    http.leave()
    settle([], [kafka], [6])
    kafka.close()


def test_a_classic_group_of_http_members_is_upgraded_and_stays_one_for_them(gateway, admin):
    """Kafka's online upgrade takes HTTP members along: a busy classic group with an HTTP member
    becomes a consumer-protocol group when a librdkafka member joins with that protocol; another
    HTTP member (the classic API, unchanged) joins it; when the Kafka member leaves, the HTTP
    members stay in a consumer-protocol group (not downgraded) and share every partition."""
    topic = new_topic(admin, 6)
    group = f"g-{topic}"
    first = HttpMember(gateway, group, topic)
    assert first.join() == set(range(6))
    kafka = member(gateway, group)
    kafka.subscribe([topic])
    settle([first], [kafka], [3, 3])
    assert admin.describe_consumer_groups([group])[group].result(30).type == ConsumerGroupType.CONSUMER
    second = HttpMember(gateway, group, topic, assignor="roundrobin")  # (a classic member votes for none)
    second.join()
    settle([first, second], [kafka], [2, 2, 2])
    close_consumer(kafka)
    settle([first, second], [], [3, 3])
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert (described.type, len(described.members)) == (ConsumerGroupType.CONSUMER, 2), described
    first.leave()
    second.leave()


def test_python_consumers_on_the_consumer_protocol_read_every_record_once(gateway, admin):
    """topiclake's Consumer with group_protocol="consumer" and the lag assignor: a second consumer
    joining takes partitions as the first gives them up (committing first), and every record is
    read exactly once between them."""
    topic = new_topic(admin, 4)
    group = f"g-{topic}"
    produce(gateway, topic, range(400))
    conf = {"group_protocol": "consumer", "assignor": "lag", "auto_offset_reset": "earliest"}
    conf |= {"session_timeout_ms": 6000, "heartbeat_interval_ms": 300, "max_poll_records": 20}
    first = HttpConsumer(gateway.url, group, **conf)
    first.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got += [r.value for r in first.poll(1.0)]
    assert got and len(first.assignment()) == 4
    second = HttpConsumer(gateway.url, group, **conf)
    second.subscribe([topic])
    deadline = time.monotonic() + 60
    while len(got) < 400 and time.monotonic() < deadline:
        for c in (first, second):
            got += [r.value for r in c.poll(0.2)]
    assert sorted(int(v) for v in got) == list(range(400))
    assert len(first.assignment()) + len(second.assignment()) == 4
    assert not set(first.assignment()) & set(second.assignment())
    first.close()
    second.close()


def test_the_java_consumer_reads_on_the_consumer_protocol_and_the_tools_describe_the_group(gateway, admin):
    libs = ensure_jars()
    topic = new_topic(admin, 3)
    group = f"g-{topic}"
    produce(gateway, topic, range(30))
    base = [java(), "-Xmx256m", "-cp", f"{libs}/*"]
    console = ["org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", gateway.kafka]
    console += ["--topic", topic, "--group", group, "--from-beginning", "--max-messages", "30"]
    console += ["--command-property", "group.protocol=consumer", "--timeout-ms", "60000"]
    consumed = subprocess.run(
        [*base, *console],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    assert sorted(int(v) for v in consumed.stdout.split()) == list(range(30))
    # a librdkafka member is live while the tool describes the group
    live = member(gateway, group)
    live.subscribe([topic])
    poll_until([live], lambda: len(held(live)) == 3)
    tool = ["org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server", gateway.kafka]
    tool += ["--describe", "--group", group, "--members", "--verbose"]
    described = subprocess.run(
        [*base, *tool],
        capture_output=True,
        text=True,
        timeout=180,
    )
    live.close()
    assert described.returncode == 0, described.stderr[-3000:]
    assert group in described.stdout and "rdkafka" in described.stdout, described.stdout


def test_group_configs_set_with_kafka_configs_reach_the_members(gateway, admin):
    """`kafka-configs --entity-type groups` (Kafka's ConfigCommand, 4.3.1) sets a group's
    consumer.session.timeout.ms and consumer.heartbeat.interval.ms (IncrementalAlterConfigs on a
    GROUP resource), describes them, and the group's members are told the new interval in their
    next heartbeat answer; a value outside the gateway's bounds, or a key groups do not take, is
    refused with Kafka's INVALID_CONFIG and changes nothing."""
    libs = ensure_jars()
    topic = new_topic(admin, 2)
    group = f"g-{topic}"
    base = [java(), "-Xmx256m", "-cp", f"{libs}/*", "kafka.admin.ConfigCommand", "--bootstrap-server", gateway.kafka]
    entity = ["--entity-type", "groups", "--entity-name", group]

    def configs(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *entity, *args], capture_output=True, text=True, timeout=180)

    epoch = [0]

    def heartbeat_interval(member_id: str) -> int:
        """One heartbeat of the member (its first joins), at the epoch it was last given; joining
        again, as a client does, if its session ended meanwhile (the tools' JVMs take seconds)."""
        joining = epoch[0] == 0
        with kafka_wire.connect(gateway.kafka) as s:
            answer = kafka_wire.call(
                s,
                68,
                0,
                group_id=group,
                member_id=member_id,
                member_epoch=i32(epoch[0]),
                instance_id=None,
                rack_id=None,
                rebalance_timeout=datetime.timedelta(seconds=30 if joining else -1 / 1000),
                subscribed_topic_names=(topic,) if joining else None,
                server_assignor=None,
                topic_partitions=() if joining else None,
            )
        if answer.error_code == ErrorCode.unknown_member_id and not joining:
            epoch[0] = 0
            return heartbeat_interval(member_id)
        assert answer.error_code == 0, answer
        epoch[0] = int(answer.member_epoch)
        return int(answer.heartbeat_interval.total_seconds() * 1000)

    member_id = uuid.uuid4().hex[:22]
    assert heartbeat_interval(member_id) == 500  # the gateway's default (this module's settings)
    described = configs("--describe")  # the tool lists a group's overrides (none yet), as Kafka's
    assert described.returncode == 0, described.stderr[-3000:]
    assert "consumer." not in described.stdout, described.stdout
    altered = configs("--alter", "--add-config", "consumer.heartbeat.interval.ms=1500,consumer.session.timeout.ms=9000")
    assert altered.returncode == 0, altered.stderr[-3000:]
    described = configs("--describe")
    assert "consumer.heartbeat.interval.ms=1500" in described.stdout, described.stdout
    assert "consumer.session.timeout.ms=9000" in described.stdout, described.stdout
    assert heartbeat_interval(member_id) == 1500
    for bad in (
        "consumer.session.timeout.ms=99999999",
        "consumer.heartbeat.interval.ms=9000",
        "share.session.timeout.ms=50000",
    ):
        refused = configs("--alter", "--add-config", bad)
        assert refused.returncode != 0 and "InvalidConfigurationException" in refused.stdout + refused.stderr, bad
    reset = configs("--alter", "--delete-config", "consumer.heartbeat.interval.ms")
    assert reset.returncode == 0, reset.stderr[-3000:]
    assert heartbeat_interval(member_id) == 500
    described = configs("--describe")
    assert "consumer.session.timeout.ms=9000" in described.stdout, described.stdout
    assert "consumer.heartbeat.interval.ms" not in described.stdout, described.stdout


def test_offset_fetches_need_the_members_epoch_and_a_full_group_refuses_a_new_member(tmp_path, admin, gateway):
    """OffsetFetch v9 from a member: at its current epoch (STALE_MEMBER_EPOCH otherwise, and
    UNKNOWN_MEMBER_ID from one not in the group), as Kafka's ConsumerGroup.validateOffsetFetch;
    and a group at its most members (`server.consumer_group_max_size`) refuses a new one
    GROUP_MAX_SIZE_REACHED, which librdkafka reports to the application (a fatal error)."""
    from kio.schema.offset_fetch.v9.request import OffsetFetchRequestGroup, OffsetFetchRequestTopics

    topic, group = new_topic(admin, 2), f"fetch-epoch-{next(_ids)}"
    member_id = uuid.uuid4().hex[:22]
    with kafka_wire.connect(gateway.kafka) as s:
        joined = kafka_wire.call(
            s,
            68,
            0,
            group_id=group,
            member_id=member_id,
            member_epoch=i32(0),
            instance_id=None,
            rack_id=None,
            rebalance_timeout=datetime.timedelta(seconds=30),
            subscribed_topic_names=(topic,),
            server_assignor=None,
            topic_partitions=(),
        )
        assert joined.error_code == ErrorCode.none and joined.member_epoch > 0

        def fetch(member: str | None, epoch: int) -> int:
            wanted = OffsetFetchRequestGroup(
                group_id=group,
                member_id=member,
                member_epoch=i32(epoch),
                topics=(OffsetFetchRequestTopics(name=topic, partition_indexes=(i32(0),)),),
            )
            return kafka_wire.call(s, 9, 9, groups=(wanted,), require_stable=False).groups[0].error_code

        assert fetch(member_id, int(joined.member_epoch)) == ErrorCode.none
        assert fetch(member_id, int(joined.member_epoch) - 1) == ErrorCode.stale_member_epoch
        assert fetch("not-a-member", 1) == ErrorCode.unknown_member_id
        assert fetch(None, -1) == ErrorCode.none  # the admin tools

    full = ServerProcess(
        tmp_path / "data", env=FAST_CONSUMER_GROUPS | {"TOPICLAKE_SERVER__CONSUMER_GROUP_MAX_SIZE": "1"}
    ).start()
    try:
        small = AdminClient({"bootstrap.servers": full.kafka})
        topic = new_topic(small, 2)
        first = member(full, "full-group")
        first.subscribe([topic])
        poll_until([first], lambda: len(first.assignment()) == 2)
        errors: list = []
        second = member(full, "full-group", error_cb=errors.append)
        second.subscribe([topic])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not errors:
            for m in second.consume(10, timeout=0.2):
                if m.error() is not None:
                    errors.append(m.error())
            first.consume(10, timeout=0.05)
        # (librdkafka makes it fatal for the consumer, naming the broker's error)
        assert any(e.code() == KafkaError._FATAL and "maximum size" in e.str() for e in errors), errors
        assert second.assignment() == [] and len(first.assignment()) == 2
        second.close()
        close_consumer(first)
    finally:
        full.stop()


def test_a_connections_heartbeats_are_handled_in_the_order_sent(admin, gateway):
    """librdkafka sends its leave while a heartbeat may be in flight on the same connection. Kafka
    handles a connection's requests one at a time, so the heartbeat is answered first and the leave
    after it. A gateway that let the leave overtake the heartbeat would answer one of them
    UNKNOWN_MEMBER_ID, and librdkafka would report the member's partitions lost. Here a member's
    join (with the `lag` assignor, whose join reads the partitions' backlog first) and its leave
    are pipelined on one socket: both must succeed, in that order."""
    topic = new_topic(admin, 2)
    for round_ in range(3):
        group, member_id = f"order-{topic}-{round_}", uuid.uuid4().hex[:22]
        common = {"group_id": group, "member_id": member_id, "instance_id": None, "rack_id": None}
        with kafka_wire.connect(gateway.kafka) as s:
            kafka_wire.send(
                s,
                68,
                0,
                1,
                member_epoch=i32(0),
                rebalance_timeout=datetime.timedelta(seconds=30),
                subscribed_topic_names=(topic,),
                server_assignor="lag",
                topic_partitions=(),
                **common,
            )
            kafka_wire.send(  # the leave, sent before the join's answer is read
                s,
                68,
                0,
                2,
                member_epoch=i32(-1),
                rebalance_timeout=datetime.timedelta(milliseconds=-1),
                subscribed_topic_names=None,
                server_assignor=None,
                topic_partitions=None,
                **common,
            )
            joined, left = kafka_wire.receive(s, 68, 0), kafka_wire.receive(s, 68, 0)
        assert (joined.error_code, left.error_code) == (ErrorCode.none, ErrorCode.none), (joined, left)
        assert int(joined.member_epoch) > 0 and int(left.member_epoch) == -1
