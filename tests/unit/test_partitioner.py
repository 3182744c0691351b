import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.partitioner import assign_partitions, murmur2, partition_for_key

# Kafka's own vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2)
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_kafka():
    for data, expected in KAFKA_VECTORS.items():
        assert murmur2(data) == expected


def test_partition_is_kafka_default_partitioner():
    for data, h in KAFKA_VECTORS.items():
        for n in (1, 3, 7, 12):
            assert partition_for_key(data, n) == (h & 0x7FFFFFFF) % n


@given(st.binary(max_size=64), st.integers(1, 1000))
def test_partition_in_range(key, n):
    assert 0 <= partition_for_key(key, n) < n
    assert -(2**31) <= murmur2(key) < 2**31


def test_assign_explicit_key_and_null():
    keys = pa.array([b"foobar", None, b"abc", None], pa.binary())
    explicit = pa.array([None, 2, None, None], pa.int64())
    parts = assign_partitions(keys, explicit, 3, null_key_partition=1)
    assert parts.tolist() == [partition_for_key(b"foobar", 3), 2, partition_for_key(b"abc", 3), 1]
    assert parts.dtype == np.int32
