"""Produce, whichever door a record came in by: decoded table -> schema check and dead-letter
split -> partitioned, validated AppendRequest -> appended -> per-record offsets.

Every rule of produce lives here; the HTTP route (ingest_gateway.routes.records) and the Kafka
listener (kafka_gateway) decode their bodies into an Arrow table, call `plan_produce` and
`append_plan`, and encode the answer. Pure except for reading the topic's config, sticky partition
and schemas from the registry, and the appends.

In a cluster each partition has one owner gateway (rendezvous hashing, broker.cluster), which
appends to it; `Placement` is this gateway's view of the owners. Records without a key or partition
go to partitions this gateway owns; a request whose partitions another gateway owns alone is sent
there (ingest_gateway.produce_forwarding). Ownership only steers the writes: Delta's transaction
rule keeps offsets unique whoever appends, so a request spanning several owners is appended here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from delta_log.core.acl import Principal, authorize
from delta_log.core.dead_letters import Split, validation_error
from delta_log.core.partitioner import idempotent_null_key_partition, partitioned_batch
from delta_log.core.producer import ProducerSequence
from delta_log.core.records import DIGITS, offsets_for_rows
from delta_log.core.topic_config import TopicConfig
from delta_log.core.value_schemas import subject_for
from delta_log.errors import InvalidRecordError, TopicExistsError, TopicNotFoundError, WriterClosedError
from delta_log.log.writer import AppendRequest, AppendResult
from delta_log.registry import Committer, TopicRegistry
from delta_log.system.schemas import check_values

#: a request's records up to this size are decoded and planned on the event loop (faster than a
#: thread hop for small requests); larger ones, or any for a topic with a value schema, in a thread
INLINE_DECODE_BYTES = 64 * 1024


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
    *,
    codec: str = "none",
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
    append = AppendRequest(batch=batch, producer=producer, partitions=sorted_parts, codec=codec)
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
            registry.catalog.create_topic(dlq, partitions=config.partitions, config=config.dead_letter_config())
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


@dataclass(frozen=True, slots=True)
class ProducePlan:
    """One produce request, checked and partitioned: its valid records (None when every record is
    a dead letter) and its dead letters (None unless the topic has errors.tolerance=all and some
    values failed its schema)."""

    prepared: PreparedRequest | None
    dead: DeadLetters | None


#: prepare() as a check of a whole request: an idempotent producer's partition choice has no side effect
_CHECK_ONLY = ProducerSequence(producer_id="check", sequence=0)


def plan_produce(
    registry: TopicRegistry,
    principal: Principal,
    topic: str,
    table: pa.Table,
    producer: ProducerSequence | None,
    *,
    placement: Placement | None = None,
    forwarded: bool = False,
    codec: str = "none",
) -> ProducePlan:
    """The rules of one produce request: the key may produce to the topic; values are checked
    against the topic's schema (one bad value refuses the request, or with errors.tolerance=all
    goes to the dead-letter topic, which the key must also be allowed to produce to); records are
    partitioned and validated. `placement` steers a request to its owner gateway (HTTP);
    `forwarded`: another gateway sent it, having read an older registry (a bad value then refuses
    the request, so that gateway decides with the client's indexes). `codec`: how the client
    compressed the records (Kafka's batches), what Fetch returns on a topic whose compression.type
    is `producer`. Blocking: call it in a thread
    unless the table is small and the topic has no schema.

    Raises: AuthorizationError, TopicNotFoundError, PartitionNotFoundError, RecordTooLargeError,
    InvalidRecordError, InvalidSchemaError, SchemaValidationError, InvalidConfigError.
    """
    authorize(principal, "produce", topic)
    config = registry.reader(topic).config
    dead = None
    split = check_values(registry.schemas, topic, table, config)
    if split is not None:  # errors.tolerance=all: the rest go to the dead-letter topic
        if forwarded:
            raise validation_error(topic, subject_for(topic), table.num_rows, split.reasons_by_index())
        authorize(principal, "produce", config.dead_letter_topic(topic))  # as if the client had sent them there
        prepare(registry, topic, table, _CHECK_ONLY)  # the records' own errors, with the request's indexes
        dead = prepare_dead_letters(registry, topic, split, config, producer)
        if split.valid.num_rows == 0:
            return ProducePlan(None, dead)
        table = split.valid
    prepared = prepare(registry, topic, table, producer, placement if dead is None else None, codec=codec)
    return ProducePlan(prepared, dead)


async def append_here(
    registry: TopicRegistry, topic: str, append: AppendRequest, committer: Committer | None = None
) -> AppendResult:
    """Append through this gateway's committer of `topic` (opened if `committer` is None); the
    result comes after the Delta commit that holds the records.

    Raises: TopicNotFoundError, BackPressureError, WriterClosedError, StorageUnavailableError."""
    if committer is None:
        committer = await asyncio.to_thread(registry.committer, topic)
    try:
        return await submit(append, committer)
    except WriterClosedError:  # released as idle between lookup and submit: open it again
        return await submit(append, await asyncio.to_thread(registry.committer, topic))


def submit(append: AppendRequest, committer: Committer) -> asyncio.Future[AppendResult]:
    """Hand `append` to `committer` now, on the event loop (so requests reach the writer in the
    order they are handed over); the future resolves after the Delta commit that holds it.

    Raises: BackPressureError, WriterClosedError (released as idle since it was looked up)."""
    return asyncio.wrap_future(committer.submit(append))
