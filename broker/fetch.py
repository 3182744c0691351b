"""Fetch, whichever door asked (`FetchService`): records of partitions from offsets, from the
reader's tail cache when it holds them, else from the table in a worker thread; and the one
long-poll, which sleeps until a commit to one of the partitions a fetch waits on (broker.notifier),
never polling."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from broker.notifier import CommitNotifier
from delta_log.core.acl import Principal, authorize, refusal
from delta_log.core.topic_config import TopicConfig
from delta_log.errors import AuthorizationError, PartitionNotFoundError, TopiclakeError
from delta_log.log.reader import Encoded as Encoded
from delta_log.log.reader import Encoder as Encoder
from delta_log.log.reader import FetchResult as FetchResult
from delta_log.log.reader import OffsetSpec as OffsetSpec
from delta_log.log.reader import TopicReader
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


@dataclass(slots=True)
class FetchPart:
    """One partition a fetch asks for, from `offset`, at most `max_bytes` of it; the service fills
    the rest (an error instead of raising: a Kafka fetch's other partitions go on)."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    #: None without an error: the fetch's byte budget was spent before this partition
    result: FetchResult | None = None
    error: TopiclakeError | None = None
    high_watermark: int | None = None  # as last read (also when the budget was spent)

    def size(self) -> int:
        """The bytes found: of the wire form when encoded, else of the Arrow records."""
        r = self.result
        if r is None:
            return 0
        return len(r.encoded) if r.encoded is not None else r.records.nbytes if r.records.num_rows else 0


class FetchService:
    """Fetch, for every face: many partitions in one pass (cached tails on the loop, the rest in one
    worker-thread hop), a byte budget shared in order, and the one long-poll (HTTP's max_wait_ms,
    SSE's wait for the next records, Kafka's max wait and min bytes): asleep until a commit to one
    of the partitions (broker.notifier) or the deadline, never polling."""

    def __init__(self, registry: TopicRegistry, notifier: CommitNotifier) -> None:
        self.registry = registry
        self.notifier = notifier

    async def fetch(
        self,
        principal: Principal,
        parts: Sequence[FetchPart],
        *,
        max_bytes: int,
        max_records: int,
        max_wait_s: float = 0.0,
        min_bytes: int = 1,
        encoder: Callable[[TopicConfig], Encoder | None] | None = None,
    ) -> None:
        """Fill each part's result, or its error (AuthorizationError for a topic the key may not
        consume, TopicNotFoundError, PartitionNotFoundError, OffsetOutOfRangeError,
        StorageUnavailableError). With `max_wait_s`, waits until `min_bytes` are found, a part
        fails (an error is news: answered at once) or the deadline. `encoder`: the topic's record
        encoder (Kafka's batches), None for Arrow records."""
        refused = {t: self.refusal(principal, t) for t in {p.topic for p in parts}}
        for p in parts:
            p.error = refused[p.topic]
        live = [p for p in parts if p.error is None]
        deadline = time.monotonic() + max_wait_s
        found = await self._pass(live, max_bytes, max_records, encoder)
        while found < min_bytes and (remaining := deadline - time.monotonic()) > 0:
            if any(p.error is not None for p in parts):
                return
            if not await wait_for_commit(
                self.notifier, [(p.topic, p.partition, p.high_watermark) for p in live], remaining
            ):
                return
            found = await self._pass(live, max_bytes, max_records, encoder)

    async def high_watermark(self, principal: Principal, topic: str, partition: int) -> int:
        """The partition's high watermark. Raises: AuthorizationError, TopicNotFoundError,
        PartitionNotFoundError, StorageUnavailableError."""
        if (refused := self.refusal(principal, topic)) is not None:
            raise refused
        return await asyncio.to_thread(lambda: self.registry.reader(topic).high_watermark(partition))

    @staticmethod
    def refusal(principal: Principal, topic: str) -> AuthorizationError | None:
        """Why the key may not consume `topic`, or None: the one ACL check of every fetch."""
        return refusal(principal, "consume", topic)

    async def _pass(
        self,
        parts: Sequence[FetchPart],
        budget: int,
        max_records: int,
        encoder: Callable[[TopicConfig], Encoder | None] | None,
    ) -> int:
        if len(parts) == 1 and encoder is None:  # from memory on the loop: a woken long-poll, a tail reader
            (p,) = parts
            reader = self.registry.open_reader(p.topic)
            if reader is not None:
                try:
                    cached = reader.fetch_cached(
                        p.partition, p.offset, max_records=max_records, max_bytes=max(1, min(p.max_bytes, budget))
                    )
                except TopiclakeError as exc:
                    p.error = exc
                    return 0
                if cached is not None:
                    p.result, p.high_watermark = SERVED.add(p.topic, cached), cached.high_watermark
                    return p.size()
        return await asyncio.to_thread(self._pass_blocking, parts, budget, max_records, encoder)

    def _pass_blocking(
        self,
        parts: Sequence[FetchPart],
        budget: int,
        max_records: int,
        encoder: Callable[[TopicConfig], Encoder | None] | None,
    ) -> int:
        total = 0
        for p in parts:
            try:
                reader = self.registry.reader(p.topic)
                if total and budget - total <= 0:  # full: this partition's records wait for the next fetch
                    p.result, p.high_watermark = None, reader.high_watermark(p.partition)
                    continue
                p.result = read_blocking(
                    reader,
                    p.partition,
                    p.offset,
                    max_records,
                    max(1, min(p.max_bytes, budget - total)),
                    encoder=encoder(reader.config) if encoder is not None else None,
                )
            except TopiclakeError as exc:
                p.error = exc
                continue
            p.high_watermark = p.result.high_watermark
            total += p.size()
        return total


@dataclass(frozen=True, slots=True)
class OffsetAt:
    """Where an offset lookup points in one partition."""

    partition: int
    log_start_offset: int
    high_watermark: int
    #: None: no record at or after the timestamp ("timestamp"), or an empty partition ("max_timestamp")
    offset: int | None
    timestamp_ms: int = -1  # the found record's ("timestamp", "max_timestamp")


def list_offsets(
    registry: TopicRegistry,
    principal: Principal,
    topic: str,
    at: Literal["earliest", "latest", "max_timestamp", "timestamp"],
    *,
    timestamp_ms: int = 0,
    partitions: Sequence[int] | None = None,
    action: Literal["consume", "describe"] = "consume",
) -> list[OffsetAt]:
    """Per partition (default: all): the log start offset ("earliest"), the high watermark
    ("latest"), the newest record ("max_timestamp") or the first record at or after
    `timestamp_ms` ("timestamp"). `action`: the ACL the door asks for (Kafka's ListOffsets:
    describe). Blocking. Raises: AuthorizationError, TopicNotFoundError, PartitionNotFoundError,
    PartitionRecoveringError, StorageUnavailableError."""
    authorize(principal, action, topic)
    reader = registry.reader(topic)
    n = reader.config.partitions
    out = []
    for p in range(n) if partitions is None else partitions:
        if not 0 <= p < n:
            raise PartitionNotFoundError(topic, p, n)
        lso, hw = reader.log_start_offset(p), reader.high_watermark(p)
        found: int | None = {"earliest": lso, "latest": hw}.get(at)
        ms = -1
        if at == "max_timestamp" and hw > lso:
            found = hw - 1
        elif at == "timestamp":
            found = reader.offset_for_timestamp(p, timestamp_ms)
        if found is not None and at in ("max_timestamp", "timestamp"):
            record = reader.fetch(p, found, max_records=1).records
            ms = record.column("timestamp").cast("int64")[0].as_py() // 1000 if record.num_rows else timestamp_ms
        out.append(OffsetAt(p, lso, hw, found, ms))
    return out


def read_blocking(
    reader: TopicReader,
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    *,
    encoder: Encoder | None = None,
) -> FetchResult:
    """Records from the tail cache or the read-ahead when they hold them, else from the table
    (blocking); `encoder` as `TopicReader.fetch` takes it."""
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
