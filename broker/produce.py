"""Produce, whichever door a record came in by: decoded table -> ACL, schema check and dead-letter
split -> partitioned, validated AppendRequest -> appended -> per-record offsets.

Every rule of produce lives here, in `ProduceService`; the HTTP route (ingest_gateway.routes.records)
and the Kafka handler (kafka_gateway.handlers.produce) turn their requests into `Produce` units with
a decoder each, call the service's `plan`, `submit` and `acked`, and encode the answer.

In a cluster each partition has one owner gateway (rendezvous hashing, broker.cluster), which
appends to it; `Placement` is this gateway's view of the owners. Records without a key or partition
go to partitions this gateway owns. An HTTP request whose partitions another gateway owns alone is
sent there by the HTTP face (ingest_gateway.produce_forwarding); a Kafka request naming a partition
another gateway owns is refused (NotPartitionOwnerError: the client finds the leader). Ownership only steers the writes: Delta's transaction
rule keeps offsets unique whoever appends, so a request spanning several owners is appended here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from broker.cluster import Cluster
from broker.transactions import TransactionCoordinator, TxnBatch, TxnProduce
from delta_log.core.acl import Principal, authorize, refusal
from delta_log.core.dead_letters import Split, validation_error
from delta_log.core.partitioner import idempotent_null_key_partition, partitioned_batch
from delta_log.core.producer import ProducerSequence
from delta_log.core.records import DIGITS, offsets_for_rows
from delta_log.core.topic_config import TopicConfig
from delta_log.core.value_schemas import subject_for
from delta_log.errors import (
    InvalidRecordError,
    InvalidTxnStateError,
    NotPartitionOwnerError,
    PartitionNotFoundError,
    TopicExistsError,
    TopiclakeError,
    TopicNotFoundError,
    WriterClosedError,
)
from delta_log.log.group_commit import FlushStats as FlushStats
from delta_log.log.writer import AppendRequest
from delta_log.log.writer import AppendResult as AppendResult
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
    log_append_time: bool = False  # the topic stamps records with the time it appends them


#: prepare() as a check of a whole request: an idempotent producer's partition choice has no side effect
_CHECK_ONLY = ProducerSequence(producer_id="check", sequence=0)


def _plan_records(
    registry: TopicRegistry,
    principal: Principal,
    topic: str,
    table: pa.Table,
    producer: ProducerSequence | None,
    *,
    placement: Placement | None,
    forwarded: bool,
    codec: str,
) -> ProducePlan:
    """The rules of one produce request whose key may produce to `topic`: values are checked
    against the topic's schema (one bad value refuses the request, or with errors.tolerance=all
    goes to the dead-letter topic, which the key must also be allowed to produce to); records are
    partitioned and validated. `placement` steers a request to its owner gateway; `forwarded`:
    another gateway sent it, having read an older registry (a bad value then refuses the request,
    so that gateway decides with the client's indexes). `codec`: how the client compressed the
    records (Kafka's batches), what Fetch returns on a topic whose compression.type is `producer`.
    Blocking.

    Raises: AuthorizationError (the dead-letter topic), TopicNotFoundError, PartitionNotFoundError,
    RecordTooLargeError, InvalidRecordError, InvalidSchemaError, SchemaValidationError,
    InvalidConfigError.
    """
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
            return ProducePlan(None, dead, config.log_append_time)
        table = split.valid
    prepared = prepare(registry, topic, table, producer, placement if dead is None else None, codec=codec)
    return ProducePlan(prepared, dead, config.log_append_time)


@dataclass(frozen=True, slots=True)
class Decoded:
    """A produce unit's records as its face decoded them."""

    table: pa.Table
    producer: ProducerSequence | None = None  # an idempotent producer's sequence range
    codec: str = "none"  # how the client compressed them
    #: transactional records: who wrote them (their transaction's producer, epoch and sequence)
    transactional: TxnBatch | None = None


@dataclass(slots=True, kw_only=True)
class Produce:
    """One unit of a produce request, whichever door it came by: a topic's records (HTTP) or one
    partition's batches (Kafka). The face gives the first fields; `ProduceService` fills `error`
    (instead of raising: a Kafka request's other partitions go on) and `plan`."""

    topic: str
    #: the face's decoder of the records (blocking; raises TopiclakeError), called after the ACL check
    decode: Callable[[], Decoded]
    size: int  # the records' encoded bytes: small units are decoded on the event loop
    #: the partition the request names (Kafka): checked to exist and to be led here before decoding
    partition: int | None = None
    #: steer the records to their owner gateway: `plan.prepared.owner` names it, for the face to forward to
    route: bool = False
    forwarded: bool = False  # another gateway forwarded the records (see _plan_records)
    #: the transactional id the request names (Kafka's transactional Produce): its records are
    #: staged with their transaction (broker.transactions), not appended
    transactional_id: str | None = None
    #: the write adds its partition to its transaction, which it may begin (Kafka's Produce v12+,
    #: transaction version 2); a request that names no partition (HTTP) always does
    adds_to_transaction: bool = False
    error: TopiclakeError | None = None
    transaction: TxnProduce | None = None
    plan: ProducePlan | None = None
    _committer: Committer | None = None
    _dead_committer: Committer | None = None
    _written: asyncio.Future[AppendResult] | None = None
    _dead: asyncio.Future[AppendResult] | None = None


@dataclass(frozen=True, slots=True)
class Acked:
    """A produce unit written: its valid records' result (None when all were dead letters) and its
    dead letters' (None when there were none)."""

    result: AppendResult | None
    dead: AppendResult | None

    @property
    def duplicate(self) -> bool:
        """An idempotent producer's retry: the records were written before, and are not again."""
        return any(r.duplicate for r in (self.result, self.dead) if r is not None)

    @property
    def base_offset(self) -> int:
        """The first offset written (-1: none), the valid records' when there are some."""
        for r in (self.result, self.dead):
            if r is not None:
                return r.ranges[0].base_offset if r.ranges else -1
        return -1


#: At most this many threads decode produce requests at once. Measured: with 64 HTTP clients,
#: dozens of decoding threads starved the group-commit thread of the GIL (each of its Arrow and
#: Delta calls waited to get it back), halving commits/s.
DECODE_THREADS = 2


class ProduceService:
    """Produce, for every face: `plan` (ACL once per topic, the partitions a request names, the
    face's decoding, produce's rules, the writers opened), then `submit` (handed to the writers in
    the order requests arrive, dead letters before the records they were split from), then `acked`
    (after the Delta commit that holds them). A face decodes its protocol into `Produce` units,
    calls these three, and encodes each unit's `Acked` or error."""

    def __init__(self, registry: TopicRegistry, cluster: Cluster | None = None) -> None:
        self.registry = registry
        self.cluster = cluster
        self._decoders = asyncio.Semaphore(DECODE_THREADS)
        #: stages transactional records with their transaction (set by broker.services)
        self.transactions: TransactionCoordinator | None = None

    def placement(self, topic: str) -> Placement | None:
        """This gateway's view of who owns `topic`'s partitions (None: produce is not routed)."""
        cluster = self.cluster
        if cluster is None or not cluster.settings.route_produce:
            return None
        return Placement(cluster.me.gateway_id, functools.partial(cluster.partition_owners, topic))

    def leads(self, topic: str, partition: int, partitions: int) -> bool:
        """Whether this gateway appends to the partition: its owner, or produce is not routed."""
        placement = self.placement(topic)
        return placement is None or placement.owners_of(partitions)[partition] == placement.me

    async def plan(self, principal: Principal, units: Sequence[Produce]) -> None:
        """Check, decode and plan every unit of a request, and open the writers they need: small
        requests on the event loop, others in one thread hop for the whole request (one of at most
        DECODE_THREADS). Each unit's refusal is put in its `error`."""
        refused = {t: refusal(principal, "produce", t) for t in {u.topic for u in units}}
        for u in units:
            u.error = refused[u.topic]
        await self._check_partitions([u for u in units if u.error is None and u.partition is not None])
        todo = [u for u in units if u.error is None]
        registry = self.registry
        open_now = registry.committers()  # opening a topic's writer reads its table: not on the loop
        if sum(u.size for u in todo) <= INLINE_DECODE_BYTES and not any(
            has_value_schema(registry, u.topic) or u.topic not in open_now for u in todo
        ):
            self._plan_all(principal, todo)
        elif todo:
            async with self._decoders:
                await asyncio.to_thread(self._plan_all, principal, todo)

    async def _check_partitions(self, units: Sequence[Produce]) -> None:
        """The partition each unit names exists and is led here (NotPartitionOwnerError: the client
        refreshes its metadata and sends it to the owner). Partition counts of open topics as read
        lately (no I/O; afresh when a partition is past it: one added since); the others in ONE
        thread hop for the request, not one per topic (a request may name hundreds)."""
        registry = self.registry
        counts: dict[str, int | TopiclakeError] = {}
        missing: set[str] = set()
        for u in units:
            n = registry.recent_partitions(u.topic)
            if n is None or u.partition is None or u.partition >= n:
                missing.add(u.topic)
            else:
                counts[u.topic] = n
        if missing:

            def read() -> dict[str, int | TopiclakeError]:
                got: dict[str, int | TopiclakeError] = {}
                for name in missing:
                    try:
                        got[name] = registry.partitions(name)
                    except TopiclakeError as exc:
                        got[name] = exc
                return got

            counts |= await asyncio.to_thread(read)
        for u in units:
            count, p = counts[u.topic], u.partition
            assert p is not None
            if isinstance(count, TopiclakeError):
                u.error = count
                continue
            n = count
            if not 0 <= p < n:
                u.error = PartitionNotFoundError(u.topic, p, n)
            elif not self.leads(u.topic, p, n):
                u.error = NotPartitionOwnerError(
                    f"Another gateway of the cluster leads partition {p} of {u.topic!r}.", topic=u.topic, partition=p
                )

    def _plan_all(self, principal: Principal, units: Sequence[Produce]) -> None:
        registry = self.registry
        for u in units:
            try:
                decoded = u.decode()
                u.transaction = self._transaction(principal, u, decoded)
                placement = self.placement(u.topic) if u.route else None
                plan = u.plan = _plan_records(
                    registry,
                    principal,
                    u.topic,
                    decoded.table,
                    decoded.producer,
                    placement=placement,
                    forwarded=u.forwarded,
                    codec=decoded.codec,
                )
                if plan.prepared is not None and plan.prepared.owner is None:
                    u._committer = registry.committer(u.topic)
                if plan.dead is not None:
                    u._dead_committer = registry.committer(plan.dead.topic)
            except TopiclakeError as exc:
                u.error = exc

    def _transaction(self, principal: Principal, u: Produce, decoded: Decoded) -> TxnProduce | None:
        """The transaction a unit's records belong to (None: appended now). Raises:
        InvalidTxnStateError (transactional records without a transactional id, or the reverse).
        The transaction itself is checked when the records are staged (TransactionCoordinator.stage)."""
        tid, txn = u.transactional_id, decoded.transactional
        if tid is None and txn is None:
            return None
        if tid is None or txn is None or self.transactions is None:
            raise InvalidTxnStateError(
                "Transactional records come with the producer's transactional id, and only they do: "
                "set transactional.id and call initTransactions, or produce without transactions.",
                topic=u.topic,
            )
        return TxnProduce(
            tid,
            txn,
            implicit=u.partition is None or u.adds_to_transaction,
            principal=principal,
            epoch_per_transaction=u.adds_to_transaction,
        )

    async def submit(self, units: Sequence[Produce]) -> None:
        """Hand the planned units to the writers, in order (a request's units land in one flush:
        one Delta commit per topic). A unit's dead letters go first and its valid records after
        they are written, so a failure leaves none of the valid records written (a retry writes
        them once)."""
        for u in units:
            plan = u.plan
            if u.error is not None or plan is None:
                continue
            if u.transaction is not None and self.transactions is not None:
                stage = self.transactions.stage
                if plan.prepared is not None:
                    u._written = asyncio.ensure_future(stage(u.transaction, u.topic, plan.prepared.append))
                if plan.dead is not None:
                    u._dead = asyncio.ensure_future(
                        self._dead_after(u._written, stage, u.transaction, plan.dead.topic, plan.dead.append.append)
                    )
                continue
            try:
                if plan.dead is not None:
                    u._dead = await self._submit(plan.dead.topic, plan.dead.append.append, u._dead_committer)
                if plan.prepared is not None:
                    if u._dead is None:
                        u._written = await self._submit(u.topic, plan.prepared.append, u._committer)
                    else:
                        u._written = asyncio.ensure_future(
                            self._after(u._dead, u.topic, plan.prepared.append, u._committer)
                        )
            except TopiclakeError as exc:  # back-pressure: the client retries
                u.error = exc

    @staticmethod
    async def _dead_after(
        written: asyncio.Future[AppendResult] | None,
        stage: Callable[..., Awaitable[AppendResult]],
        txn: TxnProduce,
        topic: str,
        append: AppendRequest,
    ) -> AppendResult:
        """A transactional unit's dead letters, staged with it once its valid records passed the
        transaction's check (or, all of them dead letters, checked themselves)."""
        if written is not None:
            await written
        return await stage(txn, topic, append, verify=written is None)

    async def _after(
        self, first: asyncio.Future[AppendResult], topic: str, append: AppendRequest, committer: Committer | None
    ) -> AppendResult:
        result = await first
        if result.error is not None:
            raise result.error
        return await (await self._submit(topic, append, committer))

    async def _submit(
        self, topic: str, append: AppendRequest, committer: Committer | None
    ) -> asyncio.Future[AppendResult]:
        """Hand `append` to `topic`'s writer (opened if `committer` is None); the future resolves
        after the Delta commit that holds it. Raises: BackPressureError, TopicNotFoundError."""
        if committer is None:
            committer = await asyncio.to_thread(self.registry.committer, topic)
        try:
            return asyncio.wrap_future(committer.submit(append))
        except WriterClosedError:  # released as idle since it was opened: open it again
            committer = await asyncio.to_thread(self.registry.committer, topic)
            return asyncio.wrap_future(committer.submit(append))

    async def append(self, topic: str, append: AppendRequest) -> AppendResult:
        """Append one request to `topic` now (a committed transaction's records): its result after
        the Delta commit that holds it. Raises: BackPressureError, TopicNotFoundError."""
        return await (await self._submit(topic, append, None))

    async def acked(self, unit: Produce) -> Acked:
        """The unit once written. Raises: the unit's refusal, or its write's error (TopiclakeError)."""
        if unit.error is not None:
            raise unit.error
        dead = written = None
        if unit._dead is not None:
            dead = await unit._dead
            if dead.error is not None:
                if unit._written is not None:  # never handed over: its task ends with the same error
                    with contextlib.suppress(TopiclakeError):
                        await unit._written
                raise dead.error
        if unit._written is not None:
            written = await unit._written
            if written.error is not None:
                raise written.error
        return Acked(written, dead)

    async def produce(self, principal: Principal, units: Sequence[Produce]) -> None:
        """`plan` and `submit`: what a face calls that does not forward."""
        await self.plan(principal, units)
        await self.submit(units)
