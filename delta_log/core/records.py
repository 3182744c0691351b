"""Record batches: the topic schema, validation of incoming batches, offset planning.

Pure functions of plain values and Arrow arrays: no I/O, no clock (the caller passes `now`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from delta_log.errors import (
    InvalidOffsetError,
    InvalidRecordError,
    InvalidSchemaError,
    InvalidTimestampError,
    PartitionNotFoundError,
    RecordTooLargeError,
)

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

#: The topic table schema: exactly Spark's Kafka source schema (all nullable).
TOPIC_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", HEADERS_TYPE),
    ]
)

#: A normalized batch, before the writer adds topic and offset.
BATCH_SCHEMA = pa.schema(
    [
        TOPIC_SCHEMA.field("key"),
        TOPIC_SCHEMA.field("value"),
        TOPIC_SCHEMA.field("partition"),
        TOPIC_SCHEMA.field("timestamp"),
        TOPIC_SCHEMA.field("timestampType"),
        TOPIC_SCHEMA.field("headers"),
    ]
)

CREATE_TIME = 0
LOG_APPEND_TIME = 1


@functools.cache
def _timestamp_types() -> tuple[pa.Scalar, pa.Scalar]:
    """LOG_APPEND_TIME and CREATE_TIME as int32 scalars (5 us each to make), made on first use, not
    at import: `pa.scalar` imports pandas (0.6 s of every process that imports this module)."""
    return pa.scalar(LOG_APPEND_TIME, pa.int32()), pa.scalar(CREATE_TIME, pa.int32())


#: Offsets are int64, as in Kafka and in the topic table.
MAX_OFFSET = 2**63 - 1
#: The latest record timestamp a topic table (and Spark) holds: 9999-12-31T23:59:59.999Z, epoch ms.
MAX_TIMESTAMP_MS = 253_402_300_799_999
#: A plain decimal integer as clients send offsets and sequences in text (headers, query strings).
DIGITS = r"^[0-9]{1,15}$"
#: Kafka's "no timestamp": the server's time is used.
NO_TIMESTAMP = -1
#: The codec a partition's producers compressed their Kafka batches with (none, gzip, snappy, lz4,
#: zstd), kept as metadata with the records it applies to: a segment file's parquet key-value
#: metadata, a tail table's schema metadata. Fetch returns it on a topic whose compression.type is
#: `producer` (read by the compiled codec too: kafka_gateway/codec/src/stored.rs).
CODEC_KEY = "topiclake.codec"


def check_offset(offset: int, *, what: str = "Offset") -> int:
    """Return `offset` if it is a valid log offset (0 .. 2**63-1). Raises: InvalidOffsetError."""
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
        raise InvalidOffsetError(
            f"{what} must be an integer between 0 and {MAX_OFFSET}; got {offset}.", offset=str(offset)
        )
    return offset


def _column(table: pa.Table, name: str, target: pa.DataType) -> pa.ChunkedArray | None:
    if name not in table.column_names:
        return None
    col = table.column(name)
    if col.type == target:
        return col
    try:
        return col.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidSchemaError(f"Column {name!r} has type {col.type}; expected {target}.", column=name) from exc


def _first_index(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool))[0])


@dataclass(frozen=True, slots=True)
class TimestampWindow:
    """Kafka's message.timestamp.before.max.ms / after.max.ms: how far a producer's (CreateTime)
    timestamp may lie before or after the server's time."""

    before_max_ms: int = MAX_OFFSET
    after_max_ms: int = MAX_OFFSET


def _check_timestamps(ts: pa.ChunkedArray, now_us: int, window: TimestampWindow) -> None:
    """Raises: InvalidTimestampError for a timestamp outside 0 .. MAX_TIMESTAMP_MS (what Delta and Spark
    hold: stored, it would make the partition unreadable for every JSON consumer), or outside the
    topic's window around `now_us`."""
    micros = ts.cast(pa.int64())
    bad = pc.or_(pc.less(micros, 0), pc.greater(micros, MAX_TIMESTAMP_MS * 1000))
    if pc.any(bad).as_py():
        idx = _first_index(pc.fill_null(bad, False))
        raise InvalidTimestampError(
            f"Record {idx} has timestamp {micros[idx].as_py()} us, outside 1970-01-01 .. 9999-12-31.", index=idx
        )
    now_ms = now_us // 1000
    for name, limit, too_far in (
        ("message.timestamp.before.max.ms", window.before_max_ms, pc.less),
        ("message.timestamp.after.max.ms", window.after_max_ms, pc.greater),
    ):
        if limit >= MAX_TIMESTAMP_MS:
            continue  # no bound inside what a timestamp can hold
        edge = now_ms - limit if too_far is pc.less else now_ms + limit
        outside = pc.fill_null(too_far(micros, edge * 1000), False)
        if pc.any(outside).as_py():
            idx = _first_index(outside)
            raise InvalidTimestampError(
                f"Record {idx} has timestamp {micros[idx].as_py() // 1000} ms, more than the topic's {name}={limit} "
                f"from the server's time {now_ms} ms. Send a current timestamp, or none (the server's time is used).",
                index=idx,
                config=name,
            )


