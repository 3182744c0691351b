"""The compiled record batch v2 codec (kafka_gateway.records): round trips, interop with two
independent Kafka client implementations (kafka-python, aiokafka), every compression framing a
client writes, and every refusal with its Kafka error code."""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cramjam
import lz4.frame
import pyarrow as pa
import pytest
import zstandard
from aiokafka.record import default_records as aiokafka_records
from aiokafka.record.util import calc_crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.codec import snappy_encode as kafka_python_snappy_xerial
from kafka.record import default_records as kafka_python_records

from delta_log.errors import TopiclakeError
from kafka_gateway.errors import code_of
from kafka_gateway.records import (
    COMPRESSIONS,
    ERRORS,
    HEADERS_TYPE,
    DecodedBatches,
    decode_batches,
    encode_batch,
)

ROOT = Path(__file__).resolve().parents[2]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
BIG = 1 << 30

Header = tuple[str, bytes | None]
Record = tuple[int, int, bytes | None, bytes | None, list[Header]]  # offset, timestamp, key, value, headers


def _encode(records: list[Record], *, base_offset: int = 0, compression: str = "none", **kw: Any) -> bytes:
    return encode_batch(
        base_offset=base_offset,
        offsets=pa.array([r[0] for r in records], pa.int64()),
        timestamp_ms=pa.array([r[1] for r in records], pa.int64()),
        key=pa.array([r[2] for r in records], pa.binary()),
        value=pa.array([r[3] for r in records], pa.binary()),
        headers=pa.array([[{"key": k, "value": v} for k, v in r[4]] for r in records], HEADERS_TYPE),
        compression=compression,
        **kw,
    )


def _rows(d: DecodedBatches) -> list[Record]:
    headers = [[(h["key"], h["value"]) for h in hs] for hs in d.headers.to_pylist()]
    return list(
        zip(
            d.offset.to_pylist(),
            d.timestamp_ms.to_pylist(),
            d.key.to_pylist(),
            d.value.to_pylist(),
            headers,
            strict=True,
        )
    )


def _decode(data: bytes | bytearray | memoryview, **kw: Any) -> DecodedBatches:
    kw.setdefault("max_records", 1_000_000)
    kw.setdefault("max_bytes", BIG)
    out = decode_batches(data, **kw)
    for arr in (out.key, out.value, out.timestamp_ms, out.offset, out.headers):
        arr.validate(full=True)
    assert out.headers.type == HEADERS_TYPE
    return out


@dataclass(frozen=True)
class Refused:
    code: str  # Kafka's error name, as the Kafka face answers it
    message: str


def _kafka_name(exc: TopiclakeError) -> str:
    name = code_of(exc).name.upper()
    assert name in ERRORS, name  # one of the codec's refusals, and nothing else
    return name


def _error(data: bytes | bytearray, **kw: Any) -> Refused:
    with pytest.raises(TopiclakeError) as info:
        _decode(data, **kw)
    return Refused(_kafka_name(info.value), info.value.message)


def _patch(batch: bytes, *, records: bytes | None = None, fix_crc: bool = True, **fields: int) -> bytes:
    """A copy of `batch` with header fields replaced (and records section, batchLength, CRC)."""
    b = bytearray(batch[:61]) + (batch[61:] if records is None else records)
    if records is not None:
        struct.pack_into(">i", b, 8, len(b) - 12)
    layout = {
        "base_offset": (0, ">q"),
        "batch_length": (8, ">i"),
        "magic": (16, ">b"),
        "attributes": (21, ">h"),
        "last_offset_delta": (23, ">i"),
        "producer_id": (43, ">q"),
        "count": (57, ">i"),
    }
    for name, value in fields.items():
        at, fmt = layout[name]
        struct.pack_into(fmt, b, at, value)
    if fix_crc:
        struct.pack_into(">I", b, 17, calc_crc32c(bytes(b[21:])))
    return bytes(b)


