"""Kafka's transaction coordinator rules (delta_log.core.transactions): epochs, fencing, the
states a transaction passes through, and the errors a client is told."""

from __future__ import annotations

import itertools

import pytest

from delta_log.core import transactions as rules
from delta_log.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidRecordError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
)

_ids = itertools.count(100)


def _init(current, *, timeout_ms=60_000, expected=None, now_ms=1_000):
    return rules.init_producer_id(
        current,
        "tx",
        timeout_ms,
        max_timeout_ms=900_000,
        expected=expected,
        new_producer_id=lambda: next(_ids),
        now_ms=now_ms,
    )


def test_a_new_id_gets_a_producer_id_at_epoch_0_and_each_init_bumps_the_epoch():
    first = _init(None).txn
    assert (first.producer_epoch, first.state) == (0, rules.EMPTY)
    again = _init(first).txn
    assert (again.producer_id, again.producer_epoch, again.last_producer_epoch) == (first.producer_id, 1, 0)


def test_the_epoch_rotates_to_a_new_producer_id_when_exhausted():
    worn = rules.Txn(transactional_id="tx", producer_id=7, producer_epoch=rules.MAX_EPOCH, timeout_ms=1000)
    nxt = _init(worn).txn
    assert nxt.producer_id != 7 and nxt.producer_epoch == 0


def test_timeouts_and_ids_out_of_bounds_are_refused():
    with pytest.raises(InvalidTransactionTimeoutError):
        _init(None, timeout_ms=0)
    with pytest.raises(InvalidTransactionTimeoutError):
        _init(None, timeout_ms=900_001)
    with pytest.raises(InvalidRecordError):
        rules.init_producer_id(
            None, "", 1000, max_timeout_ms=10_000, expected=None, new_producer_id=lambda: 1, now_ms=0
        )


def test_a_transaction_opens_on_its_first_add_and_grows_without_a_new_number():
    t = _init(None).txn
    opened = rules.add(t, "tx", t.producer_id, 0, partitions=[("a", 0)], now_ms=5)
    assert (opened.state, opened.number, opened.start_ms) == (rules.ONGOING, 1, 5)
    same = rules.add(opened, "tx", t.producer_id, 0, partitions=[("a", 0)], now_ms=6)
    assert same is opened  # nothing new: nothing to save
    grown = rules.add(opened, "tx", t.producer_id, 0, groups=["g"], now_ms=7)
    assert grown.groups == {"g"} and grown.number == 1 and grown.start_ms == 5


def test_an_older_epoch_is_fenced_and_another_producer_id_is_not_the_ids():
    t = _init(_init(None).txn).txn  # epoch 1
    with pytest.raises(ProducerFencedError):
        rules.add(t, "tx", t.producer_id, 0, partitions=[("a", 0)], now_ms=1)
    with pytest.raises(InvalidProducerIdMappingError):
        rules.add(t, "tx", t.producer_id + 1, 1, partitions=[("a", 0)], now_ms=1)
    with pytest.raises(InvalidProducerIdMappingError):
        rules.end(None, "tx", 1, 0, commit=True, now_ms=1)


def test_end_decides_once_and_a_retry_of_the_same_decision_is_answered_again():
    t = _init(None).txn
    opened = rules.add(t, "tx", t.producer_id, 0, partitions=[("a", 0)], now_ms=5)
    ending = rules.end(opened, "tx", t.producer_id, 0, commit=True, now_ms=9)
    assert ending.txn.state == rules.PREPARE_COMMIT and not ending.retry
    with pytest.raises(ConcurrentTransactionsError):  # being completed
        rules.end(ending.txn, "tx", t.producer_id, 0, commit=True, now_ms=9)
    with pytest.raises(ConcurrentTransactionsError):  # the next transaction must wait for it too
        rules.add(ending.txn, "tx", t.producer_id, 0, partitions=[("a", 0)], now_ms=9)
    done = rules.complete(ending.txn, now_ms=10)
    assert (done.state, done.partitions, done.start_ms) == (rules.COMPLETE_COMMIT, frozenset(), -1)
    assert rules.end(done, "tx", t.producer_id, 0, commit=True, now_ms=11).retry
    with pytest.raises(InvalidTxnStateError):  # the other decision
        rules.end(done, "tx", t.producer_id, 0, commit=False, now_ms=11)
    with pytest.raises(InvalidTxnStateError):  # nothing open
        rules.end(t, "tx", t.producer_id, 0, commit=False, now_ms=11)


def test_a_new_producer_of_an_open_transaction_fences_it_then_gets_the_next_epoch():
    t = _init(None).txn
    opened = rules.add(t, "tx", t.producer_id, 0, partitions=[("a", 0)], now_ms=5)
    out = _init(opened)
    assert out.fence and out.txn is opened
    aborting = rules.fence_and_abort(opened, now_ms=6)
    assert (aborting.state, aborting.producer_epoch, aborting.last_producer_epoch) == (rules.PREPARE_ABORT, 1, 0)
    with pytest.raises(ConcurrentTransactionsError):
        _init(aborting)
    aborted = rules.complete(aborting, now_ms=7)
    assert _init(aborted).txn.producer_epoch == 2
    with pytest.raises(ProducerFencedError):  # the fenced producer cannot decide any more
        rules.end(aborted, "tx", t.producer_id, 0, commit=True, now_ms=8)