def record_sizes(table: pa.Table) -> np.ndarray:
    """Approximate Kafka record size per row: key + value + header bytes."""
    sizes = np.zeros(table.num_rows, dtype=np.int64)
    if not table.num_rows:
        return sizes
    names = table.column_names
    for name in ("key", "value"):
        if name in names:
            at = 0
            for chunk in table.column(name).chunks:
                n = len(chunk)
                sizes[at : at + n] += _binary_lengths(chunk)
                at += n
    if "headers" in names:
        at = 0
        for chunk in table.column("headers").chunks:
            n = len(chunk)
            if chunk.null_count < n:
                sizes[at : at + n] += _header_bytes(chunk)
            at += n
    return sizes


def binary_offsets(arr: pa.Array) -> np.ndarray:
    """The offsets of a binary or string array's values into its data (len(arr) + 1 of them), read
    from its offsets buffer without a copy."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset :]


def _binary_lengths(arr: pa.Array) -> np.ndarray:
    """Each value's length (0 for a null) of a binary or string array, from its offsets buffer:
    the per-call cost of pyarrow compute (binary_length, fill_null, to_numpy) was most of a
    fetch's bookkeeping, a row group at a time."""
    n = len(arr)
    if arr.null_count == n:
        return np.zeros(n, dtype=np.int64)
    if not (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type)):
        return pc.binary_length(arr).fill_null(0).to_numpy().astype(np.int64, copy=False)
    lengths = np.diff(binary_offsets(arr)).astype(np.int64)
    if arr.null_count:
        lengths[~arr.is_valid().to_numpy(zero_copy_only=False)] = 0
    return lengths


def _header_bytes(headers: pa.Array) -> np.ndarray:
    """Each record's header key + value bytes (0 for a null list), from a headers list array."""
    offsets = headers.offsets.to_numpy()  # of this slice's lists, into `values`
    first, last = int(offsets[0]), int(offsets[-1])
    if last == first:
        return np.zeros(len(headers), dtype=np.int64)
    entries = headers.values.slice(first, last - first)
    per = _binary_lengths(entries.field("key")) + _binary_lengths(entries.field("value"))
    cums = np.concatenate([[0], np.cumsum(per)])
    sizes = cums[offsets[1:] - first] - cums[offsets[:-1] - first]
    if headers.null_count:
        sizes[~headers.is_valid().to_numpy(zero_copy_only=False)] = 0
    return sizes