SAMPLE: list[Record] = [
    (0, 1_700_000_000_000, b"k0", b"v" * 100, [("trace", b"abc"), ("null-value", None)]),
    (1, 1_700_000_000_005, None, b"null key", []),
    (2, 1_699_999_999_990, b"tombstone", None, [("ключ-ü", b"\x00\xff")]),
    (3, 1_700_000_000_001, b"", b"", [("", b""), ("日本", None), ("x", b"y" * 300)]),
]
GAPPED: list[Record] = [(100 + d, ts, k, v, h) for d, (_, ts, k, v, h) in zip([0, 5, 6, 40], SAMPLE, strict=True)]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_round_trip_every_compression(compression: str) -> None:
    batch = _encode(SAMPLE, compression=compression, producer_id=7, producer_epoch=2, base_sequence=11)
    out = _decode(batch)
    assert _rows(out) == SAMPLE
    (info,) = out.batches
    assert (info.compression, info.record_count, info.last_offset_delta) == (compression, 4, 3)
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (7, 2, 11)
    assert info.base_timestamp == SAMPLE[0][1]
    assert info.max_timestamp == max(r[1] for r in SAMPLE)
    assert info.size_bytes == len(batch)
    assert (info.timestamp_type, info.is_transactional, info.is_control) == (0, False, False)
    assert out.key.null_count == 1 and out.value.null_count == 1
    assert out.headers.null_count == 0 and out.headers.to_pylist()[1] == []


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_round_trip_offset_gaps(compression: str) -> None:
    batch = _encode(GAPPED, base_offset=100, compression=compression)
    assert _rows(_decode(batch, strict_offsets=False)) == GAPPED
    assert _decode(batch, strict_offsets=False).batches[0].last_offset_delta == 40
    assert _error(batch).code == "INVALID_RECORD"


def test_sliced_arrays_and_chunks() -> None:
    n = 50
    full: list[Record] = [
        (
            i,
            1000 + i,
            None if i % 7 == 0 else f"k{i}".encode(),
            None if i % 5 == 0 else b"v" * i,
            [(f"h{j}é", None if (i + j) % 3 == 0 else bytes([i, j])) for j in range(i % 4)],
        )
        for i in range(n)
    ]
    offsets = pa.array([r[0] for r in full], pa.int64())
    ts = pa.array([r[1] for r in full], pa.int64())
    keys = pa.array([r[2] for r in full], pa.binary())
    values = pa.array([r[3] for r in full], pa.binary())
    headers = pa.array([[{"key": k, "value": v} for k, v in r[4]] for r in full], HEADERS_TYPE)
    for start, length in [(0, n), (1, 10), (13, 17), (49, 1), (3, 46)]:
        batch = encode_batch(
            base_offset=start,
            offsets=offsets.slice(start, length),
            timestamp_ms=ts.slice(start, length),
            key=keys.slice(start, length),
            value=values.slice(start, length),
            headers=headers.slice(start, length),
        )
        assert _rows(_decode(batch)) == full[start : start + length]
    chunked = pa.chunked_array([values.slice(0, 20), values.slice(20)]).slice(15, 10)
    assert (chunked.chunk(0).offset, chunked.chunk(1).offset) == (15, 20)
    for chunk, start in [(chunked.chunk(0), 15), (chunked.chunk(1), 20)]:
        length = len(chunk)
        batch = encode_batch(
            base_offset=start,
            offsets=offsets.slice(start, length),
            timestamp_ms=ts.slice(start, length),
            key=keys.slice(start, length),
            value=chunk,
            headers=headers.slice(start, length),
        )
        assert _rows(_decode(batch)) == full[start : start + length]


def test_other_binary_types_and_no_headers() -> None:
    batch = encode_batch(
        base_offset=0,
        offsets=pa.array([0, 1], pa.int32()),
        timestamp_ms=pa.array([5, 6]),
        key=pa.array(["a", None], pa.large_string()),
        value=pa.array([b"x", b"yy"], pa.large_binary()),
    )
    out = _decode(batch)
    assert _rows(out) == [(0, 5, b"a", b"x", []), (1, 6, None, b"yy", [])]


