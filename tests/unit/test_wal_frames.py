"""Write-ahead frames (delta_log.log.wal): what a reader takes from a segment file's bytes."""

from __future__ import annotations

import struct
import zlib

import crc32c
import pyarrow as pa

from delta_log.core.records import TOPIC_SCHEMA
from delta_log.log.wal import decode_frames, encode_frame, frame_header


def _records(topic: str, n: int) -> pa.Table:
    rows = [
        {"key": None, "value": b"v", "topic": topic, "partition": 0, "offset": i, "timestamp": None,
         "timestampType": 0, "headers": []}
        for i in range(n)
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, TOPIC_SCHEMA)


def _frame(topic: str, n: int, salt: bytes) -> bytes:
    payload = encode_frame(_records(topic, n), [])
    return frame_header(payload, salt) + payload.to_pybytes()


def _old_frame(topic: str, n: int) -> bytes:
    payload = encode_frame(_records(topic, n), []).to_pybytes()
    return struct.pack(">4sII", b"TLW1", len(payload), zlib.crc32(payload)) + payload


def _zlib_frame(topic: str, n: int, salt: bytes) -> bytes:
    """A frame as gateways wrote it before the CRC became crc32c (TLW2: zlib's crc32)."""
    payload = encode_frame(_records(topic, n), []).to_pybytes()
    return struct.pack(">4sII8s", b"TLW2", len(payload), zlib.crc32(payload, zlib.crc32(salt)), salt) + payload


def topics(data: bytes) -> list[str]:
    return [f.records.column("topic")[0].as_py() for f in decode_frames(data)]


def test_a_file_is_read_up_to_the_first_frame_of_another_salt():
    new, old = b"n" * 8, b"o" * 8
    assert topics(_frame("a", 2, new) + _frame("b", 2, new) + _frame("c", 2, old) + _frame("d", 2, new)) == ["a", "b"]


def test_old_format_files_still_read_and_formats_never_mix_in_one_file():
    assert topics(_old_frame("a", 1) + _old_frame("b", 1)) == ["a", "b"]
    assert topics(_frame("a", 1, b"s" * 8) + _old_frame("b", 1)) == ["a"]  # no salt to check: refused
    assert topics(_old_frame("a", 1) + _frame("b", 1, b"s" * 8)) == ["a"]


def test_a_torn_or_damaged_frame_ends_the_file():
    salt = b"x" * 8
    whole = _frame("a", 3, salt) + _frame("b", 3, salt)
    assert topics(whole[: len(whole) - 5]) == ["a"]  # the last write cut short: never acked
    damaged = bytearray(whole)
    damaged[len(whole) - 10] ^= 0xFF
    assert topics(bytes(damaged)) == ["a"]
    assert topics(whole[:10]) == []


def test_frames_carry_a_crc32c_and_files_of_the_zlib_format_still_read():
    salt = b"z" * 8
    frame = _frame("a", 2, salt)
    payload = frame[20:]  # after the header: magic, length, CRC, salt
    assert frame[:4] == b"TLW3" and struct.unpack(">I", frame[8:12])[0] == crc32c.crc32c(payload, crc32c.crc32c(salt))
    assert topics(_zlib_frame("a", 1, salt) + _zlib_frame("b", 2, salt)) == ["a", "b"]  # written before
    damaged = bytearray(_zlib_frame("a", 1, salt) + _zlib_frame("b", 2, salt))
    damaged[-3] ^= 0x01
    assert topics(bytes(damaged)) == ["a"]  # each format's frames are checked by their own CRC
    assert topics(_zlib_frame("a", 1, b"o" * 8) + frame) == ["a"]  # another salt: an older life of the file
