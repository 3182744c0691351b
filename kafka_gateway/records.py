"""Kafka record batches (v2, magic 2) to and from Arrow arrays, through the compiled codec.

This is the only module that imports ``kafka_gateway._codec`` (Rust, ``kafka_gateway/codec``).
No Python object is made per record in either direction: decoding returns pyarrow arrays built
with ``pa.Array.from_buffers`` over memory the codec allocated (wrapped without a copy), and
encoding hands ``Array.buffers()`` and array offsets to the codec, which reads them in place.

``decode_batches`` is atomic: it either returns every record of every batch in ``data`` or raises
the error of topiclake's root that Kafka's name below maps to (``ERRORS``; the Kafka face's
table gives the client that name back), and nothing is decoded lazily. It checks, before
returning anything:

- framing: empty input, truncation anywhere, batchLength below the v2 header or past the bytes
  present, trailing bytes that are no whole batch (``CORRUPT_MESSAGE``);
- magic other than 2 (``UNSUPPORTED_FOR_MESSAGE_FORMAT``), the CRC-32C of every batch
  (``CORRUPT_MESSAGE``), the compression codec (``UNSUPPORTED_COMPRESSION_TYPE``);
- the declared record counts against ``max_records`` before decompressing
  (``RECORD_LIST_TOO_LARGE``), and the records sections after decompression against
  ``max_bytes``, with decompression bounded so a bomb never allocates much more than
  ``max_bytes`` (``MESSAGE_TOO_LARGE``);
- every record (``INVALID_RECORD``): count as declared, no bytes left over, lengths consistent,
  no overlong varints, no negative lengths but -1 for null key/value/header value, UTF-8 header
  keys, and with ``strict_offsets`` (produce requests) lastOffsetDelta = count - 1, offset
  deltas exactly 0..n-1 and at least one record per batch; without it (batches read back from a
  log, compacted ones included) offset deltas need only increase within 0..lastOffsetDelta.

Control and transactional batches are decoded like any other; their flags are reported per
batch for the caller to act on. For a LogAppendTime batch every record's timestamp is the
batch's maxTimestamp, as Kafka's clients read it.

``encode_batch`` writes one batch exactly as Kafka's Java producer lays it out (xerial framing
for snappy, 64 KiB independent LZ4 frame blocks, gzip level 6, zstd level 3). Inputs that cannot
be encoded raise ``ValueError``/``TypeError``. Both calls release the GIL for inputs over 64 KiB;
input buffers must not be mutated while a call runs.

``StoredBatches`` is the fetch path's form: record batches of stored records, from Arrow tables
in memory or straight from a local segment file's row groups (the codec decodes the parquet and
encodes the batches in one call without the GIL; no pyarrow table is made).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa

import kafka_gateway._codec as _codec
from broker.fetch import Encoded
from delta_log import errors
from delta_log.core.records import CODEC_KEY

HEADER_STRUCT: Final = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE: Final = pa.list_(pa.field("element", HEADER_STRUCT))
COMPRESSIONS: Final = ("none", "gzip", "snappy", "lz4", "zstd")
#: the codec's error names (Kafka's) -> the errors decode_batches raises
ERRORS: Final[dict[str, type[errors.TopiclakeError]]] = {
    "CORRUPT_MESSAGE": errors.CorruptRecordError,
    "INVALID_RECORD": errors.InvalidRecordError,
    "UNSUPPORTED_COMPRESSION_TYPE": errors.UnsupportedCompressionError,
    "UNSUPPORTED_FOR_MESSAGE_FORMAT": errors.UnsupportedMessageFormatError,
    "RECORD_LIST_TOO_LARGE": errors.RequestTooLargeError,
    "MESSAGE_TOO_LARGE": errors.RecordTooLargeError,
}

TIMESTAMP_CREATE_TIME: Final = 0
TIMESTAMP_LOG_APPEND_TIME: Final = 1


class BatchInfo(NamedTuple):
    """The header of one decoded batch (with its flags and compression spelled out)."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    compression: str
    timestamp_type: int
    is_transactional: bool
    is_control: bool
    size_bytes: int


