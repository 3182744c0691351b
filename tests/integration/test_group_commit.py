"""The group commit's gap under load (delta_log.log.group_commit): a small flush right after another
waits GAP_FACTOR times as long as that one took, and takes what came meanwhile in one commit."""

import dataclasses
import time

import pytest

from delta_log import AppendRequest, TopicWriter
from delta_log.log.group_commit import GAP_BYTES, GAP_FACTOR, FlushStats, GroupCommitter
from tests.integration.conftest import make_batch

FLUSH_S = 0.2  # each flush made this slow, so its gap (3x) is long next to the test's own delays


@pytest.fixture
def slow_committer(storage, settings, topic_factory):
    made: list[GroupCommitter] = []

    def make(max_gap_s: float) -> tuple[GroupCommitter, list[FlushStats], list[float]]:
        writer = TopicWriter(storage, topic_factory(), settings.writer)
        append_many = writer.append_many
        starts: list[float] = []  # when each flush began (monotonic): the gaps, apart from commit times

        def slow(requests):  # a flush that takes FLUSH_S, as a large or contended one does
            starts.append(time.monotonic())
            time.sleep(FLUSH_S)
            return append_many(requests)

        writer.append_many = slow  # type: ignore[method-assign]
        flushes: list[FlushStats] = []
        c = GroupCommitter(
            writer,
            linger_s=0.0,
            batch_bytes=64 * 1024 * 1024,
            max_queue_bytes=256 * 1024 * 1024,
            on_flush=flushes.append,
            max_gap_s=max_gap_s,
        )
        made.append(c)
        return c, flushes, starts

    yield make
    for c in made:
        c.close()


def _request(n: int = 10, value_size: int = 10) -> AppendRequest:
    return AppendRequest(batch=make_batch(n, value_size=value_size))


@pytest.mark.parametrize("max_gap_s", [0.0, 2.0])
def test_a_small_flush_after_a_busy_one_waits_the_gap_and_takes_what_came_meanwhile(slow_committer, max_gap_s):
    c, flushes, starts = slow_committer(max_gap_s)
    first = c.submit(_request())
    while c.queue_depth:  # the first is being flushed
        time.sleep(0.005)
    start = time.monotonic()
    second = c.submit(_request())  # came in during the first's flush: the topic is busy
    first.result(10)
    if max_gap_s:
        time.sleep(FLUSH_S / 2)  # well inside the gap after the first flush
    else:
        while c.queue_depth:  # the second is being flushed
            time.sleep(0.005)
    third = c.submit(_request())
    second.result(10)
    third.result(10)
    if max_gap_s:  # waited 3 x the first flush after it, then one commit for both
        assert [f.requests for f in flushes] == [1, 2]
        assert time.monotonic() - start >= GAP_FACTOR * FLUSH_S + FLUSH_S
    else:  # the second flushed at once; the third came during its flush and went next
        assert [f.requests for f in flushes] == [1, 1, 1]
        # the third began as the second ended, not a gap after it (timed apart from the commits,
        # which a loaded machine slows)
        second_ended = starts[1] + flushes[1].seconds
        assert starts[2] - second_ended < GAP_FACTOR * FLUSH_S
    assert [r.ranges[0].base_offset for r in (second.result(), third.result())] == [10, 20]


def test_a_producer_that_waits_for_each_answer_and_an_idle_topic_never_wait_the_gap(slow_committer):
    c, flushes, starts = slow_committer(2.0)
    for i in range(3):  # nothing comes in during these flushes: each next request goes at once
        start = time.monotonic()
        c.submit(_request()).result(10)
        assert starts[i] - start < GAP_FACTOR * FLUSH_S  # not a gap after the one before
    assert [f.requests for f in flushes] == [1, 1, 1]


def test_a_flush_of_gap_bytes_does_not_wait(slow_committer):
    c, flushes, starts = slow_committer(2.0)
    big = _request(n=GAP_BYTES // 1000 + 10, value_size=1000)
    assert big.batch.nbytes >= GAP_BYTES
    first = c.submit(_request())
    while c.queue_depth:
        time.sleep(0.005)
    c.submit(_request())  # during the first flush: the next waits the gap...
    first.result(10)
    start = time.monotonic()
    c.submit(big).result(10)  # ...unless enough records wait to pay for a commit
    assert starts[1] - start < GAP_FACTOR * FLUSH_S
    assert [f.requests for f in flushes] == [1, 2]


def test_an_urgent_request_waits_neither_the_gap_nor_the_linger(slow_committer):
    """A committed transaction's landing (AppendRequest.urgent): its producer's next transaction
    waits for it, so it is flushed as soon as the flush before ends, with what waits beside it."""
    c, flushes, starts = slow_committer(2.0)
    c.linger_s = 1.0
    first = c.submit(_request())
    while c.queue_depth:
        time.sleep(0.005)
    waiting = c.submit(_request())  # during the first flush: would wait the gap and the linger...
    first.result(10)
    start = time.monotonic()
    urgent = c.submit(dataclasses.replace(_request(), urgent=True))  # ...but an urgent one takes it along
    urgent.result(10)
    waiting.result(10)
    assert starts[1] - start < GAP_FACTOR * FLUSH_S and [f.requests for f in flushes] == [1, 2]