def test_multiple_batches_and_memoryview_input() -> None:
    first = _encode(SAMPLE[:2], compression="lz4")
    second = _encode([(0, 9, b"k", b"v", [])], base_offset=0, compression="zstd")
    data = bytearray(first + second)
    out = _decode(memoryview(data))
    assert [b.record_count for b in out.batches] == [2, 1]
    assert out.value.to_pylist() == [SAMPLE[0][3], SAMPLE[1][3], b"v"]
    assert _error(first + second, max_records=2).code == "RECORD_LIST_TOO_LARGE"


def test_log_append_time_and_flags() -> None:
    batch = _encode(SAMPLE, timestamp_type=1)
    out = _decode(batch)
    assert out.batches[0].timestamp_type == 1
    assert out.timestamp_ms.to_pylist() == [max(r[1] for r in SAMPLE)] * len(SAMPLE)
    flagged = _patch(batch, attributes=0x08 | 0x10 | 0x20, producer_id=3)
    info = _decode(flagged).batches[0]
    assert (info.is_transactional, info.is_control, info.producer_id) == (True, True, 3)


def test_encode_refuses_bad_inputs() -> None:
    one = {
        "base_offset": 0,
        "offsets": pa.array([0]),
        "timestamp_ms": pa.array([0]),
        "key": pa.array([None], pa.binary()),
        "value": pa.array([b"v"]),
    }
    with pytest.raises(ValueError, match="compression"):
        encode_batch(**one, compression="brotli")
    with pytest.raises(ValueError, match="same length"):
        encode_batch(**{**one, "value": pa.array([b"v", b"w"])})
    with pytest.raises(ValueError, match="increase"):
        encode_batch(
            **{
                **one,
                "offsets": pa.array([0, 0]),
                "timestamp_ms": pa.array([0, 0]),
                "key": pa.array([None, None], pa.binary()),
                "value": pa.array([b"v", b"w"]),
            }
        )
    with pytest.raises(ValueError, match="increase"):
        encode_batch(**{**one, "base_offset": 1})
    with pytest.raises(ValueError, match="nulls"):
        encode_batch(**{**one, "timestamp_ms": pa.array([None], pa.int64())})
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch(**{k: (v if k == "base_offset" else v.slice(0, 0)) for k, v in one.items()})
    with pytest.raises(TypeError):
        encode_batch(**{**one, "value": pa.array([1.5])})


# -- interop with independent implementations -------------------------------------------------

IMPLEMENTATIONS = {
    "kafka-python": (kafka_python_records.DefaultRecordBatchBuilder, kafka_python_records.DefaultRecordBatch),
    "aiokafka": (aiokafka_records.DefaultRecordBatchBuilder, aiokafka_records.DefaultRecordBatch),
}


def _their_batch(impl: str, compression: str, records: list[Record]) -> bytes:
    builder_cls, _ = IMPLEMENTATIONS[impl]
    builder = builder_cls(
        magic=2,
        compression_type=CODEC_IDS[compression],
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=BIG,
    )
    for offset, ts, key, value, headers in records:
        builder.append(offset, ts, key, value, headers)
    return bytes(builder.build())


def _their_read(impl: str, batch: bytes) -> tuple[Any, list[Record]]:
    _, reader_cls = IMPLEMENTATIONS[impl]
    parsed = reader_cls(batch)
    assert parsed.validate_crc()
    rows = [(r.offset, r.timestamp, r.key, r.value, [(k, v) for k, v in r.headers]) for r in parsed]
    return parsed, rows


