"""Fetch: records by offset from the topic's Delta table (the reader's tail cache first), encoded
as Kafka record batches by the compiled codec (kafka_gateway.records.StoredBatches): straight from
a segment file's row groups on local disk (parquet decoded and batches encoded in one call, no
pyarrow table in between), from the Arrow columns otherwise.

- Max wait and min bytes are a long-poll on the commit notifier (broker.notifier): the request
  sleeps until a commit to one of its partitions or the deadline; waiting costs no CPU.
- Bytes are capped by the request's max bytes, each partition's max bytes, the topic's and the
  server's `kafka.fetch_max_bytes`; as in Kafka, the first record batch is returned whole even
  when larger, so a consumer always makes progress.
- No fetch sessions (KIP-227): every answer is a full one (session id 0), which clients accept.
- Any gateway serves any partition (they share the storage root); clients ask the leader.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from broker.fetch import FetchPart
from delta_log.core.topic_config import INTERNAL_TOPICS, TopicConfig
from delta_log.errors import OffsetOutOfRangeError
from kafka_gateway.apis import api
from kafka_gateway.errors import code_of
from kafka_gateway.messages import millis
from kafka_gateway.records import StoredBatches
from kafka_gateway.session import Session

#: records per batch the reader returns for one partition of one fetch
MAX_RECORDS = 100_000


#: the records of every Kafka fetch, as record batches (one per process and codec: read-aheads are
#: kept per encoder)
KAFKA_BATCHES = StoredBatches()
#: a topic's compression.type -> the codec of the batches Fetch returns ("uncompressed": none;
#: "producer": the codec the records' producers used, kept with them as metadata, CODEC_KEY)
FETCH_CODECS = {"gzip": "gzip", "snappy": "snappy", "lz4": "lz4", "zstd": "zstd", "producer": "producer"}


def encoder_for(compression_type: str) -> StoredBatches:
    return KAFKA_BATCHES.compressed(FETCH_CODECS.get(compression_type, "none"))


def refused(partition: int, code: int, **known: int) -> dict[str, Any]:
    """A partition's answer without records (an error's, as Kafka's): an empty record set (not null: librdkafka cannot parse
    a null one and fetches again at once, in a loop), offsets -1 where not known."""
    unknown = {"high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1}
    return {"partition_index": partition, "error_code": code, "records": b""} | unknown | known


def _answer(part: FetchPart) -> dict[str, Any]:
    """A partition's answer as Kafka encodes it."""
    error, result = part.error, part.result
    if isinstance(error, OffsetOutOfRangeError):
        return refused(
            part.partition,
            ErrorCode.offset_out_of_range,
            high_watermark=error.details.get("high_watermark", -1),
            log_start_offset=error.details.get("log_start_offset", -1),
        )
    if error is not None:
        return refused(part.partition, code_of(error))
    hw = part.high_watermark if part.high_watermark is not None else -1
    if result is None:  # the response is full: this partition's records wait for the next fetch
        return {
            "partition_index": part.partition,
            "error_code": 0,
            "high_watermark": hw,
            "last_stable_offset": hw,
            "records": b"",
        }
    return {
        "partition_index": part.partition,
        "error_code": 0,
        "high_watermark": result.high_watermark,
        "last_stable_offset": result.high_watermark,
        "log_start_offset": result.log_start_offset,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": result.encoded or b"",
    }


def _internal(conn: Session, topic: str, partition: int) -> dict[str, Any]:
    """A partition of a topic Kafka has and topiclake does not (read as empty, docs/KAFKA.md)."""
    assert conn.principal is not None
    if conn.services.fetch.refusal(conn.principal, topic) is not None:
        return refused(partition, ErrorCode.topic_authorization_failed)
    if 0 <= partition < INTERNAL_TOPICS[topic]:
        return refused(partition, 0, high_watermark=0, last_stable_offset=0, log_start_offset=0)
    return refused(partition, ErrorCode.unknown_topic_or_partition)


def _encoder(config: TopicConfig) -> StoredBatches:
    return encoder_for(config.compression_type)


@api(1, "Fetch", 4, 12)
async def fetch(conn: Session, request: Any, version: int) -> Any:
    assert conn.principal is not None
    principal = conn.principal
    budget = max(1, min(getattr(request, "max_bytes", conn.settings.fetch_max_bytes), conn.settings.fetch_max_bytes))
    wait_s = min(max(millis(request.max_wait), 0), conn.settings.max_wait_ms) / 1000
    wanted = [(t.topic, p) for t in request.topics for p in t.partitions]
    parts = [
        FetchPart(topic, p.partition, p.fetch_offset, p.partition_max_bytes)
        for topic, p in wanted
        if topic not in INTERNAL_TOPICS
    ]

    async def answer() -> dict[str, Any]:
        await conn.services.fetch.fetch(
            principal,
            parts,
            max_bytes=budget,
            max_records=min(MAX_RECORDS, conn.services.settings.reader.max_fetch_records),
            max_wait_s=wait_s,
            min_bytes=max(request.min_bytes, 1),
            encoder=_encoder,
        )
        served = iter(parts)
        topics: dict[str, list[Any]] = {}
        for t, p in wanted:
            topics.setdefault(t, []).append(
                _internal(conn, t, p.partition) if t in INTERNAL_TOPICS else _answer(next(served))
            )
        return {
            "throttle_time": 0,
            "error_code": 0,
            "session_id": 0,
            "responses": [{"topic": t, "partitions": parts} for t, parts in topics.items()],
        }

    return answer()
