"""Consumer lag and the lowest committed offset: one formula each, for every caller (HTTP routes,
the SQL view, retention, the rebalance job). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class _Committed(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


def partition_lag(*, committed: int | None, log_start_offset: int, high_watermark: int) -> int:
    """Records a group has yet to consume in one partition.

    From its committed offset (Kafka's meaning: the next offset to consume) to the high watermark;
    a group with no commit, or whose commit fell below the log start offset (retention removed
    those records), starts from the log start offset, as `auto.offset.reset=earliest` would.
    """
    start = log_start_offset if committed is None else max(committed, log_start_offset)
    return max(0, high_watermark - start)


def lag_sql(*, committed: str, log_start_offset: str, high_watermark: str) -> str:
    """`partition_lag` as a Spark SQL expression over the named columns (the `_consumer_lag` view)."""
    start = f"greatest(coalesce({committed}, {log_start_offset}), {log_start_offset})"
    return f"greatest(0, {high_watermark} - {start})"


def lowest_committed(commits: Iterable[_Committed], topic: str) -> dict[int, int]:
    """Per partition of `topic`, the lowest offset any consumer group committed (consumer-aware
    retention keeps what is at or above it)."""
    out: dict[int, int] = {}
    for c in commits:
        if c.topic == topic:
            out[c.partition] = min(out.get(c.partition, c.offset), c.offset)
    return out
