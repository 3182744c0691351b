"""Wakes long-polling fetches and SSE streams when a commit lands: waiting costs no CPU.

- Commits by this process: the writer's commit listener runs on its flusher thread and hands the
  new high watermarks to the event loop with `call_soon_threadsafe`; the waiters of each
  (topic, partition) wake at once.
- Commits by other processes on the same root (other gateways, Spark jobs): while a topic has
  waiters, ONE watcher task per topic re-reads its Delta log every `watch_interval_s` and wakes
  the waiters of the partitions whose high watermark moved. Its cost does not grow with the
  number of waiters, and it stops when the last waiter leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, defaultdict
from collections.abc import Callable

from delta_log.errors import TopiclakeError
from delta_log.log.reader import TopicReader
from delta_log.log.writer import CommitInfo

log = logging.getLogger(__name__)


class CommitNotifier:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        reader: Callable[[str], TopicReader] | None = None,
        watch_interval_s: float = 0.25,
    ) -> None:
        self.loop = loop
        self.reader = reader
        self.watch_interval_s = watch_interval_s
        self._events: dict[tuple[str, int], asyncio.Event] = defaultdict(asyncio.Event)
        #: the newest high watermark seen per partition (this process's commits, the watchers')
        self._hw: dict[tuple[str, int], int] = {}
        self._waiters: Counter[str] = Counter()
        self._watchers: dict[str, asyncio.Task[None]] = {}
        #: called on the loop with the topic whenever a wait on one of its partitions begins (the
        #: transaction coordinator then lands what the reader waits for sooner)
        self.wait_listeners: list[Callable[[str], None]] = []

    def watched(self, topic: str) -> bool:
        """Whether a fetch or stream waits on one of the topic's partitions now."""
        return self._waiters.get(topic, 0) > 0

    def on_commit(self, info: CommitInfo) -> None:
        """Thread-safe: called by the writer after each commit."""
        seen = {(info.topic, p): hw for p, hw in info.high_watermarks.items()}
        self.loop.call_soon_threadsafe(self._advance, seen)

    def _advance(self, seen: dict[tuple[str, int], int]) -> None:
        """New high watermarks: wake the waiters of the partitions that moved."""
        moved = []
        for key, hw in seen.items():
            if hw > self._hw.get(key, -1):
                self._hw[key] = hw
                moved.append(key)
        self._fire(moved)

    def _fire(self, keys: list[tuple[str, int]]) -> None:
        for key in keys:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    async def wait(self, topic: str, partition: int, timeout: float, since: int | None = None) -> bool:
        """Wait for the next commit to the partition; True if one came before `timeout` seconds.

        `since`: the high watermark the caller's last fetch saw; if a commit past it was already
        seen (it landed between that fetch and this wait), return at once."""
        if since is not None and self._hw.get((topic, partition), -1) > since:
            return True
        event = self._events[(topic, partition)]
        self._waiters[topic] += 1
        if self.reader is not None and topic not in self._watchers:
            self._watchers[topic] = self.loop.create_task(self._watch(topic), name=f"watch-{topic}")
        try:
            for listener in self.wait_listeners:
                listener(topic)
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters[topic] -= 1
            if self._waiters[topic] <= 0:
                del self._waiters[topic]

    def _high_watermarks(self, topic: str) -> dict[int, int]:
        assert self.reader is not None
        reader = self.reader(topic)
        reader.refresh()
        return {p.partition: p.high_watermark for p in reader.partition_offsets()}

    async def _watch(self, topic: str) -> None:
        """Wake waiters on commits by other processes, while the topic has waiters."""
        try:
            while True:  # the first reading already wakes waiters whose fetch missed a commit
                now = await asyncio.to_thread(self._high_watermarks, topic)
                self._advance({(topic, p): hw for p, hw in now.items()})
                if not self._waiters.get(topic):
                    break
                await asyncio.sleep(self.watch_interval_s)
        except TopiclakeError:  # deleted, storage trouble: let the waiters re-fetch and see it
            self._fire([key for key in list(self._events) if key[0] == topic])
        except Exception:  # never leave waiters without a watcher silently
            log.exception("commit watcher of %r failed", topic)
            self._fire([key for key in list(self._events) if key[0] == topic])
        finally:
            self._watchers.pop(topic, None)

    async def close(self) -> None:
        for task in list(self._watchers.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
