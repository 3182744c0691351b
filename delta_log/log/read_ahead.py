"""Read-ahead: a consumer's next fetch, read from the table while it handles the one it got.

A consumer reading a partition from its stored segments asks for the records after the ones it was
just given, with the same limits (Kafka's consumers keep one fetch in flight per broker). The
reader then spends its time decoding parquet while the consumer waits, and the consumer's time
parsing the answer while the reader idles. After a fetch served from the table, the reader hands
the next one to this pool; the consumer's next fetch with the same (partition, offset, limits)
takes the result (waiting for it when it is still being read, never reading it twice).

Bounded: at most `max_bytes` of results are held or being read, per process, counted by the
limits they were asked with until read, then by what the read holds (`size`); a new one past
that pushes out the oldest (a consumer that went away). A fetch whose read ahead has not started
yet (the pool is busy with others) reads by itself instead of queueing behind them.
Concurrency contract: thread-safe; results are immutable.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

_R = TypeVar("_R")


class ReadAhead(Generic[_R]):
    """Fetches read before they are asked for, keyed by what the next fetch will ask."""

    def __init__(self, max_bytes: int, *, size: Callable[[_R], int], threads: int = 1) -> None:
        self.max_bytes = max_bytes
        self._size = size
        self._closed = False
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._slots: OrderedDict[Hashable, tuple[int, Future[_R]]] = OrderedDict()
        self._bytes = 0
        #: results taken, and results pushed out unread
        self.hits = self.dropped = 0

    def offer(self, key: Hashable, cost: int, read: Callable[[], _R]) -> None:
        """Start reading `key` (what `read` returns) unless it is held already or costs more than
        the whole budget; the oldest results make room."""
        if cost > self.max_bytes or self.max_bytes <= 0:
            return
        with self._lock:
            if self._closed or key in self._slots:
                return
            while self._slots and self._bytes + cost > self.max_bytes:
                _, (old_cost, old) = self._slots.popitem(last=False)
                self._bytes -= old_cost
                old.cancel()  # not started yet: never read; running: its result is dropped
                self.dropped += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="read-ahead")
            fut = self._pool.submit(self._reading, key, read)
            self._slots[key] = (cost, fut)
            self._bytes += cost

    def _reading(self, key: Hashable, read: Callable[[], _R]) -> _R:
        """`read` on a pool thread; then its slot counts what the result holds."""
        result = read()
        size = self._size(result)
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                self._bytes += size - slot[0]
                self._slots[key] = (size, slot[1])
        return result

    def take(self, key: Hashable, *, ready_only: bool = False) -> _R | None:
        """The result read ahead for `key` (waiting for it while it is being read), or None: never
        offered, pushed out, or its read failed (the caller reads as usual and gets the error then).
        With `ready_only`, a result still being read is left in place and None returned (for
        callers on an event loop)."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or (ready_only and not slot[1].done()):
                return None
            del self._slots[key]
            self._bytes -= slot[0]
        if slot[1].cancel():  # still queued behind other reads: the caller reads sooner by itself
            self.dropped += 1
            return None
        try:
            result = slot[1].result()
        except Exception:  # the caller reads again and meets the error itself
            return None
        self.hits += 1
        return result

    def wait_for_reads(self, timeout: float) -> bool:
        """Wait until every read offered so far has finished (tests and benchmarks measure a
        consumer that took its time); False if `timeout` seconds passed first."""
        with self._lock:
            pending = [fut for _, fut in self._slots.values()]
        _, not_done = wait(pending, timeout=timeout)
        return not not_done

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for _, fut in self._slots.values():
                fut.cancel()
            self._slots.clear()
            self._bytes = 0
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
