"""A separate OS process that appends batches and records every acked range (for race/crash tests).

Usage: python -m tests.integration.append_worker ROOT TOPIC PARTITION BATCHES BATCH_SIZE ACK_FILE [TAG]
Each acked append is written to ACK_FILE as "base count tag" and fsync'ed before the next append.
"""

from __future__ import annotations

import os
import sys
import time

import pyarrow as pa

from conf import load_settings
from delta_log import StorageRoot, TopicWriter, normalize_batch


def main(argv: list[str]) -> None:
    root, topic, partition, batches, size, ack_file = argv[:6]
    tag = argv[6] if len(argv) > 6 else "w"
    settings = load_settings(root=root)
    writer = TopicWriter(StorageRoot(root, settings.storage_options), topic, settings.writer)
    p, n = int(partition), int(size)
    with open(ack_file, "a", buffering=1) as acks:
        for b in range(int(batches)):
            batch = normalize_batch(
                pa.table(
                    {
                        "key": [f"{tag}-{b}-{i}".encode() for i in range(n)],
                        "value": [b"v" * 50] * n,
                        "partition": pa.array([p] * n, pa.int32()),
                    }
                ),
                partitions=p + 1,
                topic=topic,
                max_message_bytes=10**6,
                now_us=int(time.time() * 1e6),
                log_append_time=False,
            )
            r = writer.append(batch).ranges[0]
            acks.write(f"{r.base_offset} {r.count} {tag}-{b}\n")
            acks.flush()
            os.fsync(acks.fileno())


if __name__ == "__main__":
    main(sys.argv[1:])
