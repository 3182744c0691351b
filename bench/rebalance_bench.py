"""Rebalance latency of a consumer group, beside Apache Kafka in one run: a member joins a group of
four on a 24-partition topic, then leaves; how long until every member holds its new partitions.

    python -m bench.rebalance_bench            # 5 rounds per case
    python -m bench.rebalance_bench --quick    # 2 rounds

Both protocols, with librdkafka members (each polling in a thread of its own, as an application):
- classic: JoinGroup/SyncGroup with the default eager assignors (`range,roundrobin`);
- consumer: Kafka 4's protocol (KIP-848, `group.protocol=consumer`), the `uniform` assignor.
Two settings: the defaults of both systems for everything that paces a rebalance (heartbeat
intervals: librdkafka's 3 s classic, the server's 5 s consumer), which is then mostly waiting for
heartbeats; and fast heartbeats (100 ms classic, 500 ms consumer on both servers), where the
coordinators' own work shows. Kafka's initial rebalance delay is 0 (topiclake has none). "Done"
is when the members' assignments
cover the 24 partitions exactly once and each member holds its fair share (4-5 after the join, 6
after the leave). Results: bench/results/rebalance_bench.json, printed with topiclake/Kafka ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.common import print_table, write_results
from bench.kafka_broker import KafkaBroker
from tests.e2e.server import ServerProcess

PARTITIONS = 24
MEMBERS = 4
TIMEOUT_S = 120.0


class Member:
    """One consumer polling in its own thread; `held` is what it was last assigned."""

    def __init__(self, bootstrap: str, group: str, topic: str, protocol: str, fast: bool) -> None:
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
        if protocol == "consumer":
            conf["group.protocol"] = "consumer"
        elif fast:
            conf["heartbeat.interval.ms"] = 100
        self.consumer = Consumer(conf)
        self.consumer.subscribe([topic])
        self.held: frozenset[int] = frozenset()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(0.02)
            self.held = frozenset(tp.partition for tp in self.consumer.assignment())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.consumer.close()


def _settled(members: list[Member]) -> bool:
    held = [m.held for m in members]
    every = [p for h in held for p in h]
    fair = PARTITIONS // len(members)
    return sorted(every) == list(range(PARTITIONS)) and all(fair <= len(h) <= fair + 1 for h in held)


def _wait(members: list[Member]) -> float:
    start = time.monotonic()
    while not _settled(members):
        if time.monotonic() - start > TIMEOUT_S:
            raise RuntimeError(f"not settled in {TIMEOUT_S:.0f} s: {[sorted(m.held) for m in members]}")
        time.sleep(0.005)
    return time.monotonic() - start


def measure(bootstrap: str, protocol: str, rounds: int, tag: str, fast: bool) -> dict[str, float]:
    """Median seconds for a join into a group of MEMBERS and for that member's leave."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"rebalance-{protocol}-{tag}"
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    group = f"g-{topic}"
    members = [Member(bootstrap, group, topic, protocol, fast) for _ in range(MEMBERS)]
    joins, leaves = [], []
    try:
        _wait(members)
        for _ in range(rounds):
            started = time.monotonic()
            extra = Member(bootstrap, group, topic, protocol, fast)
            members.append(extra)
            while not _settled(members):
                time.sleep(0.005)
            joins.append(time.monotonic() - started)
            started = time.monotonic()
            members.remove(extra)
            extra.close()  # leaves the group
            while not _settled(members):
                time.sleep(0.005)
            leaves.append(time.monotonic() - started)
    finally:
        for m in members:
            m.close()
    return {"join_s": statistics.median(joins), "leave_s": statistics.median(leaves)}


#: fast heartbeats for consumer-protocol groups, on both servers
FAST_GATEWAY = {"TOPICLAKE_SERVER__CONSUMER_GROUP_HEARTBEAT_INTERVAL_MS": "500"}
FAST_KAFKA = {"group.consumer.heartbeat.interval.ms": "500", "group.consumer.min.heartbeat.interval.ms": "500"}


def _run(rounds: int, fast: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="rebalance-bench-") as tmp:
        srv = ServerProcess(Path(tmp) / "data", env=FAST_GATEWAY if fast else {}).start()
        try:
            with KafkaBroker(Path(tmp) / "kafka", config=FAST_KAFKA if fast else {}) as kafka:
                for protocol in ("classic", "consumer"):
                    ours = measure(srv.kafka, protocol, rounds, "t", fast)
                    theirs = measure(kafka.bootstrap, protocol, rounds, "k", fast)
                    for event in ("join", "leave"):
                        t, k = ours[f"{event}_s"], theirs[f"{event}_s"]
                        rows.append(
                            {
                                "heartbeats": "fast" if fast else "defaults",
                                "protocol": protocol,
                                "event": f"a member {event}s a group of {MEMBERS if event == 'join' else MEMBERS + 1}",
                                "topiclake_s": round(t, 3),
                                "kafka_s": round(k, 3),
                                "ratio": round(t / k, 2) if k else None,
                            }
                        )
        finally:
            srv.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds = 2 if args.quick else 5
    rows = []
    for fast in (False, True):
        rows += _run(rounds, fast)
    print_table(rows, ["heartbeats", "protocol", "event", "topiclake_s", "kafka_s", "ratio"])
    write_results("rebalance_bench", rows, {"partitions": PARTITIONS, "members": MEMBERS, "rounds": rounds})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