def _many(n: int) -> list[Record]:
    return [
        (
            i,
            1_700_000_000_000 + (i * 37) % 1000,
            None if i % 9 == 0 else b"key-%d" % i,
            None if i % 11 == 0 else (b"value-%d-" % i) * (i % 40),
            [("h", b"%d" % i)] if i % 3 else [],
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_interop_theirs_decoded_by_ours(impl: str, compression: str) -> None:
    records = SAMPLE + [(4 + r[0], *r[1:]) for r in _many(300)]
    batch = _their_batch(impl, compression, records)
    out = _decode(batch)
    assert _rows(out) == records
    assert out.batches[0].compression == compression


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_interop_ours_decoded_by_theirs(impl: str, compression: str) -> None:
    records = SAMPLE + [(4 + r[0], *r[1:]) for r in _many(300)]
    batch = _encode(records, compression=compression)
    parsed, rows = _their_read(impl, batch)
    assert rows == records
    assert parsed.compression_type == CODEC_IDS[compression]
    assert (parsed.base_offset, parsed.last_offset_delta, parsed.max_timestamp) == (
        0,
        len(records) - 1,
        max(r[1] for r in records),
    )
    _, rows = _their_read(impl, _encode(GAPPED, base_offset=100, compression=compression))
    assert rows == GAPPED


# -- compression framings as written by other clients ------------------------------------------


def _section() -> bytes:
    """An uncompressed records section of a batch holding `_many(2000)` (about 60 KiB)."""
    return _encode(_many(2000))[61:]


def _compressed_batch(codec: str, compressed: bytes) -> bytes:
    return _patch(_encode(_many(2000)), records=compressed, attributes=CODEC_IDS[codec])


@pytest.mark.parametrize(
    "framing",
    [
        pytest.param(lambda s: kafka_python_snappy_xerial(s, xerial_blocksize=4096), id="xerial-4k-blocks"),
        pytest.param(kafka_python_snappy_xerial, id="xerial-32k-blocks"),
        pytest.param(lambda s: bytes(cramjam.snappy.compress_raw(s)), id="raw-block"),
    ],
)
def test_snappy_java_framing_and_raw(framing: Callable[[bytes], bytes]) -> None:
    compressed = framing(_section())
    assert _rows(_decode(_compressed_batch("snappy", compressed))) == _many(2000)


def test_snappy_written_with_java_framing() -> None:
    compressed = _encode(_many(2000), compression="snappy")[61:]
    assert compressed[:8] == b"\x82SNAPPY\x00"
    assert struct.unpack(">ii", compressed[8:16]) == (1, 1)
    first_block = struct.unpack(">i", compressed[16:20])[0]
    assert len(cramjam.snappy.decompress_raw(compressed[20 : 20 + first_block])) == 32 * 1024


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"content_checksum": True},
        {"block_checksum": True, "content_checksum": True, "block_size": lz4.frame.BLOCKSIZE_MAX4MB},
        {"block_linked": False, "store_size": False, "block_size": lz4.frame.BLOCKSIZE_MAX64KB},
        {"block_linked": True},
    ],
)
def test_lz4_frame_flags(options: dict[str, Any]) -> None:
    compressed = lz4.frame.compress(_section(), **options)
    assert _rows(_decode(_compressed_batch("lz4", compressed))) == _many(2000)


def test_lz4_written_like_kafka() -> None:
    compressed = _encode(_many(2000), compression="lz4")[61:]
    assert compressed[:4] == b"\x04\x22\x4d\x18"
    flg, bd = compressed[4], compressed[5]
    assert flg >> 6 == 1  # version 01
    assert flg & 0x20  # independent blocks
    assert flg & (0x10 | 0x08 | 0x04) == 0  # no block checksum, content size or content checksum
    assert bd == 0x40  # 64 KiB blocks


def test_zstd_streamed_without_content_size() -> None:
    section = _section()
    stream = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
    compressed = stream.compress(section[:1000]) + stream.compress(section[1000:]) + stream.flush()
    assert zstandard.get_frame_parameters(compressed).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert _rows(_decode(_compressed_batch("zstd", compressed))) == _many(2000)


