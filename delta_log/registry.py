"""Process-wide access to topics: one group committer and one reader per topic, shared offsets store.

Concurrency contract: thread-safe; topic handles are created lazily under a lock and dropped on
delete. Commit listeners run on the committing thread and must be quick (they wake waiters).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from conf import Settings
from delta_log.catalog import Catalog
from delta_log.group_commit import FlushStats, GroupCommitter
from delta_log.offsets import OffsetStore
from delta_log.reader import TopicReader
from delta_log.rollup import SegmentRoller
from delta_log.storage import StorageRoot
from delta_log.topic_config import validate_topic_name
from delta_log.writer import CommitInfo, TopicWriter

log = logging.getLogger(__name__)


class TopicRegistry:
    """Topics of one storage root, as a server process uses them."""

    def __init__(self, settings: Settings, *, on_flush: Callable[[FlushStats], None] | None = None) -> None:
        self.settings = settings
        self.storage = StorageRoot(settings.root, settings.storage_options)
        self.catalog = Catalog(self.storage, settings.writer)
        self._on_flush = on_flush
        self._lock = threading.Lock()
        self._committers: dict[str, GroupCommitter] = {}
        self._rollers: dict[str, SegmentRoller] = {}
        self._readers: dict[str, TopicReader] = {}
        self._listeners: list[Callable[[CommitInfo], None]] = []
        self._offsets: OffsetStore | None = None
        self._sticky: dict[str, int] = {}

    @property
    def offsets(self) -> OffsetStore:
        with self._lock:
            if self._offsets is None:
                self._offsets = OffsetStore(self.storage)
            return self._offsets

    def lowest_committed(self, topic: str) -> dict[int, int]:
        """Per partition, the lowest offset any consumer group committed (for consumer-aware retention)."""
        offsets = self.offsets
        offsets.load()
        out: dict[int, int] = {}
        for c in offsets.all_committed():
            if c.topic == topic:
                out[c.partition] = min(out.get(c.partition, c.offset), c.offset)
        return out

    def add_commit_listener(self, listener: Callable[[CommitInfo], None]) -> None:
        self._listeners.append(listener)

    def reader(self, topic: str) -> TopicReader:
        """Raises: InvalidTopicError, TopicNotFoundError."""
        validate_topic_name(topic)
        with self._lock:
            r = self._readers.get(topic)
        if r is not None:
            return r
        fresh = TopicReader(self.storage, topic)
        with self._lock:
            return self._readers.setdefault(topic, fresh)

    def committer(self, topic: str) -> GroupCommitter:
        """Raises: InvalidTopicError, TopicNotFoundError."""
        reader = self.reader(topic)
        with self._lock:
            c = self._committers.get(topic)
            if c is not None:
                return c
        roller = SegmentRoller(self.storage, topic, self.settings.writer, lowest_committed=self.lowest_committed)
        writer = TopicWriter(self.storage, topic, self.settings.writer, on_commit=self._fanout(reader, roller))
        w = self.settings.writer
        committer = GroupCommitter(
            writer,
            linger_s=w.linger_ms / 1000,
            batch_bytes=w.batch_bytes,
            max_queue_bytes=w.max_queue_bytes,
            on_flush=self._on_flush,
        )
        with self._lock:
            existing = self._committers.get(topic)
            if existing is None:
                self._committers[topic] = committer
                self._rollers[topic] = roller
                return committer
        committer.close()
        roller.close()
        return existing

    def _fanout(self, reader: TopicReader, roller: SegmentRoller) -> Callable[[CommitInfo], None]:
        def on_commit(info: CommitInfo) -> None:
            reader.on_commit(info)
            roller.notify_commit()
            for listener in self._listeners:
                try:
                    listener(info)
                except Exception:
                    log.exception("commit listener failed")

        return on_commit

    def sticky_partition(self, topic: str, partitions: int, *, advance: bool) -> int:
        """Kafka's sticky partitioner for null keys: one partition per batch, moving on per batch."""
        with self._lock:
            current = self._sticky.get(topic, hash(topic) % partitions) % partitions
            if advance:
                self._sticky[topic] = (current + 1) % partitions
            return current

    def committers(self) -> dict[str, GroupCommitter]:
        with self._lock:
            return dict(self._committers)

    def drop(self, topic: str) -> None:
        """Forget a topic's handles (after delete); flushes what its committer holds."""
        with self._lock:
            c = self._committers.pop(topic, None)
            r = self._rollers.pop(topic, None)
            self._readers.pop(topic, None)
            self._sticky.pop(topic, None)
        if c is not None:
            c.close()
        if r is not None:
            r.close()

    def close(self) -> None:
        with self._lock:
            committers = list(self._committers.values())
            rollers = list(self._rollers.values())
            self._committers.clear()
            self._rollers.clear()
            self._readers.clear()
        for c in committers:
            c.close()
        for r in rollers:
            r.close()
