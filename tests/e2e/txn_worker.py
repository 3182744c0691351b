"""A consume-transform-produce service with exactly-once output, as users write it with
confluent-kafka: read `source` in group `group` (read_committed), write each record to `sink`
in a transaction that also commits the group's offsets (send_offsets_to_transaction).

Run: python -m tests.e2e.txn_worker BOOTSTRAP TRANSACTIONAL_ID SOURCE SINK GROUP IDLE_EXIT_S
Prints "committed N" after each transaction; exits after IDLE_EXIT_S seconds without input once
some came (before that, within a minute: joining the group may wait out a killed member).
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, Producer


def main(bootstrap: str, tid: str, source: str, sink: str, group: str, idle_exit_s: float) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe([source])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5})
    producer.init_transactions(60)
    idle_since, idle_limit = time.monotonic(), 60.0
    while time.monotonic() - idle_since < idle_limit:
        messages = [m for m in consumer.consume(200, 0.5) if m.error() is None]
        if not messages:
            continue
        idle_since, idle_limit = time.monotonic(), idle_exit_s
        producer.begin_transaction()
        for m in messages:
            producer.produce(sink, key=m.key(), value=m.value(), partition=m.partition())
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 60
        )
        producer.commit_transaction(60)
        print("committed", len(messages), flush=True)
    consumer.close()


if __name__ == "__main__":
    main(*sys.argv[1:6], float(sys.argv[6]))
