"""Fetch, whichever door asked: records of a partition from an offset, from the reader's tail cache
when it holds them, else from the table in a worker thread; and the long-poll that sleeps until a
commit to one of the partitions a fetch waits on (broker.notifier), never polling."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Iterable

from broker.notifier import CommitNotifier
from delta_log.core.acl import Principal, authorize
from delta_log.log.reader import Encoder, FetchResult, TopicReader
from delta_log.registry import TopicRegistry


class Served:
    """Records and bytes fetches served, per topic, since the process started, whichever door
    asked (HTTP fetch, SSE, Kafka Fetch): /metrics' topiclake_records_out_total."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def add(self, topic: str, result: FetchResult) -> FetchResult:
        if count := result.count:
            with self._lock:
                c = self._counts[topic]
                c[0] += count
                c[1] += result.encoded_size if result.encoded is not None else result.records.nbytes
        return result

    def snapshot(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return {t: (r, b) for t, (r, b) in self._counts.items()}


#: the process's fetch counters (one process serves both doors)
SERVED = Served()


async def read(reader: TopicReader, partition: int, offset: int, max_records: int, max_bytes: int) -> FetchResult:
    """From memory on the loop when the tail cache or the read-ahead holds it (a woken long-poll,
    a consumer at the head of the log, one reading on), else in a worker thread.

    Raises: PartitionNotFoundError, OffsetOutOfRangeError, StorageUnavailableError."""
    cached = reader.fetch_cached(partition, offset, max_records=max_records, max_bytes=max_bytes)
    if cached is not None:
        return SERVED.add(reader.topic, cached)
    fetched = await asyncio.to_thread(reader.fetch, partition, offset, max_records=max_records, max_bytes=max_bytes)
    return SERVED.add(reader.topic, fetched)


def read_blocking(
    reader: TopicReader,
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    *,
    encoder: Encoder | None = None,
) -> FetchResult:
    """`read` for a caller already in a worker thread; `encoder` as `TopicReader.fetch` takes it."""
    cached = reader.fetch_cached(partition, offset, max_records=max_records, max_bytes=max_bytes, encoder=encoder)
    if cached is not None:
        return SERVED.add(reader.topic, cached)
    fetched = reader.fetch(partition, offset, max_records=max_records, max_bytes=max_bytes, encoder=encoder)
    return SERVED.add(reader.topic, fetched)


async def wait_for_commit(
    notifier: CommitNotifier, partitions: Iterable[tuple[str, int, int | None]], timeout: float
) -> bool:
    """Sleep until a commit to one of (topic, partition, high watermark last seen), or `timeout`
    seconds; True if one came."""
    waits = [asyncio.ensure_future(notifier.wait(t, p, timeout, since=hw)) for t, p, hw in partitions]
    if not waits:
        return False
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return any(not w.cancelled() and w.exception() is None and w.result() for w in done)
    finally:
        for w in waits:
            w.cancel()
        for w in waits:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await w


async def fetch(
    registry: TopicRegistry,
    notifier: CommitNotifier,
    principal: Principal,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_records: int,
    max_bytes: int,
    max_wait_s: float = 0.0,
) -> FetchResult:
    """Records of one partition from `offset`; with `max_wait_s`, waits that long for new ones when
    there are none yet (a long-poll, woken by the commit).

    Raises: AuthorizationError, TopicNotFoundError, PartitionNotFoundError, OffsetOutOfRangeError,
    StorageUnavailableError."""
    authorize(principal, "consume", topic)
    reader = await asyncio.to_thread(registry.reader, topic)
    result = await read(reader, partition, offset, max_records, max_bytes)
    deadline = time.monotonic() + max_wait_s
    while result.records.num_rows == 0 and (remaining := deadline - time.monotonic()) > 0:
        if await wait_for_commit(notifier, [(topic, partition, result.high_watermark)], remaining):
            result = await read(reader, partition, offset, max_records, max_bytes)
    return result
