"""plan_flush: which requests of one flush an idempotent writer appends (pure)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.producer import MAX_SEQUENCE, ProducerSequence, ProducerState, plan_flush
from delta_log.errors import DuplicateSequenceError, InvalidRecordError, OutOfOrderSequenceError


def seq(n, pid="p"):
    return ProducerSequence(producer_id=pid, sequence=n)


def test_plain_requests_are_all_appended():
    plan = plan_flush([None, None], [{0: 2}, {1: 3}], {})
    assert plan.append == (0, 1) and not plan.committed and not plan.refused and not plan.same_as


def test_a_committed_sequence_is_answered_with_its_original_offsets():
    state = {("p", 0): ProducerState(last_sequence=4, base_offset=100)}
    plan = plan_flush([seq(4)], [{0: 3}], state)
    assert plan.append == ()
    [r] = plan.committed[0]
    assert (r.partition, r.base_offset, r.count) == (0, 100, 3)


def test_an_older_sequence_is_refused():
    state = {("p", 0): ProducerState(last_sequence=4, base_offset=100)}
    plan = plan_flush([seq(3)], [{0: 1}], state)
    assert isinstance(plan.refused[0], DuplicateSequenceError) and plan.append == ()


def test_the_same_request_twice_in_one_flush_is_written_once():
    plan = plan_flush([seq(5), seq(5)], [{0: 1}, {0: 1}], {})
    assert plan.append == (0,) and plan.same_as == {1: 0}


def test_an_older_sequence_behind_a_newer_one_in_the_flush_is_refused():
    plan = plan_flush([seq(6), seq(5)], [{0: 1}, {0: 1}], {})
    assert plan.append == (0,) and 1 in plan.refused


def test_other_producers_and_partitions_are_independent():
    state = {("p", 0): ProducerState(last_sequence=9, base_offset=0)}
    plan = plan_flush([seq(1, "q"), seq(10)], [{0: 1}, {0: 1}], state)
    assert plan.append == (0, 1)


@pytest.mark.parametrize("bad", [("", 0), ("bad id", 0), ("p", -1), ("p", MAX_SEQUENCE + 1), ("x" * 129, 0)])
def test_malformed_producers_are_refused(bad):
    with pytest.raises(InvalidRecordError):
        ProducerSequence(producer_id=bad[0], sequence=bad[1])


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5)), max_size=12))
def test_every_request_gets_exactly_one_outcome(requests):
    producers = [seq(n, pid) for pid, n in requests]
    plan = plan_flush(producers, [{0: 1}] * len(producers), {})
    outcomes = [*plan.append, *plan.committed, *plan.refused, *plan.same_as]
    assert sorted(outcomes) == list(range(len(producers)))
    appended = [(producers[i].producer_id, producers[i].sequence) for i in plan.append]
    assert len(appended) == len(set(appended))  # never twice in one commit


def batch(first, count, pid="k"):
    """A Kafka batch: sequences first .. first + count - 1."""
    return ProducerSequence(producer_id=pid, sequence=first + count - 1, first_sequence=first)


def test_a_kafka_batch_must_follow_the_last_sequence_on_its_partition():
    state = {("k", 0): ProducerState(last_sequence=9, base_offset=50)}
    assert plan_flush([batch(10, 5)], [{0: 5}], state).append == (0,)
    plan = plan_flush([batch(12, 5)], [{0: 5}], state)
    assert isinstance(plan.refused[0], OutOfOrderSequenceError) and plan.append == ()
    assert plan.refused[0].details["last_sequence"] == 9


def test_kafka_batches_in_one_flush_follow_each_other():
    plan = plan_flush([batch(0, 3), batch(3, 2), batch(9, 1)], [{0: 3}, {0: 2}, {0: 1}], {})
    assert plan.append == (0, 1) and isinstance(plan.refused[2], OutOfOrderSequenceError)


def test_a_retried_kafka_batch_is_answered_with_its_offsets_and_an_older_one_is_a_duplicate():
    state = {("k", 0): ProducerState(last_sequence=9, base_offset=50)}
    [r] = plan_flush([batch(5, 5)], [{0: 5}], state).committed[0]
    assert r.base_offset == 50
    assert isinstance(plan_flush([batch(0, 5)], [{0: 5}], state).refused[0], DuplicateSequenceError)


def test_a_new_kafka_producer_starts_at_zero_so_a_later_batch_never_overtakes_a_lost_first():
    assert plan_flush([batch(0, 2)], [{0: 2}], {}).append == (0,)
    assert isinstance(plan_flush([batch(7, 2)], [{0: 2}], {}).refused[0], OutOfOrderSequenceError)


def test_kafka_sequences_wrap_at_2_31():
    top = 2**31 - 1
    state = {("k", 0): ProducerState(last_sequence=top - 10, base_offset=500)}
    wrapping = ProducerSequence(producer_id="k", sequence=89, first_sequence=top - 9)  # top-9 .. top, 0 .. 89
    assert plan_flush([wrapping], [{0: 100}], state).append == (0,)
    after = {("k", 0): ProducerState(last_sequence=89, base_offset=510)}
    assert plan_flush([batch(90, 5)], [{0: 5}], after).append == (0,)
    [r] = plan_flush([wrapping], [{0: 100}], after).committed[0]  # the wrapping batch retried
    assert r.base_offset == 510
    older = ProducerSequence(producer_id="k", sequence=top - 10, first_sequence=top - 20)
    assert isinstance(plan_flush([older], [{0: 11}], after).refused[0], DuplicateSequenceError)


def test_one_kafka_producers_batches_for_two_partitions_with_the_same_sequences_are_both_appended():
    # Kafka numbers records per partition: partition 0's and partition 1's first batches are both 0..9
    plan = plan_flush([batch(0, 10), batch(0, 10)], [{0: 10}, {1: 10}], {})
    assert plan.append == (0, 1) and not plan.same_as
