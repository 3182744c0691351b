"""Rebalance job: expire dead members and balance lag, over every consumer group.

    python -m jobs.rebalance [--root DIR] [--group G ...] [--local]
    spark-submit jobs/rebalance.py --root ...
    topiclake jobs rebalance

It reads `_system/consumer_groups` (generations, assignments, persisted heartbeats) and
`_system/consumer_offsets`, and the high watermark of every subscribed partition (with Spark, one
task per topic). `plan_rebalance` (pure) then decides per group:

- members whose last persisted heartbeat is older than their session timeout (plus the server's
  persist interval) are expired, also when no server is running to notice;
- the survivors get a lag-aware sticky assignment: partitions weighted by lag, so a member with
  three idle partitions and one with a backlog end up with comparable work, moving as few
  partitions as possible;
- without expiries, a group is only reassigned when its most loaded member has
  `jobs.rebalance_lag_imbalance` times the least loaded member's lag (and at least
  `jobs.rebalance_min_lag` more), and the new assignment is strictly better.

The new generation is appended with the group's Delta app transaction id, on the snapshot the job
planned from: if the server changed the group meanwhile the commit is refused and the job plans
again. A running server adopts the new generation within `server.groups_sync_interval_s` (its
members commit, rejoin and receive the job's assignment); a restarted server loads it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conf import Settings
from delta_log.core.assignors import assign
from delta_log.core.group_rules import EMPTY, STABLE, leader_assigns
from delta_log.core.lag import partition_lag
from delta_log.log.catalog import Catalog
from delta_log.log.reader import TopicReader
from delta_log.system.groups import REBALANCE_JOB, GroupRecord, GroupStore
from delta_log.system.offsets import OffsetStore
from delta_log.table.storage import StorageRoot
from jobs.common import Progress, for_each_topic, job_settings, job_spark

__all__ = ["GroupPlan", "main", "plan_rebalance", "run"]

Assignment = dict[str, dict[str, list[int]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupPlan:
    group: str
    action: str  # "none", "expire", "balance"
    generation: int
    expired: list[str] = field(default_factory=list)
    lag_before: dict[str, int] = field(default_factory=dict)
    lag_after: dict[str, int] = field(default_factory=dict)
    moved: int = 0
    record: GroupRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "action": self.action,
            "generation": self.generation,
            "expired": self.expired,
            "lag_before": self.lag_before,
            "lag_after": self.lag_after,
            "moved": self.moved,
        }


def _member_lag(
    assignment: Mapping[str, Mapping[str, list[int]]], lag: Mapping[tuple[str, int], int]
) -> dict[str, int]:
    return {m: sum(lag.get((t, p), 0) for t, ps in tps.items() for p in ps) for m, tps in assignment.items()}


def _moved(before: Mapping[str, Mapping[str, list[int]]], after: Mapping[str, Mapping[str, list[int]]]) -> int:
    owner = {(t, p): m for m, tps in before.items() for t, ps in tps.items() for p in ps}
    return sum(1 for m, tps in after.items() for t, ps in tps.items() for p in ps if owner.get((t, p)) != m)


def _imbalanced(loads: Mapping[str, int], ratio: float, min_lag: int) -> bool:
    if len(loads) < 2:
        return False
    hi, lo = max(loads.values()), min(loads.values())
    return hi - lo >= min_lag and hi > ratio * max(lo, 1)


def plan_rebalance(
    groups: Mapping[str, GroupRecord],
    *,
    now_ms: int,
    partitions: Mapping[str, int],
    lag: Mapping[tuple[str, int], int],
    imbalance: float = 2.0,
    min_lag: int = 1000,
    grace_ms: int = 0,
) -> list[GroupPlan]:
    """Decide, per stable group with members, whether to expire members and/or move partitions.

    `partitions`: topic -> partition count (topics missing are treated as deleted);
    `lag`: (topic, partition) -> records the group has not committed yet, keyed per group by the
    caller (see `run`); `grace_ms` is added to each session timeout (the server persists
    heartbeats every few seconds).
    """
    plans: list[GroupPlan] = []
    for name in sorted(groups):
        rec = groups[name]
        if rec.state != STABLE or not rec.members or leader_assigns(rec.assignor):
            continue  # (a group whose leader member assigns is the leader's to balance, as in Kafka)
        gone = [m.member_id for m in rec.members if now_ms - m.last_heartbeat_ms > m.session_timeout_ms + grace_ms]
        alive = [m for m in rec.members if m.member_id not in gone]
        before = {m.member_id: m.assignment for m in rec.members}
        lag_before = _member_lag(before, lag)
        subs = {m.member_id: frozenset(m.topics) for m in alive}
        parts = {t: partitions.get(t, 0) for t in sorted({t for m in alive for t in m.topics})}
        weights = {(t, p): lag.get((t, p), 0) for t, n in parts.items() for p in range(n)}
        current_tps = {(t, p) for m in alive for t, ps in m.assignment.items() for p in ps}
        unassigned = any(tp not in current_tps for tp in weights)
        if not gone and not unassigned and not _imbalanced(lag_before, imbalance, min_lag):
            plans.append(GroupPlan(group=name, action="none", generation=rec.generation, lag_before=lag_before))
            continue
        after = assign("sticky", subs, parts, {m.member_id: m.assignment for m in alive}, weights=weights)
        lag_after = _member_lag(after, lag)
        if not gone and not unassigned and max(lag_after.values()) >= max(lag_before.values()):
            plans.append(GroupPlan(group=name, action="none", generation=rec.generation, lag_before=lag_before))
            continue
        # the same members with new assignments (their owner key and client kept)
        members = tuple(dataclasses.replace(m, assignment=after.get(m.member_id, {})) for m in alive)
        record = GroupRecord(
            group=name,
            generation=rec.generation + 1,
            state=STABLE if members else EMPTY,
            assignor=rec.assignor,
            members=members,
            updated_at_us=now_ms * 1000,
            writer=REBALANCE_JOB,
        )
        plans.append(
            GroupPlan(
                group=name,
                action="expire" if gone else "balance",
                generation=rec.generation + 1,
                expired=gone,
                lag_before=lag_before,
                lag_after=lag_after,
                moved=_moved(before, after),
                record=record,
            )
        )
    return plans


def _partition_offsets(root: str, storage_options: dict[str, str], topic: str, settings_json: str) -> dict[str, Any]:
    """Task: a topic's (log start offset, high watermark) per partition (runs on an executor)."""
    settings = Settings.model_validate_json(settings_json)
    reader = TopicReader(StorageRoot(root, storage_options), topic, settings.reader)
    return {"topic": topic, "bounds": [(p.log_start_offset, p.high_watermark) for p in reader.partition_offsets()]}