def test_gzip_concatenated_members() -> None:
    section = _section()
    compressed = gzip.compress(section[:5000]) + gzip.compress(section[5000:], compresslevel=1)
    assert _rows(_decode(_compressed_batch("gzip", compressed))) == _many(2000)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_garbage_compressed_payload_is_corrupt(codec: str) -> None:
    assert _error(_compressed_batch(codec, b"\x82SNAPPY\x00" + b"\xff" * 40)).code == "CORRUPT_MESSAGE"


# -- refusals -----------------------------------------------------------------------------------


def test_empty_input() -> None:
    assert _error(b"").code == "CORRUPT_MESSAGE"


def test_wrong_crc() -> None:
    batch = bytearray(_encode(SAMPLE))
    batch[-1] ^= 0x01
    assert _error(bytes(batch)).code == "CORRUPT_MESSAGE"
    assert "CRC" in _error(_patch(_encode(SAMPLE), fix_crc=False, count=3)).message


def test_record_count_lies() -> None:
    batch = _encode(SAMPLE)
    assert _error(_patch(batch, count=5, last_offset_delta=4)).code == "INVALID_RECORD"
    assert _error(_patch(batch, count=3, last_offset_delta=2)).code == "INVALID_RECORD"
    assert _error(_patch(batch, count=-1)).code == "INVALID_RECORD"
    assert _error(_patch(batch, count=0, last_offset_delta=-1)).code == "INVALID_RECORD"
    compressed = _encode(SAMPLE, compression="zstd")
    assert _error(_patch(compressed, count=5, last_offset_delta=4)).code == "INVALID_RECORD"
    assert _error(_patch(compressed, count=3, last_offset_delta=2)).code == "INVALID_RECORD"


def test_last_offset_delta_and_offset_deltas() -> None:
    batch = _encode(SAMPLE)
    assert _error(_patch(batch, last_offset_delta=4)).code == "INVALID_RECORD"
    swapped = _encode([(0, *SAMPLE[0][1:]), (2, *SAMPLE[1][1:]), (3, *SAMPLE[2][1:]), (4, *SAMPLE[3][1:])])
    assert _error(_patch(swapped, last_offset_delta=3)).code == "INVALID_RECORD"
    out_of_order = _encode([(0, *SAMPLE[1][1:]), (5, *SAMPLE[0][1:])])
    section = out_of_order[61:]
    first_len = section[0] // 2 + 1  # one-byte varint length
    reordered = section[first_len:] + section[:first_len]
    assert _error(_patch(out_of_order, records=reordered), strict_offsets=False).code == "INVALID_RECORD"


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_every_truncation_is_refused(compression: str) -> None:
    batch = _encode(SAMPLE, compression=compression)
    for n in range(1, len(batch)):
        err = _error(batch[:n])
        assert err.code == "CORRUPT_MESSAGE", (n, err)
    for n in range(len(batch) - 1):
        assert _error(batch + batch[:n] if n else batch[:-1]).code == "CORRUPT_MESSAGE"


def test_truncated_records_inside_a_consistent_batch() -> None:
    section = _encode(SAMPLE)[61:]
    for n in range(len(section)):
        err = _error(_patch(_encode(SAMPLE), records=section[:n]))
        assert err.code == "INVALID_RECORD", (n, err)


def test_huge_declared_batch_length() -> None:
    batch = _encode(SAMPLE)
    for length in (2**31 - 1, 2**30, len(batch) - 11):
        assert _error(_patch(batch, batch_length=length, fix_crc=False)).code == "CORRUPT_MESSAGE"
    assert _error(_patch(batch, batch_length=-5, fix_crc=False)).code == "CORRUPT_MESSAGE"
    assert _error(_patch(batch, batch_length=48, fix_crc=False)).code == "CORRUPT_MESSAGE"


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_old_magic(magic: int) -> None:
    assert _error(_patch(_encode(SAMPLE), magic=magic)).code == "UNSUPPORTED_FOR_MESSAGE_FORMAT"


