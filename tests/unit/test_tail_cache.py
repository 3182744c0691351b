import pyarrow as pa

from delta_log.core.records import TOPIC_SCHEMA
from delta_log.log.tail_cache import TailCache


def _records(first: dict[int, int], sizes: dict[int, tuple[int, int]]) -> pa.Table:
    """Per partition (ascending): `count` records of `size`-byte values from offset `first[p]`."""
    rows = [
        {"key": None, "value": b"v" * size, "topic": "t", "partition": p, "offset": first[p] + i, "timestamp": None,
         "timestampType": 0, "headers": []}
        for p, (count, size) in sorted(sizes.items())
        for i in range(count)
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, TOPIC_SCHEMA)


def test_a_partition_of_large_values_beside_one_of_small_ones_is_bounded_by_its_own_bytes():
    """Each partition's tail is bounded by the bytes of its own records: counted by its share of
    the rows, a partition of 10 KB values beside 1,000 small records looked 100 times smaller."""
    cache = TailCache(max_bytes=150_000)
    sizes = {0: (10, 10_000), 1: (1000, 10)}
    cache.add(_records({0: 0, 1: 0}, sizes))
    cache.add(_records({0: 10, 1: 1000}, sizes))
    assert cache.read(0, 0, 100) is None  # its first 100 KB went: 200 KB were over the bound
    assert cache.read(0, 10, 100).num_rows == 10
    assert cache.read(1, 0, 5000).num_rows == 2000  # 20 KB of small records: all kept
