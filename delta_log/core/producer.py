"""Idempotent producers: ids, sequences, and which requests of a flush to append (pure).

A producer sends (producer id, sequence); the log keeps, per (producer, partition), the last
committed sequence and the base offset it got (see delta_log.table.app_transactions). A request
whose sequence is already committed is answered with its original offsets and writes nothing; an
older sequence than the last committed one is refused (its offsets are no longer known).

Kafka's producers number records, not requests: a batch carries its first sequence, and the next
batch of the partition must start right after the last record of the one before. Such a request
gives `first_sequence` (its `sequence` is the batch's LAST record's sequence, so a retry of the
last batch is recognized by it); one whose first sequence does not follow the producer's last
sequence on the partition is refused (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER), and so is a first batch
that does not start at 0 (every producer id and epoch starts there: a later batch never overtakes
a lost first one). Kafka's sequences are int32 and wrap to 0; they are compared modulo 2**31.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from delta_log.core.records import PartitionRange
from delta_log.errors import DuplicateSequenceError, InvalidRecordError, OutOfOrderSequenceError

_PRODUCER_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
#: Sequences are Delta txn versions (int64); Kafka's own are int32, so this is never the limit.
MAX_SEQUENCE = 2**63 - 1


#: Kafka's sequences are int32 and wrap from 2**31 - 1 to 0.
KAFKA_SEQUENCES = 2**31

Relation = Literal["same", "next", "behind", "gap"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerSequence:
    """An idempotent producer's id and the sequence number of one request.

    Raises (on construction): InvalidRecordError for a malformed id or a sequence out of range.
    """

    producer_id: str
    sequence: int
    #: Kafka's batches: the sequence of the batch's first record (`sequence` is its last record's,
    #: both modulo KAFKA_SEQUENCES); it must follow the producer's last sequence on the partition
    first_sequence: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.producer_id, str) or not _PRODUCER_ID.fullmatch(self.producer_id):
            raise InvalidRecordError("Producer id must be 1-128 characters from [A-Za-z0-9._:-].")
        top = MAX_SEQUENCE if self.first_sequence is None else KAFKA_SEQUENCES - 1
        for value in (self.sequence, self.first_sequence):
            if value is not None and not 0 <= value <= top:
                raise InvalidRecordError(f"Producer sequence must be between 0 and {top}.", sequence=str(value))

    def relation(self, last: int) -> Relation:
        """Where this request stands to `last`, the producer's last sequence on a partition: the
        same request again, the next one, an older one, or (Kafka's batches) one after a gap.
        Requests without a first sequence may skip ahead; Kafka's batches compare modulo 2**31."""
        if self.first_sequence is None:
            return "same" if self.sequence == last else ("behind" if self.sequence < last else "next")
        if self.sequence == last:
            return "same"
        if (self.first_sequence - last) % KAFKA_SEQUENCES == 1:
            return "next"
        behind = (last - self.sequence) % KAFKA_SEQUENCES
        return "behind" if behind < KAFKA_SEQUENCES // 2 else "gap"

    @property
    def may_start(self) -> bool:
        """Whether this request may be a producer's first on a partition (Kafka's: sequence 0;
        every producer id and epoch starts there, so a later batch cannot overtake a lost first)."""
        return self.first_sequence is None or self.first_sequence == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerState:
    """What the log holds for one producer on one partition."""

    last_sequence: int
    base_offset: int  # -1 when unknown


@dataclass(frozen=True, slots=True, kw_only=True)
class FlushPlan:
    """What to do with each request of one flush.

    - `append`: indexes to append, in arrival order;
    - `committed`: already committed requests, with their original ranges (answered as duplicates);
    - `refused`: requests refused on their own (an older sequence);
    - `same_as`: the same (producer, sequence) twice in one flush (a client retry): index -> the index
      of its first copy, whose result it shares.
    """

    append: tuple[int, ...]
    committed: Mapping[int, tuple[PartitionRange, ...]] = field(default_factory=dict)
    refused: Mapping[int, DuplicateSequenceError | OutOfOrderSequenceError] = field(default_factory=dict)
    same_as: Mapping[int, int] = field(default_factory=dict)


def _older(producer: ProducerSequence, last: int, where: str) -> DuplicateSequenceError:
    return DuplicateSequenceError(
        f"Sequence {producer.sequence} of producer {producer.producer_id!r} is older than {where} {last}.",
        producer_id=producer.producer_id,
        sequence=producer.sequence,
        last_sequence=last,
    )


def _gap(producer: ProducerSequence, last: int, partition: int) -> OutOfOrderSequenceError:
    return OutOfOrderSequenceError(
        f"Producer {producer.producer_id!r} sent sequence {producer.first_sequence} on partition {partition}; "
        f"its last was {last}, so {(last + 1) % KAFKA_SEQUENCES} was expected.",
        producer_id=producer.producer_id,
        sequence=producer.first_sequence,
        last_sequence=last,
    )


def plan_flush(
    producers: Sequence[ProducerSequence | None],
    counts: Sequence[Mapping[int, int]],
    state: Mapping[tuple[str, int], ProducerState],
) -> FlushPlan:
    """Decide, for the requests of one flush, which to append (pure).

    `producers[i]` and `counts[i]` (partition -> records) describe request i; `state` holds the
    log's `ProducerState` for every (producer id, partition) the requests touch (absent: never
    committed there).
    """
    append: list[int] = []
    committed: dict[int, tuple[PartitionRange, ...]] = {}
    refused: dict[int, DuplicateSequenceError | OutOfOrderSequenceError] = {}
    same_as: dict[int, int] = {}
    first_of: dict[tuple[str, int, frozenset[int]], int] = {}
    flush_seq: dict[tuple[str, int], int] = {}  # (producer, partition) -> last sequence appended in this flush
    for i, (producer, part_counts) in enumerate(zip(producers, counts, strict=True)):
        if producer is None:
            append.append(i)
            continue
        key = (producer.producer_id, producer.sequence, frozenset(part_counts))
        if key in first_of:
            same_as[i] = first_of[key]
            continue
        ranges: list[PartitionRange] = []
        problem: DuplicateSequenceError | OutOfOrderSequenceError | None = None
        for partition in part_counts:
            pending = flush_seq.get((producer.producer_id, partition))
            st = state.get((producer.producer_id, partition))
            if pending is not None:  # an earlier request of this flush: this one must come after it
                rel = producer.relation(pending)
                if rel in ("same", "behind"):
                    problem = _older(producer, pending, "a sequence earlier in this flush,")
                elif rel == "gap":
                    problem = _gap(producer, pending, partition)
            elif st is not None:
                rel = producer.relation(st.last_sequence)
                if rel == "same":  # a retry of the last request: answered with its offsets
                    ranges.append(
                        PartitionRange(
                            partition=partition, base_offset=st.base_offset, count=part_counts.get(partition, 0)
                        )
                    )
                elif rel == "behind":
                    problem = _older(
                        producer, st.last_sequence, f"its last committed sequence on partition {partition},"
                    )
                elif rel == "gap":
                    problem = _gap(producer, st.last_sequence, partition)
            elif not producer.may_start:
                problem = _gap(producer, -1, partition)
            if problem is not None:
                break
        if problem is not None:
            refused[i] = problem
            continue
        if ranges:
            committed[i] = tuple(ranges)
            continue
        for p in part_counts:
            flush_seq[(producer.producer_id, p)] = producer.sequence
        first_of[key] = i
        append.append(i)
    return FlushPlan(append=tuple(append), committed=committed, refused=refused, same_as=same_as)