def test_legacy_message_set() -> None:
    value = b"hello"
    body = struct.pack(">bb", 0, 0) + struct.pack(">i", -1) + struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(body)) + body
    legacy = struct.pack(">qi", 0, len(message)) + message
    assert _error(legacy).code == "UNSUPPORTED_FOR_MESSAGE_FORMAT"


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_compression(codec: int) -> None:
    assert _error(_patch(_encode(SAMPLE), attributes=codec)).code == "UNSUPPORTED_COMPRESSION_TYPE"


def test_too_many_records() -> None:
    batch = _encode(_many(100))
    assert len(_decode(batch, max_records=100)) == 100
    assert _error(batch, max_records=99).code == "RECORD_LIST_TOO_LARGE"


def test_max_bytes_on_plain_and_compressed_records() -> None:
    batch = _encode(_many(100))
    size = len(batch) - 61
    assert len(_decode(batch, max_bytes=size)) == 100
    assert _error(batch, max_bytes=size - 1).code == "MESSAGE_TOO_LARGE"
    for compression in ("gzip", "snappy", "lz4", "zstd"):
        compressed = _encode(_many(100), compression=compression)
        assert len(_decode(compressed, max_bytes=size)) == 100
        assert _error(compressed, max_bytes=size - 1).code == "MESSAGE_TOO_LARGE"


def _varint(v: int) -> bytes:
    u = (v << 1) ^ (v >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _raw_record(body: bytes) -> bytes:
    return _varint(len(body)) + body


def _one_record_batch(body: bytes) -> bytes:
    return _patch(_encode([(0, 0, None, b"v", [])]), records=_raw_record(body))


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\x00" + _varint(0) + _varint(0) + _varint(-2) + _varint(1) + b"v" + _varint(0), "negative key length"),
        (b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(-7) + _varint(0), "negative value length"),
        (b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(-1) + _varint(-1), "negative header count"),
        (
            b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(-1) + _varint(1) + _varint(-1) + _varint(-1),
            "null header key",
        ),
        (
            b"\x00"
            + _varint(0)
            + _varint(0)
            + _varint(-1)
            + _varint(-1)
            + _varint(1)
            + _varint(2)
            + b"\xc3\x28"
            + _varint(-1),
            "header key not UTF-8",
        ),
        (b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(-1) + _varint(0) + b"\x00", "record too long"),
        (b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(5) + b"v", "value past the record"),
        (b"\x00" + b"\xff" * 10 + b"\x01" + _varint(0) + _varint(-1) + _varint(-1) + _varint(0), "varlong overflow"),
        (b"\x00" + _varint(0) + b"\xff\xff\xff\xff\x7f" + _varint(-1) + _varint(-1) + _varint(0), "varint overflow"),
        (
            b"\x00" + _varint(0) + b"\xff\xff\xff\xff\xff\x01" + _varint(-1) + _varint(-1) + _varint(0),
            "varint too long",
        ),
        (b"\x00" + _varint(0) + _varint(1) + _varint(-1) + _varint(-1) + _varint(0), "offsetDelta 1 first"),
    ],
)
def test_invalid_records(body: bytes, why: str) -> None:
    assert _error(_one_record_batch(body)).code == "INVALID_RECORD", why


def test_valid_hand_built_record() -> None:
    body = (
        b"\x00"
        + _varint(-3)
        + _varint(0)
        + _varint(-1)
        + _varint(1)
        + b"v"
        + _varint(1)
        + _varint(1)
        + b"k"
        + _varint(-1)
    )
    out = _decode(_one_record_batch(body))
    assert _rows(out) == [(0, -3, None, b"v", [("k", None)])]
    negative_record_length = _patch(_encode([(0, 0, None, b"v", [])]), records=_varint(-1) + b"\x00" * 8)
    assert _error(negative_record_length).code == "INVALID_RECORD"


