"""A consumer process for e2e tests: consume a topic in a group, log every record, commit after each poll.

Usage: python -m tests.e2e.consumer_worker URL GROUP TOPIC OUT_FILE [SESSION_TIMEOUT_MS]
Each line of OUT_FILE: "partition offset value", fsync'ed before the offsets are committed.
"""

from __future__ import annotations

import os
import sys

from topiclake import Consumer


def main(argv: list[str]) -> None:
    url, group, topic, out_file = argv[:4]
    session = int(argv[4]) if len(argv) > 4 else 3000
    c = Consumer(
        url,
        group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=session,
        heartbeat_interval_ms=300,
    )
    c.subscribe([topic])
    with open(out_file, "a", buffering=1) as out:
        while True:
            records = c.poll(0.5)
            for r in records:
                out.write(f"{r.partition} {r.offset} {r.value.decode()}\n")
            if records:
                out.flush()
                os.fsync(out.fileno())
                try:
                    c.commit()
                except Exception as exc:  # fenced during a rebalance: the next owner re-reads
                    print("commit refused:", exc, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
