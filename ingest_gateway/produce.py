"""Produce: decoded table -> partitioned, validated AppendRequest -> per-record offsets.

Pure except for reading the topic's config and sticky partition from the registry.

In a cluster each partition has one owner gateway (rendezvous hashing, consumer_api.cluster), which
appends to it; `Placement` is this gateway's view of the owners. Records without a key or partition
go to partitions this gateway owns; a request whose partitions another gateway owns alone is sent
there (ingest_gateway.produce_forwarding). Ownership only steers the writes: Delta's transaction
rule keeps offsets unique whoever appends, so a request spanning several owners is appended here.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from consumer_api.params import DIGITS
from delta_log.core.dead_letters import Split
from delta_log.core.partitioner import idempotent_null_key_partition, partitioned_batch
from delta_log.core.producer import ProducerSequence
from delta_log.core.records import offsets_for_rows
from delta_log.core.topic_config import TopicConfig
from delta_log.core.value_schemas import subject_for
from delta_log.errors import InvalidRecordError, TopicExistsError, TopicNotFoundError
from delta_log.log.writer import AppendRequest, AppendResult
from delta_log.registry import TopicRegistry


def producer_from_headers(
    producer_id: str | None, producer_sequence: str | None, idempotency_key: str | None
) -> ProducerSequence | None:
    """Raises: InvalidRecordError for a half-given or malformed pair."""
    if idempotency_key is not None:
        if producer_id is not None or producer_sequence is not None:
            raise InvalidRecordError("Send either Idempotency-Key or Producer-Id + Producer-Sequence, not both.")
        if not 1 <= len(idempotency_key) <= 256:
            raise InvalidRecordError("Idempotency-Key must be 1-256 characters.")
        digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]
        return ProducerSequence(producer_id=f"ik.{digest}", sequence=0)
    if producer_id is None and producer_sequence is None:
        return None
    if producer_id is None or producer_sequence is None:
        raise InvalidRecordError("Producer-Id and Producer-Sequence must be sent together.")
    if not re.fullmatch(DIGITS, producer_sequence):
        raise InvalidRecordError("Producer-Sequence must be an integer 0..999999999999999 (plain digits).")
    return ProducerSequence(producer_id=producer_id, sequence=int(producer_sequence))


@dataclass(frozen=True, slots=True)
class Placement:
    """Which gateway owns each partition of a topic, as this gateway sees the cluster."""

    me: str
    owners_of: Callable[[int], Sequence[str | None]]  # partition count -> owner gateway id per partition


def has_value_schema(registry: TopicRegistry, topic: str) -> bool:
    """Whether `topic` has a value schema, as the registry was last read (no I/O)."""
    return registry.schemas.cached().subject_schemas(subject_for(topic)) is not None


def prepare(
    registry: TopicRegistry,
    topic: str,
    table: pa.Table,
    producer: ProducerSequence | None,
    placement: Placement | None = None,
) -> PreparedRequest:
    """Assign partitions (explicit, key hash or sticky) and validate against the topic's config.

    Raises: TopicNotFoundError, PartitionNotFoundError, RecordTooLargeError, InvalidSchemaError.
    """
    reader = registry.reader(topic)
    config = reader.config
    n = config.partitions
    owners = placement.owners_of(n) if placement is not None else ()
    if producer is not None:
        # the same partition whichever gateway a retry reaches: the owner sees it was written
        sticky = idempotent_null_key_partition(producer.producer_id, producer.sequence, n)
    else:
        mine = [p for p, o in enumerate(owners) if placement is not None and o == placement.me]
        sticky = registry.sticky_partition(topic, n, advance=True, among=mine)
    batch, parts, sorted_parts = partitioned_batch(
        table, config, topic=topic, null_key_partition=sticky, now_us=int(time.time() * 1_000_000)
    )
    append = AppendRequest(batch=batch, producer=producer, partitions=sorted_parts)
    owner = None
    if placement is not None and len(sorted_parts):
        targets = {owners[p] for p in np.unique(sorted_parts).tolist()}
        if len(targets) == 1 and (only := targets.pop()) not in (None, placement.me):
            owner = only
    return PreparedRequest(append=append, partitions=parts, owner=owner)


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedRequest:
    append: AppendRequest
    partitions: np.ndarray  # partition of each record, in the client's order
    owner: str | None = None  # the other gateway that owns every partition written, if one does


def record_offset_columns(request: PreparedRequest, result: AppendResult) -> tuple[list[int], list[int]]:
    """Partition and offset of every record, in the client's order (stable sort keeps ranks)."""
    parts = request.partitions
    bases = {r.partition: r.base_offset for r in result.ranges}
    order, offsets = offsets_for_rows(parts, bases)
    out = np.empty(len(parts), dtype=np.int64)
    out[order] = offsets
    return parts.tolist(), out.tolist()


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """A request's records that failed the topic's value schema, ready for the dead-letter topic."""

    topic: str
    split: Split
    append: PreparedRequest


def prepare_dead_letters(
    registry: TopicRegistry, topic: str, split: Split, config: TopicConfig, producer: ProducerSequence | None
) -> DeadLetters:
    """Partition the dead letters for the topic's dead-letter topic, created (with the topic's
    partition count) on first use. An idempotent producer's retry finds them written once there too.

    Raises: InvalidConfigError (no dead-letter topic name fits), StorageUnavailableError.
    """
    dlq = config.dead_letter_topic(topic)
    assert dlq is not None, "only a topic with errors.tolerance=all splits its requests"
    try:
        registry.reader(dlq)
    except TopicNotFoundError:
        with contextlib.suppress(TopicExistsError):  # another request (or gateway) created it first
            registry.catalog.create_topic(dlq, partitions=config.partitions)
    # the dead letters' own producer: sequences are per source topic, and two topics may share a
    # dead-letter topic (their producers' sequence 7 are different requests)
    own = None
    if producer is not None:
        digest = hashlib.sha256(f"{producer.producer_id}\0{topic}".encode()).hexdigest()[:40]
        own = ProducerSequence(producer_id=f"dlq.{digest}", sequence=producer.sequence)
    return DeadLetters(dlq, split, prepare(registry, dlq, split.dead, own))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    index: int  # in the request
    partition: int  # of the dead-letter topic
    offset: int
    reason: str


def dead_letter_entries(dead: DeadLetters, result: AppendResult) -> list[DeadLetter]:
    """Each dead letter's index in the request, where it went and why, in request order."""
    parts, offsets = record_offset_columns(dead.append, result)
    return [
        DeadLetter(int(i), p, o, why)
        for i, p, o, why in zip(dead.split.dead_indexes.tolist(), parts, offsets, dead.split.reasons, strict=True)
    ]