_BOMB_SIZE = 100 << 20
_CHUNK = b"\x00" * (1 << 20)


def _bomb(codec: str) -> bytes:
    """`_BOMB_SIZE` bytes of zeros compressed, produced in 1 MiB steps."""
    if codec == "gzip":
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        return b"".join(z.compress(_CHUNK) for _ in range(100)) + z.flush()
    if codec == "zstd":
        zc = zstandard.ZstdCompressor(write_content_size=False).compressobj()
        return b"".join(zc.compress(_CHUNK) for _ in range(100)) + zc.flush()
    if codec == "lz4":
        lc = lz4.frame.LZ4FrameCompressor()
        return lc.begin() + b"".join(lc.compress(_CHUNK) for _ in range(100)) + lc.flush()
    block = bytes(cramjam.snappy.compress_raw(_CHUNK[: 32 * 1024]))
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + (struct.pack(">i", len(block)) + block) * 3200


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {codec: _compressed_batch(codec, _bomb(codec)) for codec in ("gzip", "snappy", "lz4", "zstd")}


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_decompression_bomb_refused_quickly(bombs: dict[str, bytes], codec: str) -> None:
    started = time.perf_counter()
    assert _error(bombs[codec], max_bytes=1 << 20).code == "MESSAGE_TOO_LARGE"
    assert time.perf_counter() - started < 1.0


_RSS_PROBE = """
import json, resource, sys
from delta_log.errors import TopiclakeError
from kafka_gateway.errors import code_of
from kafka_gateway.records import decode_batches
bombs = [open(p, "rb").read() for p in sys.argv[1:]]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
codes = []
for bomb in bombs:
    try:
        decode_batches(bomb, max_records=10**6, max_bytes=1 << 20)
    except TopiclakeError as exc:
        codes.append(code_of(exc).name.upper())
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"codes": codes, "grew_kib": after - before}))
"""


def test_decompression_bomb_never_allocates_its_size(bombs: dict[str, bytes], tmp_path: Path) -> None:
    paths = []
    for codec, batch in bombs.items():
        path = tmp_path / f"{codec}.bin"
        path.write_bytes(batch)
        paths.append(str(path))
    done = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, *paths], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(done.stdout)
    assert result["codes"] == ["MESSAGE_TOO_LARGE"] * 4
    assert result["grew_kib"] < 24 * 1024, result


# -- properties ---------------------------------------------------------------------------------

_blobs = st.one_of(st.none(), st.binary(max_size=300))
_headers = st.lists(st.tuples(st.text(max_size=12), _blobs), max_size=4)
_records = st.lists(st.tuples(st.integers(-(2**61), 2**61), _blobs, _blobs, _headers), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=_records,
    gaps=st.lists(st.integers(1, 1000), min_size=40, max_size=40),
    base_offset=st.integers(0, 2**40),
    compression=st.sampled_from(COMPRESSIONS),
    start=st.integers(0, 3),
)
def test_property_round_trip(
    records: list[tuple[int, bytes | None, bytes | None, list[Header]]],
    gaps: list[int],
    base_offset: int,
    compression: str,
    start: int,
) -> None:
    offsets = [base_offset + sum(gaps[:i]) - gaps[0] for i in range(1, len(records) + 1)]
    expected: list[Record] = [(o, ts, k, v, h) for o, (ts, k, v, h) in zip(offsets, records, strict=True)]
    padded = expected[:1] * start + expected
    full = {
        "offsets": pa.array([r[0] for r in padded], pa.int64()),
        "timestamp_ms": pa.array([r[1] for r in padded], pa.int64()),
        "key": pa.array([r[2] for r in padded], pa.binary()),
        "value": pa.array([r[3] for r in padded], pa.binary()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in r[4]] for r in padded], HEADERS_TYPE),
    }
    batch = encode_batch(
        base_offset=base_offset, compression=compression, **{k: v.slice(start) for k, v in full.items()}
    )
    assert _rows(_decode(batch, strict_offsets=False)) == expected
    _, theirs = _their_read("kafka-python", batch)
    assert theirs == expected