@dataclass(frozen=True, slots=True, kw_only=True)
class RebalanceReport:
    groups: list[dict[str, Any]]
    attempts: int

    @property
    def changed(self) -> list[str]:
        return [g["group"] for g in self.groups if g["action"] != "none"]


def run(spark: Any, settings: Settings, *, groups: list[str] | None = None, attempts: int = 5) -> RebalanceReport:
    """Plan and commit a rebalance of `groups` (default: all). `spark` None runs in this process."""
    storage = StorageRoot(settings.root, settings.storage_options)
    store = GroupStore(storage)
    progress = Progress("rebalance", spark)
    grace_ms = int((settings.server.heartbeat_persist_interval_s + settings.server.groups_sync_interval_s) * 1000)
    plans: list[GroupPlan] = []
    for attempt in range(1, attempts + 1):
        state = {g: r for g, r in store.load().items() if groups is None or g in groups}
        topics = sorted({t for r in state.values() if r.state == STABLE for m in r.members for t in m.topics})
        existing = set(Catalog(storage, settings.writer).list_topics())
        bounds = {
            r["topic"]: r["bounds"]
            for r in for_each_topic(spark, settings, [t for t in topics if t in existing], _partition_offsets, progress)
        }
        offsets = OffsetStore(storage)
        plans = []
        for name, rec in state.items():
            committed = offsets.committed(name)
            lag = {
                (t, p): partition_lag(
                    committed=committed[(t, p)].offset if (t, p) in committed else None,
                    log_start_offset=lso,
                    high_watermark=hw,
                )
                for t, marks in bounds.items()
                for p, (lso, hw) in enumerate(marks)
            }
            plans += plan_rebalance(
                {name: rec},
                now_ms=int(time.time() * 1000),
                partitions={t: len(m) for t, m in bounds.items()},
                lag=lag,
                imbalance=settings.jobs.rebalance_lag_imbalance,
                min_lag=settings.jobs.rebalance_min_lag,
                grace_ms=grace_ms,
            )
        records = [p.record for p in plans if p.record is not None]
        if store.save_if_unchanged(records):
            for p in plans:
                progress.say(
                    f"group {p.group}: {p.action}"
                    + (f", generation {p.generation}, expired {p.expired}, moved {p.moved}" if p.record else "")
                )
            return RebalanceReport(groups=[p.to_dict() for p in plans], attempts=attempt)
        progress.say(f"a group changed while planning (attempt {attempt}); planning again")
    return RebalanceReport(groups=[{**p.to_dict(), "action": "conflict"} for p in plans], attempts=attempts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jobs.rebalance", description=__doc__)
    ap.add_argument("--root")
    ap.add_argument("--group", action="append")
    ap.add_argument("--local", action="store_true", help="run in this process, without Spark")
    args = ap.parse_args(argv)
    settings = job_settings(args.root)
    with job_spark(settings, "topiclake-rebalance", local=args.local) as spark:
        report = run(spark, settings, groups=args.group)
    print(json.dumps({"changed": report.changed, "attempts": report.attempts, "groups": report.groups}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
