"""Idempotent producers: ids, sequences, and which requests of a flush to append (pure).

A producer sends (producer id, sequence); the log keeps, per (producer, partition), the last
committed sequence and the base offset it got (see delta_log.table.app_transactions). A request
whose sequence is already committed is answered with its original offsets and writes nothing; an
older sequence than the last committed one is refused (its offsets are no longer known).

Kafka's producers number records, not requests: a batch carries its first sequence, and the next
batch of the partition must start right after the last record of the one before. Such a request
gives `first_sequence` (its `sequence` is the batch's LAST record's sequence, so a retry of the
last batch is recognized by it); one whose first sequence does not follow the producer's last
sequence on the partition is refused (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER). Without state (a new
producer) any first sequence is taken, as Kafka does since KIP-360.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from delta_log.core.records import PartitionRange
from delta_log.errors import DuplicateSequenceError, InvalidRecordError, OutOfOrderSequenceError

_PRODUCER_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
#: Sequences are Delta txn versions (int64); Kafka's own are int32, so this is never the limit.
MAX_SEQUENCE = 2**63 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerSequence:
    """An idempotent producer's id and the sequence number of one request.

    Raises (on construction): InvalidRecordError for a malformed id or a sequence out of range.
    """

    producer_id: str
    sequence: int
    #: Kafka's batches: the sequence of the batch's first record (`sequence` is its last record's);
    #: it must follow the producer's last sequence on the partition
    first_sequence: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.producer_id, str) or not _PRODUCER_ID.fullmatch(self.producer_id):
            raise InvalidRecordError("Producer id must be 1-128 characters from [A-Za-z0-9._:-].")
        if not 0 <= self.sequence <= MAX_SEQUENCE:
            raise InvalidRecordError(
                f"Producer sequence must be between 0 and {MAX_SEQUENCE}.", sequence=str(self.sequence)
            )
        if self.first_sequence is not None and not 0 <= self.first_sequence <= self.sequence:
            raise InvalidRecordError(
                f"A batch's first sequence must be between 0 and its last ({self.sequence}).",
                sequence=str(self.first_sequence),
            )

    def follows(self, last: int) -> bool:
        """Whether this batch may come after `last`, the producer's last sequence on a partition."""
        return self.first_sequence is None or self.first_sequence == last + 1


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
        f"its last was {last}, so {last + 1} was expected.",
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
    flush_seq: dict[tuple[str, int], int] = {}  # (producer, partition) -> highest sequence appended here
    for i, (producer, part_counts) in enumerate(zip(producers, counts, strict=True)):
        if producer is None:
            append.append(i)
            continue
        key = (producer.producer_id, producer.sequence, frozenset(part_counts))
        if key in first_of:
            same_as[i] = first_of[key]
            continue
        ranges: list[PartitionRange] = []
        older: DuplicateSequenceError | OutOfOrderSequenceError | None = None
        for partition in part_counts:
            st = state.get((producer.producer_id, partition))
            if st is None or st.last_sequence < producer.sequence:
                last = flush_seq.get((producer.producer_id, partition), st.last_sequence if st else None)
                if last is not None and last < producer.sequence and not producer.follows(last):
                    older = _gap(producer, last, partition)
                    break
                continue
            if st.last_sequence > producer.sequence:
                older = _older(producer, st.last_sequence, f"its last committed sequence on partition {partition},")
                break
            ranges.append(
                PartitionRange(partition=partition, base_offset=st.base_offset, count=part_counts.get(partition, 0))
            )
        if older is not None:
            refused[i] = older
            continue
        if ranges:
            committed[i] = tuple(ranges)
            continue
        newer = max((flush_seq.get((producer.producer_id, p), -1) for p in part_counts), default=-1)
        if newer > producer.sequence:  # an older sequence behind a newer one in this flush
            refused[i] = _older(producer, newer, "a sequence earlier in this flush,")
            continue
        for p in part_counts:
            flush_seq[(producer.producer_id, p)] = producer.sequence
        first_of[key] = i
        append.append(i)
    return FlushPlan(append=tuple(append), committed=committed, refused=refused, same_as=same_as)