@dataclass(frozen=True, slots=True)
class DecodedBatches:
    """Every record of the decoded batches, in order, as Arrow arrays of equal length.

    ``offset`` is baseOffset + offsetDelta per record (for a produce request, relative to the
    client's baseOffset, usually 0). The records of ``batches[i]`` are the ``record_count`` rows
    after those of the batches before it.
    """

    key: pa.BinaryArray
    value: pa.BinaryArray
    timestamp_ms: pa.Int64Array
    offset: pa.Int64Array
    headers: pa.ListArray
    batches: tuple[BatchInfo, ...]

    def __len__(self) -> int:
        return len(self.value)


_BINARY: Final = pa.binary()
_STRING: Final = pa.string()
_INT64: Final = pa.int64()
_NO_HEADERS: Final = pa.array([], HEADER_STRUCT)


def _binary_array(type_: pa.DataType, length: int, column: tuple[object, ...]) -> pa.Array:
    validity, null_count, offsets, data = column
    return pa.Array.from_buffers(
        type_,
        length,
        [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=null_count,
    )


def decode_batches(
    data: bytes | bytearray | memoryview,
    *,
    max_records: int,
    max_bytes: int,
    strict_offsets: bool = True,
) -> DecodedBatches:
    """Decodes the ``records`` field of one partition (one or more concatenated v2 batches).

    ``max_records`` bounds the records of all batches together, ``max_bytes`` the size of their
    records sections after decompression. Raises: as ``ERRORS`` maps (see the module doc).
    """
    if max_records < 0 or max_bytes < 0:
        raise ValueError("max_records and max_bytes must be >= 0")
    try:
        raw = _codec.decode(data, max_records, max_bytes, strict_offsets)
    except _codec.CodecError as exc:
        code, message = exc.args
        raise ERRORS[code](message) from None
    n, key, value, timestamp, offset, header_offsets, n_headers, header_key, header_value, batches = raw
    if n_headers:
        structs = pa.Array.from_buffers(
            HEADER_STRUCT,
            n_headers,
            [None],
            children=[_binary_array(_STRING, n_headers, header_key), _binary_array(_BINARY, n_headers, header_value)],
        )
    else:
        structs = _NO_HEADERS
    return DecodedBatches(
        key=_binary_array(_BINARY, n, key),
        value=_binary_array(_BINARY, n, value),
        timestamp_ms=pa.Array.from_buffers(_INT64, n, [None, pa.py_buffer(timestamp)], null_count=0),
        offset=pa.Array.from_buffers(_INT64, n, [None, pa.py_buffer(offset)], null_count=0),
        headers=pa.Array.from_buffers(
            HEADERS_TYPE, n, [None, pa.py_buffer(header_offsets)], null_count=0, children=[structs]
        ),
        batches=tuple(BatchInfo._make(fields) for fields in batches),
    )


def _flat(arr: pa.Array | pa.ChunkedArray, what: str) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks()
    if not isinstance(arr, pa.Array):
        raise TypeError(f"{what}: a pyarrow Array is required, not {type(arr).__name__}")
    return arr


def _int64_spec(arr: pa.Array | pa.ChunkedArray, what: str) -> tuple[pa.Buffer, int]:
    arr = _flat(arr, what)
    if not pa.types.is_integer(arr.type):
        raise TypeError(f"{what}: an integer array is required, not {arr.type}")
    if arr.type != pa.int64():
        arr = arr.cast(pa.int64())
    if arr.null_count:
        raise ValueError(f"{what}: nulls are not allowed")
    return arr.buffers()[1], arr.offset


_BinarySpec = tuple[pa.Buffer | None, pa.Buffer | None, pa.Buffer | None, int, int]


def _binary_spec(arr: pa.Array | pa.ChunkedArray, what: str) -> _BinarySpec:
    arr = _flat(arr, what)
    if arr.type == pa.string():
        arr = arr.view(pa.binary())
    elif arr.type != pa.binary():
        if not (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type) or _is_other_binary(arr.type)):
            raise TypeError(f"{what}: a binary array is required, not {arr.type}")
        arr = arr.cast(pa.binary())
    validity, offsets, data = arr.buffers()
    return (validity if arr.null_count else None, offsets, data, arr.offset, len(arr))