def normalize_batch(
    table: pa.Table,
    *,
    partitions: int,
    topic: str,
    max_message_bytes: int,
    now_us: int,
    log_append_time: bool,
    timestamp_window: TimestampWindow = TimestampWindow(),
) -> pa.Table:
    """Validate an incoming batch and return it in BATCH_SCHEMA.

    `table` needs `value` and `partition` columns; `key`, `timestamp` and `headers` are optional.
    Records without a timestamp (or all records, when `log_append_time`) get `now_us` and
    timestampType 1 (LogAppendTime); producer timestamps get 0 (CreateTime).

    Raises:
        InvalidSchemaError: a missing column, an unknown column, or a type that cannot be cast.
        InvalidRecordError: a null partition (`index` names the first bad record).
        PartitionNotFoundError: a partition outside 0..partitions-1.
        RecordTooLargeError: a record over `max_message_bytes` (`index` names it).
        InvalidTimestampError: a timestamp Delta cannot hold or outside `timestamp_window`.
    """
    unknown = set(table.column_names) - set(BATCH_SCHEMA.names)
    if unknown:
        raise InvalidSchemaError(f"Unknown columns: {', '.join(sorted(unknown))}.", columns=sorted(unknown))
    n = table.num_rows
    if n == 0:
        raise InvalidRecordError("The batch holds no records; send at least one.")
    value = _column(table, "value", pa.binary())
    if value is None:
        raise InvalidSchemaError("The batch has no 'value' column.", column="value")
    partition = _column(table, "partition", pa.int32())
    if partition is None:
        raise InvalidSchemaError("The batch has no 'partition' column.", column="partition")
    if partition.null_count:
        idx = _first_index(pc.is_null(partition))
        raise InvalidRecordError(f"Record {idx} has no partition.", index=idx)
    part_numbers = partition.to_numpy()  # (no nulls: one chunk is viewed, not copied)
    if part_numbers.min() < 0 or part_numbers.max() >= partitions:
        idx = _first_index(pc.or_(pc.less(partition, 0), pc.greater_equal(partition, partitions)))
        exc = PartitionNotFoundError(topic, int(partition[idx].as_py()), partitions)
        exc.details["index"] = idx
        raise exc
    key = _column(table, "key", pa.binary())
    if key is None:
        key = pa.chunked_array([pa.nulls(n, pa.binary())])
    headers = _column(table, "headers", HEADERS_TYPE)
    if headers is None:
        headers = pa.chunked_array([pa.nulls(n, HEADERS_TYPE)])
    ts = _column(table, "timestamp", TIMESTAMP_TYPE)
    now = pa.scalar(now_us, TIMESTAMP_TYPE)
    if ts is None or log_append_time or ts.null_count == n:  # no producer timestamps: the server's time
        # (`repeat` of a scalar: 2 against 30 us for a numpy array made a timestamp array)
        ts = pa.chunked_array([pa.repeat(now, n)])
        ts_type = pa.chunked_array([pa.repeat(_timestamp_types()[0], n)])
    else:
        _check_timestamps(ts, now_us, timestamp_window)
        missing = pc.is_null(ts)
        ts_type = pc.if_else(missing, *_timestamp_types())
        ts = pc.if_else(missing, now, ts)
    out = pa.table([key, value, partition, ts, ts_type, headers], schema=BATCH_SCHEMA)
    # the columns' buffers bound every record's size: none can be over (small batches); their whole
    # buffers, at least what the rows use: 0.1 against 3 us a column for `nbytes`
    if sum(c.get_total_buffer_size() for c in (key, value, headers)) <= max_message_bytes:
        return out
    sizes = record_sizes(out)
    over = np.flatnonzero(sizes > max_message_bytes)
    if len(over):
        idx = int(over[0])
        raise RecordTooLargeError(
            f"Record {idx} is {int(sizes[idx])} bytes; the topic's max.message.bytes is {max_message_bytes}.",
            index=idx,
            size=int(sizes[idx]),
            max_message_bytes=max_message_bytes,
        )
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRange:
    """Offsets `base_offset .. base_offset + count - 1` written to one partition."""

    partition: int
    base_offset: int
    count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1


def _one_partition(partitions: np.ndarray) -> bool:
    """Whether every row of a non-empty `partitions` is in one partition (the ends first: cheap)."""
    return bool(partitions[0] == partitions[-1] and (partitions == partitions[0]).all())


def partition_runs(partitions: np.ndarray) -> list[tuple[int, int, int]]:
    """(partition, start, end) of each run of equal adjacent values in `partitions` (rows sorted
    by partition: one run each), in order."""
    if not len(partitions):
        return []
    if _one_partition(partitions):  # one run: 2 against 4 us
        return [(int(partitions[0]), 0, len(partitions))]
    starts = np.flatnonzero(np.concatenate([[True], partitions[1:] != partitions[:-1]])).tolist()
    ends = [*starts[1:], len(partitions)]
    return [(int(partitions[s]), s, e) for s, e in zip(starts, ends, strict=True)]


#: runs of rows at least this large on average are sliced, smaller ones gathered by one `take`
#: (`group_by_partition`)
SLICED_RUN_BYTES = 64 * 1024


