"""Prometheus text-format metrics, kept in process (no client library needed)."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TypeVar

from broker.fetch import SERVED
from broker.produce import FlushStats
from delta_log.core.histogram import Histogram

V = TypeVar("V")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _labels(**kv: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in kv.items())
    return "{" + inner + "}" if inner else ""


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records_in: dict[str, int] = defaultdict(int)
        self.bytes_in: dict[str, int] = defaultdict(int)
        self.requests: dict[tuple[str, str], int] = defaultdict(int)
        self.errors: dict[str, int] = defaultdict(int)
        self.commits: dict[str, int] = defaultdict(int)
        self.forwarded: dict[tuple[str, str], int] = defaultdict(int)
        self._latency = Histogram(LATENCY_BUCKETS)

    def on_flush(self, stats: FlushStats) -> None:
        with self._lock:
            if stats.ok:
                self.records_in[stats.topic] += stats.records
                self.bytes_in[stats.topic] += stats.bytes
                self.commits[stats.topic] += 1
            self._latency.observe(stats.seconds)

    def on_forward(self, topic: str, *, appended_here: bool) -> None:
        """A produce request whose partitions another gateway owns: sent there, or (the owner
        could not take it) appended here."""
        with self._lock:
            self.forwarded[(topic, "appended_here" if appended_here else "owner")] += 1

    def on_error(self, code: str) -> None:
        with self._lock:
            self.errors[code] += 1

    def on_request(self, method: str, status: int) -> None:
        with self._lock:
            self.requests[(method, str(status))] += 1

    def render(
        self,
        queue_depth: dict[str, int],
        queued_bytes: dict[str, int],
        phases: dict[str, dict[str, float]] | None = None,
        conflicts: dict[str, int] | None = None,
        visible: Callable[[str], bool] = lambda topic: True,
        table_lag: dict[str, float] | None = None,
        upsert_lag: dict[str, int] | None = None,
        write_ahead_syncs: Histogram | None = None,
    ) -> str:
        """The Prometheus text; per-topic series only for the topics `visible` lets through."""
        lines: list[str] = []

        def mine(by_topic: Mapping[str, V]) -> list[tuple[str, V]]:
            return sorted((t, v) for t, v in by_topic.items() if visible(t))

        def family(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        with self._lock:
            family("topiclake_records_in_total", "counter", "Records committed, per topic.")
            for t, v in mine(self.records_in):
                lines.append(f"topiclake_records_in_total{_labels(topic=t)} {v}")
            family("topiclake_bytes_in_total", "counter", "Record bytes committed, per topic.")
            for t, v in mine(self.bytes_in):
                lines.append(f"topiclake_bytes_in_total{_labels(topic=t)} {v}")
            family("topiclake_commits_total", "counter", "Delta commits (group-commit flushes), per topic.")
            for t, v in mine(self.commits):
                lines.append(f"topiclake_commits_total{_labels(topic=t)} {v}")
            family(
                "topiclake_produce_forwarded_total",
                "counter",
                "Produce requests for partitions another gateway owns, per topic and where they were appended.",
            )
            for (t, where), v in sorted(self.forwarded.items()):
                if visible(t):
                    lines.append(f"topiclake_produce_forwarded_total{_labels(topic=t, appended=where)} {v}")
            family("topiclake_commit_latency_seconds", "histogram", "Time per group-commit flush.")
            lines.extend(self._latency.lines("topiclake_commit_latency_seconds"))
            family("topiclake_records_out_total", "counter", "Records served by fetches (HTTP, SSE, Kafka), per topic.")
            served = {t: v for t, v in SERVED.snapshot().items() if visible(t)}
            for t, (records, _) in sorted(served.items()):
                lines.append(f"topiclake_records_out_total{_labels(topic=t)} {records}")
            family("topiclake_bytes_out_total", "counter", "Record bytes served by fetches, per topic.")
            for t, (_, nbytes) in sorted(served.items()):
                lines.append(f"topiclake_bytes_out_total{_labels(topic=t)} {nbytes}")
            family("topiclake_errors_total", "counter", "Errors returned to clients, by code.")
            for code, v in sorted(self.errors.items()):
                lines.append(f"topiclake_errors_total{_labels(code=code)} {v}")
            family("topiclake_http_requests_total", "counter", "HTTP requests by method and status.")
            for (m, s), v in sorted(self.requests.items()):
                lines.append(f"topiclake_http_requests_total{_labels(method=m, status=s)} {v}")
        family("topiclake_queue_depth", "gauge", "Produce requests waiting for a commit, per topic.")
        for t, v in mine(queue_depth):
            lines.append(f"topiclake_queue_depth{_labels(topic=t)} {v}")
        family("topiclake_queue_bytes", "gauge", "Bytes waiting for a commit, per topic.")
        for t, v in mine(queued_bytes):
            lines.append(f"topiclake_queue_bytes{_labels(topic=t)} {v}")
        family(
            "topiclake_commit_conflicts_total",
            "counter",
            "Commits retried because another writer won the version with the same partitions, per topic.",
        )
        for t, v in mine(conflicts or {}):
            lines.append(f"topiclake_commit_conflicts_total{_labels(topic=t)} {v}")
        family(
            "topiclake_table_lag_seconds",
            "gauge",
            "`log` topics: how long the oldest record acked in the write-ahead log has waited for the Delta table.",
        )
        for t, lag in mine(table_lag or {}):
            lines.append(f"topiclake_table_lag_seconds{_labels(topic=t)} {lag:.3f}")
        family(
            "topiclake_write_ahead_sync_seconds",
            "histogram",
            "`log` topics: time per durable write-ahead write (pwritev and fdatasync, or one PUT); every ack waits for one.",
        )
        if write_ahead_syncs is not None:
            lines.extend(write_ahead_syncs.lines("topiclake_write_ahead_sync_seconds"))
        family(
            "topiclake_upsert_lag_records",
            "gauge",
            "Upsert topics: records not yet merged into <topic>_latest by the upsert job.",
        )
        for t, records in mine(upsert_lag or {}):
            lines.append(f"topiclake_upsert_lag_records{_labels(topic=t)} {records}")
        family("topiclake_writer_phase_seconds_total", "counter", "Flush time by phase, per topic.")
        for t, by_phase in mine(phases or {}):
            for phase, secs in by_phase.items():
                lines.append(f"topiclake_writer_phase_seconds_total{_labels(topic=t, phase=phase)} {secs:.6f}")
        return "\n".join(lines) + "\n"