def test_a_retried_epoch_bump_is_answered_with_the_same_epoch():
    t = _init(None).txn
    bumped = _init(t, expected=(t.producer_id, 0)).txn
    assert bumped.producer_epoch == 1
    assert _init(bumped, expected=(t.producer_id, 0)).txn.producer_epoch == 1  # the answer was lost
    with pytest.raises(ProducerFencedError):
        _init(bumped, expected=(t.producer_id + 1, 1))


def test_only_an_open_transaction_times_out_and_its_state_round_trips():
    t = _init(None).txn
    assert not rules.timed_out(t, 10**12)
    opened = rules.add(t, "tx", t.producer_id, 0, partitions=[("a", 1)], groups=["g"], now_ms=1_000)
    assert not rules.timed_out(opened, 60_999) and rules.timed_out(opened, 61_000)
    assert rules.Txn.of(opened.snapshot()) == opened


def _bump():
    return next(_ids)


def test_version_2_end_bumps_the_epoch_and_answers_a_retry_of_it():
    t = _init(None).txn
    t = rules.add(t, "tx", t.producer_id, 0, partitions=[("a", 0)], now_ms=2_000)
    decided = rules.end(t, "tx", t.producer_id, 0, commit=True, now_ms=3_000, bump=_bump).txn
    assert (decided.state, decided.producer_id, decided.producer_epoch) == (rules.PREPARE_COMMIT, t.producer_id, 1)
    done = rules.complete(decided, now_ms=4_000)
    # the answer was lost: the producer asks again with the epoch it had, and is told the same
    again = rules.end(done, "tx", t.producer_id, 0, commit=True, now_ms=5_000, bump=_bump)
    assert again.retry and again.txn.producer_epoch == 1
    # while deciding, a retry waits; the other decision under the old epoch is refused
    with pytest.raises(ConcurrentTransactionsError):
        rules.end(decided, "tx", t.producer_id, 0, commit=True, now_ms=5_000, bump=_bump)
    with pytest.raises(InvalidTxnStateError):
        rules.end(done, "tx", t.producer_id, 0, commit=False, now_ms=5_000, bump=_bump)
    # the next transaction writes under the new epoch; the old one is fenced once it began
    nxt = rules.add(done, "tx", t.producer_id, 1, partitions=[("a", 0)], now_ms=6_000)
    assert nxt.state == rules.ONGOING and nxt.number == t.number + 1
    with pytest.raises(ProducerFencedError):
        rules.add(nxt, "tx", t.producer_id, 0, partitions=[("a", 1)], now_ms=6_000)
    with pytest.raises(ProducerFencedError):
        rules.end(nxt, "tx", t.producer_id, 0, commit=True, now_ms=6_000, bump=_bump)


def test_version_2_abort_with_nothing_open_bumps_and_a_commit_of_nothing_is_refused():
    t = _init(None).txn
    aborted = rules.end(t, "tx", t.producer_id, 0, commit=False, now_ms=2_000, bump=_bump).txn
    assert (aborted.state, aborted.producer_epoch) == (rules.PREPARE_ABORT, 1)
    with pytest.raises(InvalidTxnStateError):
        rules.end(t, "tx", t.producer_id, 0, commit=True, now_ms=2_000, bump=_bump)
    # version 1 keeps its rule: an abort needs an open transaction
    with pytest.raises(InvalidTxnStateError):
        rules.end(t, "tx", t.producer_id, 0, commit=False, now_ms=2_000)


def test_version_2_end_at_the_last_epoch_moves_to_a_new_producer_id_and_knows_a_retry_by_the_old():
    worn = rules.Txn(transactional_id="tx", producer_id=7, producer_epoch=rules.MAX_EPOCH, timeout_ms=1000)
    t = rules.add(worn, "tx", 7, rules.MAX_EPOCH, partitions=[("a", 0)], now_ms=1)
    done = rules.complete(rules.end(t, "tx", 7, rules.MAX_EPOCH, commit=True, now_ms=2, bump=_bump).txn, now_ms=3)
    assert done.producer_id != 7 and done.producer_epoch == 0 and done.previous_producer_id == 7
    again = rules.end(done, "tx", 7, rules.MAX_EPOCH, commit=True, now_ms=4, bump=_bump)
    assert again.retry and again.txn.producer_id == done.producer_id
    assert rules.Txn.of(done.snapshot()) == done


def test_version_2_commit_of_a_transaction_the_timeout_aborted_is_refused():
    t = _init(None).txn
    t = rules.add(t, "tx", t.producer_id, 0, partitions=[("a", 0)], now_ms=2_000)
    aborted = rules.complete(rules.fence_and_abort(t, now_ms=70_000), now_ms=70_001)
    with pytest.raises(InvalidTxnStateError):
        rules.end(aborted, "tx", t.producer_id, 0, commit=True, now_ms=70_002, bump=_bump)
    # its abort is what happened: answered as done, with the epoch the producer goes on with
    assert rules.end(aborted, "tx", t.producer_id, 0, commit=False, now_ms=70_002, bump=_bump).retry