def group_by_partition(table: pa.Table, partitions: np.ndarray, order: np.ndarray | None = None) -> pa.Table:
    """`table`'s rows grouped by partition, in ascending partition order and, within each, in the
    order they came (`partitions`: its partition column as numpy; `order`: their stable argsort, if
    the caller has it). Rows already grouped are returned as they are. Otherwise large runs are
    sliced (zero-copy; 40 writes of 4 MB over four partitions: 19 ms against 100 ms by a `take`
    into fresh memory), and many small ones gathered by one `take` (250 writes of 10 records over
    four partitions: 0.7 against 6.4 ms by slicing 1,000 runs, each call waiting for the GIL under
    load; 1,000 one-record writes of 1,000 partitions: 2.3 against 20 ms)."""
    if len(partitions) < 2 or not (partitions[1:] < partitions[:-1]).any():
        return table
    runs = partition_runs(partitions)
    if table.get_total_buffer_size() < len(runs) * SLICED_RUN_BYTES:  # (`nbytes`: 30x the time)
        return table.take(pa.array(np.argsort(partitions, kind="stable") if order is None else order))
    by_partition: dict[int, list[pa.Table]] = {}
    for p, start, end in runs:
        by_partition.setdefault(p, []).append(table.slice(start, end - start))
    return pa.concat_tables([piece for p in sorted(by_partition) for piece in by_partition[p]])


def count_by_partition(partitions: np.ndarray) -> dict[int, int]:
    """Records per partition, in ascending partition order."""
    if not len(partitions):
        return {}
    counts = np.bincount(partitions)  # partitions are small non-negative ints: no sort needed
    present = np.flatnonzero(counts)
    return dict(zip(present.tolist(), counts[present].tolist(), strict=True))


def plan_offsets(
    requests: Sequence[Mapping[int, int]], high_watermarks: Mapping[int, int]
) -> tuple[list[list[PartitionRange]], dict[int, int]]:
    """Assign offset ranges to requests in order.

    `requests[i]` maps partition -> record count for request i. Each request gets, per partition,
    the next contiguous range after the high watermark and the requests before it.
    Returns the ranges per request and the new high watermark of every touched partition.
    """
    next_offset = dict(high_watermarks)
    plans: list[list[PartitionRange]] = []
    for counts in requests:
        ranges = []
        for partition in sorted(counts):
            count = counts[partition]
            if count <= 0:
                continue
            base = next_offset.get(partition, 0)
            ranges.append(PartitionRange(partition=partition, base_offset=base, count=count))
            next_offset[partition] = base + count
        plans.append(ranges)
    touched = {p for counts in requests for p, c in counts.items() if c > 0}
    return plans, {p: next_offset[p] for p in sorted(touched)}


def offsets_for_rows(partitions: np.ndarray, high_watermarks: Mapping[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Row order and offsets for a concatenated batch.

    Returns (order, offsets): `order` sorts rows by (partition, arrival) and `offsets[i]` is the
    offset of row `order[i]`: high watermark of its partition + its rank within the partition.
    """
    n = len(partitions)
    if n and _one_partition(partitions):
        first = high_watermarks.get(int(partitions[0]), 0)
        return np.arange(n), np.arange(first, first + n, dtype=np.int64)
    order = np.argsort(partitions, kind="stable")
    sorted_parts = partitions[order]
    if n == 0:
        return order, np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], sorted_parts[1:] != sorted_parts[:-1]]))
    group_sizes = np.diff(np.concatenate([starts, [n]]))
    group_start = np.repeat(starts, group_sizes)
    base = np.repeat(
        np.array([high_watermarks.get(int(sorted_parts[s]), 0) for s in starts], dtype=np.int64), group_sizes
    )
    offsets = base + (np.arange(n, dtype=np.int64) - group_start)
    return order, offsets


def producer_arrow_stream(batch: pa.Table) -> bytes:
    """A normalized batch (BATCH_SCHEMA) as a producer's Arrow IPC request: explicit partitions, and
    timestamps only where the producer gave them (the receiving gateway stamps the others with its
    own append time, as it would have). What a gateway forwards to a partition's owner, and what the
    Spark sink sends to a gateway."""
    stamped = pc.equal(batch.column("timestampType"), LOG_APPEND_TIME)
    table = pa.table(
        {
            "key": batch.column("key"),
            "value": batch.column("value"),
            "partition": batch.column("partition").cast(pa.int64()),
            "timestamp": pc.if_else(stamped, pa.scalar(None, TIMESTAMP_TYPE), batch.column("timestamp")),
            "headers": batch.column("headers"),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
