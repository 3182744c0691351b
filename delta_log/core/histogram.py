"""A latency histogram as Prometheus keeps one: cumulative counts per upper bound, a sum and a count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Histogram:
    """Not locked: its owner's lock guards `observe` and `copy`."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)  # per bound: the observations at most that large
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total, self.count)

    def lines(self, name: str) -> list[str]:
        """The histogram's sample lines in Prometheus's text format (after its HELP and TYPE)."""
        out = [f'{name}_bucket{{le="{bound}"}} {count}' for bound, count in zip(self.bounds, self.counts, strict=True)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.total:.6f}")
        out.append(f"{name}_count {self.count}")
        return out
