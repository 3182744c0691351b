"""Record batch codec benchmark: kafka_gateway.records (Rust, Arrow buffers) against aiokafka's
Cython DefaultRecordBatch/DefaultRecordBatchBuilder, side by side in the same run.

    python -m bench.codec_bench            # every codec, 100 B and 1 KB values, 16 KiB and 1 MiB batches
    python -m bench.codec_bench --quick    # shorter timings

For each case one batch is encoded once, then decoded (and the records encoded again) in a loop:
records/s is the best of three rounds of at least `--seconds` each (the machine is shared, so the
ratios measured in the same run are the figures to compare). Ours decodes into pyarrow arrays and
encodes from them; aiokafka iterates records into Python objects and appends them one by one,
which is how it is used. 16 KiB is the Java producer's default batch.size, 1 MiB its default
max.request.size. Results go to bench/results/codec_bench.json.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from bench.common import print_table, write_results
from kafka_gateway.records import COMPRESSIONS, decode_batches, encode_batch

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
WORDS = [b"user", b"order", b"event", b"click", b"id", b"amount", b"EUR", b"true", b"false", b"status", b"ok"]


def make_values(n: int, size: int, rng: random.Random) -> list[bytes]:
    """JSON-like values of `size` bytes: a few words and numbers, about as compressible as logs."""
    out = []
    for i in range(n):
        parts = [b'{"seq": %d' % i]
        length = len(parts[0])
        while length < size:
            part = b', "%s": "%s-%d"' % (rng.choice(WORDS), rng.choice(WORDS), rng.randrange(10**6))
            parts.append(part)
            length += len(part)
        out.append(b"".join(parts)[:size])
    return out


def best_rate(fn: Callable[[], Any], records: int, seconds: float) -> float:
    """Records per second, best of three rounds of at least `seconds`."""
    best = 0.0
    for _ in range(3):
        calls = 0
        started = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
        best = max(best, calls * records / elapsed)
    return best


def aiokafka_encode(compression: str, keys: list[bytes], values: list[bytes], timestamps: list[int]) -> bytes:
    builder = DefaultRecordBatchBuilder(2, CODEC_IDS[compression], 0, -1, -1, -1, 1 << 30)
    for i, (key, value, ts) in enumerate(zip(keys, values, timestamps, strict=True)):
        builder.append(i, ts, key, value, [])
    return bytes(builder.build())


def aiokafka_decode(batch: bytes) -> int:
    n = 0
    for record in DefaultRecordBatch(batch):
        record.key  # noqa: B018 - materialize like a consumer does
        record.value  # noqa: B018
        n += 1
    return n


def run_case(batch_bytes: int, value_size: int, compression: str, seconds: float) -> dict[str, Any]:
    rng = random.Random(value_size)
    n = max(1, batch_bytes // (value_size + 20))
    keys = [b"key-%08d" % i for i in range(n)]
    values = make_values(n, value_size, rng)
    timestamps = [1_700_000_000_000 + i for i in range(n)]
    arrays = {
        "offsets": pa.array(range(n), pa.int64()),
        "timestamp_ms": pa.array(timestamps, pa.int64()),
        "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.binary()),
    }

    def ours_encode() -> bytes:
        return encode_batch(base_offset=0, compression=compression, **arrays)

    ours = ours_encode()
    theirs = aiokafka_encode(compression, keys, values, timestamps)
    decoded = decode_batches(theirs, max_records=n, max_bytes=1 << 30)
    assert decoded.value.to_pylist() == values and aiokafka_decode(ours) == n

    def ours_decode() -> object:
        return decode_batches(ours, max_records=n, max_bytes=1 << 30)

    row: dict[str, Any] = {
        "batch": f"{batch_bytes >> 10} KiB",
        "value": f"{value_size} B",
        "codec": compression,
        "records": n,
        "wire_bytes": len(ours),
        "decode_ours": best_rate(ours_decode, n, seconds),
        "decode_aiokafka": best_rate(lambda: aiokafka_decode(theirs), n, seconds),
        "encode_ours": best_rate(ours_encode, n, seconds),
        "encode_aiokafka": best_rate(lambda: aiokafka_encode(compression, keys, values, timestamps), n, seconds),
    }
    row["decode_x"] = row["decode_ours"] / row["decode_aiokafka"]
    row["encode_x"] = row["encode_ours"] / row["encode_aiokafka"]
    row["decode_MB/s"] = row["decode_ours"] * (value_size + len(keys[0])) / 1e6
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="0.1 s rounds instead of 0.3 s")
    parser.add_argument("--seconds", type=float, default=None, help="minimum seconds per timing round")
    parser.add_argument("--codecs", default=",".join(COMPRESSIONS))
    args = parser.parse_args()
    seconds = args.seconds or (0.1 if args.quick else 0.3)
    rows = [
        run_case(batch_bytes, value_size, codec, seconds)
        for batch_bytes in (16 << 10, 1 << 20)
        for value_size in (100, 1000)
        for codec in args.codecs.split(",")
    ]
    print("records/s (best of 3); _x = ours / aiokafka (Cython) in the same run")
    print_table(
        rows,
        [
            "batch",
            "value",
            "codec",
            "records",
            "decode_ours",
            "decode_aiokafka",
            "decode_x",
            "encode_ours",
            "encode_aiokafka",
            "encode_x",
            "decode_MB/s",
        ],
    )
    path = write_results("codec_bench", rows, {"seconds_per_round": seconds, "alternative": "aiokafka 0.14.0"})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