def _is_other_binary(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_large_binary(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_string_view(t)
        or pa.types.is_fixed_size_binary(t)
    )


def _headers_spec(
    headers: pa.Array | pa.ChunkedArray | None, length: int
) -> tuple[pa.Buffer | None, pa.Buffer | None, int, _BinarySpec, _BinarySpec]:
    empty: _BinarySpec = (None, None, None, 0, 0)
    if headers is None:
        return (None, pa.py_buffer(bytes(4 * (length + 1))), 0, empty, empty)
    headers = _flat(headers, "headers")
    if not (pa.types.is_list(headers.type) or pa.types.is_large_list(headers.type)):
        raise TypeError(f"headers: a list<struct<key: string, value: binary>> array is required, not {headers.type}")
    if headers.type != HEADERS_TYPE:
        headers = headers.cast(HEADERS_TYPE)
    structs = headers.values
    if structs.null_count:
        raise ValueError("headers: null header entries are not allowed")
    keys = structs.field("key")
    if keys.null_count:
        raise ValueError("headers: null header keys are not allowed")
    validity, offsets = headers.buffers()[:2]
    return (
        validity if headers.null_count else None,
        offsets,
        headers.offset,
        _binary_spec(keys, "header keys"),
        _binary_spec(structs.field("value"), "header values"),
    )


def encode_batch(
    *,
    base_offset: int,
    offsets: pa.Int64Array,
    timestamp_ms: pa.Int64Array,
    key: pa.BinaryArray,
    value: pa.BinaryArray,
    headers: pa.ListArray | None = None,
    timestamp_type: int = TIMESTAMP_CREATE_TIME,
    compression: str = "none",
    partition_leader_epoch: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Encodes the records as one v2 batch and returns its bytes.

    offsetDelta is ``offset - base_offset`` (offsets must increase, gaps allowed; lastOffsetDelta
    is the last offset's delta), baseTimestamp the first record's timestamp and maxTimestamp the
    largest. Arrays may be slices; ``headers=None`` means no headers on any record, and a null
    header list is written as no headers.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")
    if timestamp_type not in (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME):
        raise ValueError(f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), not {timestamp_type}")
    length = len(offsets)
    lengths = {len(timestamp_ms), len(key), len(value)} | ({len(headers)} if headers is not None else set())
    if lengths != {length}:
        raise ValueError("offsets, timestamp_ms, key, value and headers must have the same length")
    batch: bytes = _codec.encode(
        length=length,
        base_offset=base_offset,
        offsets=_int64_spec(offsets, "offsets"),
        timestamps=_int64_spec(timestamp_ms, "timestamp_ms"),
        key=_binary_spec(key, "key"),
        value=_binary_spec(value, "value"),
        headers=_headers_spec(headers, length),
        log_append_time=timestamp_type == TIMESTAMP_LOG_APPEND_TIME,
        compression=compression,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    return batch


def encode_stored(chunk: pa.RecordBatch, *, partition_leader_epoch: int = -1, compression: str = "none") -> list[bytes]:
    """Batches (compressed with `compression`: none, gzip, snappy, lz4, zstd) of stored rows (a topic table's columns: binary or string key and
    value, int64 offsets ascending, microsecond timestamps, timestampType, headers): one batch per
    run of records with the same timestamp type, and for LogAppendTime the same time (a client
    gives every record of such a batch the batch's time, as the broker set it for all at once).

    The fetch path's form of `encode_batch`: the columns' buffers are described once for the
    whole chunk and each run is an offset into them, and timestamps become milliseconds in numpy
    (measured: the per-call checks and pyarrow compute calls cost more than the codec itself on
    1 MB fetches of 1 KB records)."""
    n = chunk.num_rows
    if n == 0:
        return []
    types = chunk.column("timestampType").to_numpy(zero_copy_only=False)
    ms = _millis(chunk.column("timestamp"))
    # a new batch where the type changes, and where a LogAppendTime record's time does
    changes = (types[1:] != types[:-1]) | ((types[1:] == TIMESTAMP_LOG_APPEND_TIME) & (ms[1:] != ms[:-1]))
    cuts = [0, *(np.flatnonzero(changes) + 1).tolist(), n]
    offsets = chunk.column("offset")
    offset_spec = _int64_spec(offsets, "offsets")
    ms_spec = _int64_spec(pa.array(ms), "timestamp_ms")
    key = _binary_spec(chunk.column("key"), "key")
    value = _binary_spec(chunk.column("value"), "value")
    headers = _headers_spec(chunk.column("headers"), n)
    out = []
    for a, b in itertools.pairwise(cuts):
        count = b - a
        out.append(
            _codec.encode(
                length=count,
                base_offset=int(offsets[a].as_py()),
                offsets=(offset_spec[0], offset_spec[1] + a),
                timestamps=(ms_spec[0], ms_spec[1] + a),
                key=(*key[:3], key[3] + a, count),
                value=(*value[:3], value[3] + a, count),
                headers=(*headers[:2], headers[2] + a, *headers[3:]),
                log_append_time=int(types[a]) == TIMESTAMP_LOG_APPEND_TIME,
                compression=compression,
                partition_leader_epoch=partition_leader_epoch,
                producer_id=-1,
                producer_epoch=-1,
                base_sequence=-1,
            )
        )
    return out


def _millis(timestamps: pa.Array) -> np.ndarray:
    """Epoch milliseconds (-1 for a null) of timestamps in microseconds, truncated toward zero
    as Arrow's integer division does."""
    if not (pa.types.is_timestamp(timestamps.type) and timestamps.type.unit == "us"):
        timestamps = timestamps.cast(pa.timestamp("us"))
    us = timestamps.view(pa.int64())
    values = np.frombuffer(us.buffers()[1], dtype=np.int64, count=us.offset + len(us))[us.offset :]
    ms = np.abs(values) // 1000 * np.sign(values)
    if us.null_count:
        ms[~us.is_valid().to_numpy(zero_copy_only=False)] = -1
    return ms


class StoredBatches:
    """The Kafka face's `delta_log.log.reader.Encoder`: record batches of stored records,
    compressed with `compression` (none, gzip, snappy, lz4, zstd; producer: as the records'
    producers compressed theirs, a file's or table's `CODEC_KEY` metadata), split into runs as
    `encode_stored` splits them, made from a table in memory or by the codec straight from a local
    file's row groups (the codec keeps the last `max_files` files it read open, with their parsed
    footers, up to `max_footer_bytes`; a file deleted meanwhile stays readable while it is held).
    Thread-safe; keep one per process and codec (`compressed` gives the others, sharing the open
    files; the reader's read-ahead keys its results by the encoder)."""

    def __init__(
        self, max_files: int = 128, max_footer_bytes: int = 64 << 20, *, compression: str = "none", files: Any = None
    ) -> None:
        self._files = files if files is not None else _codec.StoredBatches(max_files, max_footer_bytes)
        self.compression = compression
        self._siblings: dict[str, StoredBatches] = {compression: self}

    def compressed(self, compression: str) -> StoredBatches:
        """The encoder of `compression` batches over the same open files (one per codec)."""
        sibling = self._siblings.get(compression)
        if sibling is None:
            sibling = StoredBatches(compression=compression, files=self._files)
            sibling._siblings = self._siblings
            sibling = self._siblings.setdefault(compression, sibling)
        return sibling

    def table(self, records: pa.Table) -> bytes:
        compression = self.compression
        if compression == "producer":  # as the records' producers compressed them (CODEC_KEY)
            compression = (records.schema.metadata or {}).get(CODEC_KEY.encode(), b"none").decode()
            compression = compression if compression in COMPRESSIONS else "none"
        return b"".join(
            batch for chunk in records.to_batches() for batch in encode_stored(chunk, compression=compression)
        )

    def stored(
        self,
        path: str,
        row_groups: list[int],
        *,
        skip_rows: int,
        start: int,
        max_records: int,
        max_bytes: int,
        take_one: bool,
        batch_rows: int,
    ) -> Encoded | str:
        got = self._files.read(
            path,
            row_groups,
            skip_rows=skip_rows,
            start=start,
            max_records=max_records,
            max_bytes=max_bytes,
            take_one=take_one,
            batch_rows=batch_rows,
            compression=self.compression,
        )
        if isinstance(got, str):
            return got
        data, count, last_offset, size, full = got
        return Encoded(data=data, count=count, last_offset=last_offset, size=size, full=full)
