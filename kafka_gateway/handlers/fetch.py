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

import asyncio
import time
from typing import Any

from kio.schema.errors import ErrorCode

from broker.fetch import read_blocking, wait_for_commit
from delta_log.core.topic_config import INTERNAL_TOPICS
from delta_log.errors import OffsetOutOfRangeError, TopiclakeError
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


def _fetch_all(conn: Session, wanted: list[tuple[str, Any]], budget: int) -> tuple[dict[tuple[str, int], Any], int]:
    """One pass over the requested partitions (blocking): each one's answer, and the bytes found."""
    assert conn.principal is not None
    max_records = min(MAX_RECORDS, conn.services.settings.reader.max_fetch_records)
    answers: dict[tuple[str, int], Any] = {}
    total = 0
    for topic, p in wanted:
        key = (topic, p.partition)
        if not conn.principal.allows("consume", topic):
            answers[key] = refused(p.partition, ErrorCode.topic_authorization_failed)
            continue
        if topic in INTERNAL_TOPICS:  # read as empty (docs/KAFKA.md)
            answers[key] = (
                refused(p.partition, 0, high_watermark=0, last_stable_offset=0, log_start_offset=0)
                if 0 <= p.partition < INTERNAL_TOPICS[topic]
                else refused(p.partition, ErrorCode.unknown_topic_or_partition)
            )
            continue
        try:
            reader = conn.services.registry.reader(topic)
            limit = max(1, min(p.partition_max_bytes, budget - total))
            full = total and budget - total <= 0
            result = (
                None
                if full
                else read_blocking(
                    reader,
                    p.partition,
                    p.fetch_offset,
                    max_records,
                    limit,
                    encoder=encoder_for(reader.config.compression_type),
                )
            )
        except OffsetOutOfRangeError as exc:
            answers[key] = refused(
                p.partition,
                ErrorCode.offset_out_of_range,
                high_watermark=exc.details.get("high_watermark", -1),
                log_start_offset=exc.details.get("log_start_offset", -1),
            )
            continue
        except TopiclakeError as exc:
            answers[key] = refused(p.partition, code_of(exc))
            continue
        if result is None:  # the response is full: this partition's records wait for the next fetch
            hw = reader.high_watermark(p.partition)
            answers[key] = {
                "partition_index": p.partition,
                "error_code": 0,
                "high_watermark": hw,
                "last_stable_offset": hw,
                "records": b"",
            }
            continue
        data = result.encoded or b""
        total += len(data)
        answers[key] = {
            "partition_index": p.partition,
            "error_code": 0,
            "high_watermark": result.high_watermark,
            "last_stable_offset": result.high_watermark,
            "log_start_offset": result.log_start_offset,
            "aborted_transactions": None,
            "preferred_read_replica": -1,
            "records": data,
        }
    return answers, total


@api(1, "Fetch", 4, 12)
async def fetch(conn: Session, request: Any, version: int) -> Any:
    budget = max(1, min(getattr(request, "max_bytes", conn.settings.fetch_max_bytes), conn.settings.fetch_max_bytes))
    wait_s = min(max(millis(request.max_wait), 0), conn.settings.max_wait_ms) / 1000
    wanted = [(t.topic, p) for t in request.topics for p in t.partitions]

    async def answer() -> dict[str, Any]:
        deadline = time.monotonic() + wait_s
        answers, total = await asyncio.to_thread(_fetch_all, conn, wanted, budget)
        while total < max(request.min_bytes, 1) and (remaining := deadline - time.monotonic()) > 0:
            if any(a.get("error_code") for a in answers.values()):
                break  # an error is news: answer at once
            seen = [(t, p.partition, answers[(t, p.partition)].get("high_watermark")) for t, p in wanted]
            await wait_for_commit(conn.services.notifier, seen, remaining)
            answers, total = await asyncio.to_thread(_fetch_all, conn, wanted, budget)
        topics: dict[str, list[Any]] = {}
        for t, p in wanted:
            topics.setdefault(t, []).append(answers[(t, p.partition)])
        return {
            "throttle_time": 0,
            "error_code": 0,
            "session_id": 0,
            "responses": [{"topic": t, "partitions": parts} for t, parts in topics.items()],
        }

    return answer()