@settings(max_examples=300, deadline=None)
@given(data=st.data(), compression=st.sampled_from(COMPRESSIONS))
def test_property_mutations_never_crash(data: st.DataObject, compression: str) -> None:
    batch = bytearray(_encode(SAMPLE, compression=compression))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(batch) - 1))
        batch[at] = data.draw(st.integers(0, 255))
    candidate = _patch(bytes(batch), fix_crc=data.draw(st.booleans()))
    try:
        _decode(candidate, strict_offsets=data.draw(st.booleans()), max_bytes=1 << 20)
    except TopiclakeError as exc:
        _kafka_name(exc)


def _stored_rows(rows: list[tuple[int, int | None, int, bytes | None, str | None, list[Header] | None]]) -> pa.Table:
    from delta_log.core.records import TOPIC_SCHEMA

    return pa.table(
        {
            "key": pa.array([r[3] for r in rows], pa.binary()),
            "value": pa.array([r[4] for r in rows], pa.string()),  # a string column: viewed as binary
            "topic": pa.array(["t"] * len(rows)),
            "partition": pa.array([0] * len(rows), pa.int32()),
            "offset": pa.array([r[0] for r in rows], pa.int64()),
            "timestamp": pa.array([r[1] for r in rows], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([r[2] for r in rows], pa.int32()),
            "headers": pa.array(
                [None if r[5] is None else [{"key": k, "value": v} for k, v in r[5]] for r in rows], HEADERS_TYPE
            ),
        },
        schema=TOPIC_SCHEMA,
    )


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from([0, 1500, -1500, 10**12]), st.integers(-(10**15), 10**15)),
            st.integers(0, 1),
            st.one_of(st.none(), st.binary(max_size=8)),
            st.one_of(st.none(), st.text(max_size=8)),
            st.one_of(
                st.none(),
                st.lists(st.tuples(st.text(max_size=3), st.one_of(st.none(), st.binary(max_size=3))), max_size=2),
            ),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 5),
)
def test_stored_rows_encode_as_their_runs_do(rows: list[Any], cut: int) -> None:
    """`encode_stored` (the fetch path: one description of a chunk's buffers, runs as offsets into
    it, timestamps made milliseconds in numpy) writes exactly the batches `encode_batch` writes for
    each run of one timestamp type (of one time, for LogAppendTime: such a batch gives every record
    its time), also on sliced chunks, null timestamps (-1), negative times."""
    from kafka_gateway.records import encode_stored

    table = _stored_rows([(10 + 2 * i, *r) for i, r in enumerate(rows)])
    chunks = [table.slice(0, min(cut, len(rows))), table.slice(min(cut, len(rows)))]
    for chunk in (b for part in chunks for b in part.to_batches()):
        got = encode_stored(chunk)
        types = chunk.column("timestampType").to_pylist()
        every_ms = [-1 if v is None else int(v / 1000) for v in chunk.column("timestamp").cast(pa.int64()).to_pylist()]
        want, a = [], 0
        for b in range(1, len(types) + 1):
            if b == len(types) or types[b] != types[a] or (types[a] == 1 and every_ms[b] != every_ms[a]):
                ms = every_ms[a:b]  # toward zero, as Arrow divides
                want.append(
                    encode_batch(
                        base_offset=chunk.column("offset")[a].as_py(),
                        offsets=chunk.column("offset").slice(a, b - a),
                        timestamp_ms=pa.array(ms, pa.int64()),
                        key=chunk.column("key").slice(a, b - a),
                        value=chunk.column("value").slice(a, b - a),
                        headers=chunk.column("headers").slice(a, b - a),
                        timestamp_type=types[a],
                        partition_leader_epoch=-1,
                    )
                )
                a = b
        assert got == want
