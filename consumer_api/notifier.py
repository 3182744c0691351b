"""Wakes long-polling fetches and SSE streams the moment a commit lands.

The writer's commit listener runs on its flusher thread; it hands the new high watermarks to the
event loop with `call_soon_threadsafe`. Waiters are per (topic, partition).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from delta_log.log.writer import CommitInfo


class CommitNotifier:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._events: dict[tuple[str, int], asyncio.Event] = defaultdict(asyncio.Event)

    def on_commit(self, info: CommitInfo) -> None:
        """Thread-safe: called by the writer after each commit."""
        keys = [(info.topic, p) for p in info.high_watermarks]
        self.loop.call_soon_threadsafe(self._fire, keys)

    def _fire(self, keys: list[tuple[str, int]]) -> None:
        for key in keys:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    async def wait(self, topic: str, partition: int, timeout: float) -> bool:
        """Wait for the next commit to the partition; True if one came before `timeout` seconds."""
        event = self._events[(topic, partition)]
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
