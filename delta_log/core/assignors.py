"""Partition assignors for consumer groups: range, roundrobin, sticky, and lag-aware balancing.

Pure functions shared by the consumer API's coordinator and the Spark rebalance job.
Every assignor gives every subscribed partition to exactly one member subscribed to its topic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from delta_log.errors import UnknownAssignorError

AssignorName = Literal["range", "roundrobin", "sticky"]
ASSIGNORS: tuple[str, ...] = ("range", "roundrobin", "sticky")

#: member id -> topic -> sorted partitions
Assignment = dict[str, dict[str, list[int]]]


def _empty(members: Mapping[str, frozenset[str]]) -> Assignment:
    return {m: {} for m in members}


def _add(out: Assignment, member: str, topic: str, partition: int) -> None:
    out[member].setdefault(topic, []).append(partition)


def _sorted(out: Assignment) -> Assignment:
    return {m: {t: sorted(ps) for t, ps in sorted(tp.items())} for m, tp in sorted(out.items())}


def assign_range(members: Mapping[str, frozenset[str]], partitions: Mapping[str, int]) -> Assignment:
    """Kafka's RangeAssignor: per topic, contiguous ranges in member-id order."""
    out = _empty(members)
    for topic in sorted(partitions):
        subs = sorted(m for m, topics in members.items() if topic in topics)
        if not subs:
            continue
        n = partitions[topic]
        per, extra = divmod(n, len(subs))
        start = 0
        for i, m in enumerate(subs):
            count = per + (1 if i < extra else 0)
            for p in range(start, start + count):
                _add(out, m, topic, p)
            start += count
    return _sorted(out)


def assign_roundrobin(members: Mapping[str, frozenset[str]], partitions: Mapping[str, int]) -> Assignment:
    """Kafka's RoundRobinAssignor: all partitions in (topic, partition) order dealt in turn."""
    out = _empty(members)
    order = sorted(members)
    i = 0
    for topic in sorted(partitions):
        for p in range(partitions[topic]):
            for _ in range(len(order)):
                m = order[i % len(order)]
                i += 1
                if topic in members[m]:
                    _add(out, m, topic, p)
                    break
    return _sorted(out)


def assign_sticky(
    members: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Mapping[str, list[int]]] | None = None,
    *,
    weights: Mapping[tuple[str, int], int] | None = None,
) -> Assignment:
    """Balanced, moving as few partitions as possible from `previous`.

    Balance is by count (or by total `weights`, e.g. lag, when given: lag-aware). A member keeps
    a previous partition while it is subscribed and not above its fair share; the rest go to the
    least loaded subscribed member.
    """
    weights = weights or {}

    def w(tp: tuple[str, int]) -> int:
        return max(1, weights.get(tp, 1)) if weights else 1

    out = _empty(members)
    load = dict.fromkeys(members, 0)
    all_tps = [(t, p) for t in sorted(partitions) for p in range(partitions[t])]
    eligible = {tp: [m for m in members if tp[0] in members[m]] for tp in all_tps}
    total = sum(w(tp) for tp in all_tps if eligible[tp])
    fair = -(-total // max(1, len(members)))  # ceiling
    unassigned: list[tuple[str, int]] = []
    prev_owner: dict[tuple[str, int], str] = {}
    for m, tps in (previous or {}).items():
        for t, ps in tps.items():
            for p in ps:
                prev_owner[(t, p)] = m
    # keep previous ownership (largest weights first so balance converges)
    for tp in sorted(all_tps, key=lambda x: -w(x)):
        if not eligible[tp]:
            continue
        owner = prev_owner.get(tp)
        if owner is not None and owner in members and tp[0] in members[owner] and load[owner] + w(tp) <= fair:
            _add(out, owner, *tp)
            load[owner] += w(tp)
        else:
            unassigned.append(tp)
    for tp in sorted(unassigned, key=lambda x: (-w(x), x)):
        m = min(eligible[tp], key=lambda x: (load[x], x))
        _add(out, m, *tp)
        load[m] += w(tp)
    return _sorted(out)


def assign(
    name: str,
    members: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Mapping[str, list[int]]] | None = None,
    *,
    weights: Mapping[tuple[str, int], int] | None = None,
) -> Assignment:
    """Dispatch by assignor name. Raises: UnknownAssignorError."""
    if not members:
        return {}
    if name == "range":
        return assign_range(members, partitions)
    if name == "roundrobin":
        return assign_roundrobin(members, partitions)
    if name == "sticky":
        return assign_sticky(members, partitions, previous, weights=weights)
    raise UnknownAssignorError(f"Unknown assignor {name!r}.", assignor=name)


def moved(previous: Mapping[str, Mapping[str, list[int]]], current: Assignment) -> int:
    """How many partitions changed owner (for reports and tests)."""
    before = {(t, p): m for m, tps in previous.items() for t, ps in tps.items() for p in ps}
    after = {(t, p): m for m, tps in current.items() for t, ps in tps.items() for p in ps}
    return sum(1 for tp, m in after.items() if tp in before and before[tp] != m)
