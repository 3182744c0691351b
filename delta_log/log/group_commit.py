"""Group commit: requests for one topic queue up; one thread flushes them as single Delta commits.

Concurrency contract
- `submit()` is thread-safe and never blocks on I/O: it enqueues and returns a Future that is
  resolved only after the commit holding the request succeeded (ack after durable), or failed.
- Flushes run on a `FlushPool` shared by every topic of the process (`writer.flush_threads`
  threads), so an idle topic holds no thread: a topic with waiting requests takes one pool thread
  for one flush at a time (never two at once: `TopicWriter` is single-threaded) and, if more
  arrived meanwhile, queues its next flush behind the other topics'. A flush starts when
  `linger_s` passed since its first request or `batch_bytes` are waiting. Requests that arrive
  while a commit is in flight form the next flush, so batching grows with load even at linger 0.
- Under load (requests came in while a flush ran, or it held several) a topic's next flush also
  waits, after the previous one ended, `GAP_FACTOR` times as long as that one took (at most
  `max_gap_s`), while less than `GAP_BYTES` wait: its small flushes then fill at most a quarter
  of the time, and each holds what came in four times as long. Much of a commit's cost is per
  commit (a parquet file per partition, a log entry, the roll-ups of those files later): at
  40 MB/s of 1 KB records (Kafka's ProducerPerformance) the gateway's CPU a record fell by a
  fifth to a third. A request to an idle topic does not wait, nor does the next request of a
  producer that waits for each answer (its flush held it alone, and nothing came in meanwhile).
- A request is all-or-nothing: it is in exactly one commit, or its Future carries the error.
- Above `max_queue_bytes` waiting, `submit()` raises BackPressureError (HTTP 429 + Retry-After).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass

from delta_log.errors import BackPressureError, WriterClosedError
from delta_log.log.writer import AppendRequest, AppendResult, TopicWriter

log = logging.getLogger(__name__)


#: Under load a flush waits this many times as long as the one before took (see the module doc;
#: measured at 40 MB/s: 1 cut the CPU a record by a tenth, 3 by a third).
GAP_FACTOR = 3.0
#: ... and only while less than this waits: a flush of 4 MiB pays its per-commit cost over enough
#: records (and its files are as large as a first roll-up's). Measured with Kafka's
#: ProducerPerformance at saturation (5 requests of 1 MB in flight), 4 alternating pairs: 1 MiB
#: made 263-350 commits at 8.6-12.6 us of CPU a record, 4 MiB 128-146 at 7.6-9.7, throughput even
GAP_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class FlushStats:
    topic: str
    requests: int
    records: int
    bytes: int
    seconds: float
    ok: bool


def resolve(
    fut: Future[AppendResult], *, result: AppendResult | None = None, error: BaseException | None = None
) -> None:
    """Answer one request; a request whose caller gave up (its Future cancelled) is skipped, never
    allowed to stop the answers to the others of its flush."""
    if fut.done():
        return
    if error is None and result is not None and result.error is not None:
        error = result.error
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:  # cancelled meanwhile
        pass


def _lower_priority(nice: int) -> None:
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except (OSError, AttributeError):  # (not Linux: the threads keep the process's priority)
        log.debug("could not lower a flush thread's priority", exc_info=True)


class FlushPool:
    """Threads shared by the group committers of many topics."""

    def __init__(self, threads: int, *, name: str = "flush", nice: int = 0) -> None:
        """`nice`: how much lower the threads' CPU priority is than the process's (Linux: per thread),
        for work nobody waits on, so that it yields the cores to the threads answering requests."""
        self._executor = ThreadPoolExecutor(
            max_workers=threads,
            thread_name_prefix=name,
            initializer=functools.partial(_lower_priority, nice) if nice else None,
        )

    def submit(self, fn: Callable[[], None]) -> None:
        self._executor.submit(fn)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class GroupCommitter:
    """Batches append requests for one topic into as few Delta commits as possible."""

    def __init__(
        self,
        writer: TopicWriter,
        *,
        linger_s: float,
        batch_bytes: int,
        max_queue_bytes: int,
        on_flush: Callable[[FlushStats], None] | None = None,
        pool: FlushPool | None = None,
        max_gap_s: float = 0.0,
    ) -> None:
        self.writer = writer
        self.linger_s = linger_s
        self.max_gap_s = max_gap_s
        self._gap_until = 0.0  # monotonic: the next flush starts no sooner (unless batch_bytes wait)
        self.batch_bytes = batch_bytes
        self.max_queue_bytes = max_queue_bytes
        self.on_flush = on_flush
        self._own_pool = pool is None
        self._pool = pool or FlushPool(1, name=f"group-commit-{writer.topic}")
        self._cond = threading.Condition()
        self._queue: deque[tuple[AppendRequest, int, Future[AppendResult], float]] = deque()
        self._queued_bytes = 0
        self._urgent = 0  # queued requests that want no lingering (AppendRequest.urgent)
        self._closed = False
        self._scheduled = False  # a flush of this topic is queued on, or running in, the pool
        self.last_used = time.monotonic()

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def submit(self, request: AppendRequest) -> Future[AppendResult]:
        """Queue one request. Raises: BackPressureError, WriterClosedError."""
        size = request.batch.nbytes
        fut: Future[AppendResult] = Future()
        with self._cond:
            if self._closed:
                raise WriterClosedError(f"The writer of topic {self.writer.topic!r} is closed.")
            if self._queue and self._queued_bytes + size > self.max_queue_bytes:
                raise BackPressureError(
                    f"Topic {self.writer.topic!r} has {self._queued_bytes} bytes waiting to be written.",
                    topic=self.writer.topic,
                    queued_bytes=self._queued_bytes,
                )
            now = time.monotonic()
            self._queue.append((request, size, fut, now))
            self._queued_bytes += size
            self._urgent += request.urgent
            self.last_used = now
            self._cond.notify_all()  # a flush lingering for more
            schedule = not self._scheduled
            self._scheduled = True
        if schedule and not self._schedule():
            raise WriterClosedError(f"The writer of topic {self.writer.topic!r} is closed.")
        return fut

    def _schedule(self) -> bool:
        """Queue this topic's next flush on the pool; if the pool is shut down, fail what waits."""
        try:
            self._pool.submit(self._flush_next)
            return True
        except RuntimeError:  # the process is shutting down
            with self._cond:
                left = list(self._queue)
                self._queue.clear()
                self._queued_bytes = 0
                self._urgent = 0
                self._scheduled = False
                self._closed = True
                self._cond.notify_all()
            for _, _, fut, _ in left:
                resolve(fut, error=WriterClosedError(f"The writer of topic {self.writer.topic!r} is closed."))
            return False

    @property
    def busy(self) -> bool:
        """Requests are waiting or being flushed."""
        return self._scheduled

    def _take(self) -> list[tuple[AppendRequest, int, Future[AppendResult], float]]:
        with self._cond:
            if not self._queue:
                return []
            lingered = self._queue[0][3] + self.linger_s
            while not self._closed and not self._urgent and self._queued_bytes < self.batch_bytes:
                # the gap is waited out only while a flush would be small (GAP_BYTES)
                deadline = lingered if self._queued_bytes >= GAP_BYTES else max(lingered, self._gap_until)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            taken: list[tuple[AppendRequest, int, Future[AppendResult], float]] = []
            size = 0
            while self._queue and (not taken or size + self._queue[0][1] <= self.batch_bytes):
                item = self._queue.popleft()
                taken.append(item)
                size += item[1]
                self._urgent -= item[0].urgent
            self._queued_bytes -= size
            return taken

    def _flush_next(self) -> None:
        """One flush on a pool thread; then the next one goes to the back of the pool's line."""
        try:
            taken = self._take()
            if taken:
                self._flush(taken)
        except Exception:  # the pool drops a task's exception: say it here
            log.exception("group commit of topic %s failed", self.writer.topic)
        finally:
            with self._cond:
                again = bool(self._queue)
                self._scheduled = again
                self._cond.notify_all()  # close() waits for the last flush
            if again:
                self._schedule()

    def _flush(self, taken: list[tuple[AppendRequest, int, Future[AppendResult], float]]) -> None:
        requests = [t[0] for t in taken]
        nbytes = sum(t[1] for t in taken)
        start = time.monotonic()  # one clock for the gap (compared in _take) and the report
        try:
            results = self.writer.append_many(requests)
        except BaseException as exc:  # resolve every future; the pool thread must survive
            for _, _, fut, _ in taken:
                resolve(fut, error=exc)
            self._report(requests, nbytes, start, ok=False)
            return
        ended = time.monotonic()
        with self._cond:
            # only for a stream that goes on without waiting for the answers (requests came in
            # during the flush, or it held several): a producer that waits for each answer before
            # its next request would only be slowed
            stream = bool(self._queue) or len(taken) > 1
        self._gap_until = ended + min(GAP_FACTOR * (ended - start), self.max_gap_s) if stream else 0.0
        for (_, _, fut, _), result in zip(taken, results, strict=True):
            resolve(fut, result=result)
        self._report(requests, nbytes, start, ok=True)

    def _report(self, requests: list[AppendRequest], nbytes: int, start: float, *, ok: bool) -> None:
        if self.on_flush is None:
            return
        try:
            self.on_flush(
                FlushStats(
                    topic=self.writer.topic,
                    requests=len(requests),
                    records=sum(r.batch.num_rows for r in requests),
                    bytes=nbytes,
                    seconds=time.monotonic() - start,
                    ok=ok,
                )
            )
        except Exception:
            log.exception("on_flush listener failed")

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new requests, and wait until what is queued is flushed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._scheduled and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
        if self._own_pool:
            self._pool.close()
