"""A consumer process on Kafka's consumer protocol (KIP-848, librdkafka's group.protocol=consumer)
for e2e tests: consume in a group, log every record, commit after each batch.

Usage: python -m tests.e2e.kafka_848_worker BOOTSTRAP GROUP TOPIC OUT_FILE
Each line of OUT_FILE: "partition offset value", fsync'ed before the offsets are committed.
"""

from __future__ import annotations

import os
import sys

from confluent_kafka import Consumer, KafkaException


def main(argv: list[str]) -> None:
    bootstrap, group, topic, out_file = argv[:4]
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    with open(out_file, "a", buffering=1) as out:
        while True:
            batch = [m for m in c.consume(100, 0.5) if m.error() is None]
            for m in batch:
                out.write(f"{m.partition()} {m.offset()} {m.value().decode()}\n")
            if batch:
                out.flush()
                os.fsync(out.fileno())
                try:
                    c.commit(asynchronous=False)
                except KafkaException as exc:  # its partitions moved meanwhile: the next owner re-reads
                    print("commit refused:", exc, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
