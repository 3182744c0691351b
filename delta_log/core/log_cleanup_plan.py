"""Delta log cleanup planning (pure): which `_delta_log` files can go.

Keeps the newest `keep_versions` versions, the newest checkpoint at or below the cutoff (readers
start there), and anything younger than `min_age_s`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")
_CRC = re.compile(r"^(\d{20})\.crc$")


@dataclass(frozen=True, slots=True)
class LogFile:
    name: str
    mtime_s: float


def _version(name: str, pattern: re.Pattern[str]) -> int | None:
    m = pattern.match(name)
    return int(m.group(1)) if m else None


def plan_log_cleanup(files: Iterable[LogFile], *, keep_versions: int, min_age_s: float, now_s: float) -> list[str]:
    """Names of `_delta_log` files that can go (pure).

    Keeps: every commit at or after the cutoff (latest - keep_versions), the newest checkpoint at or
    below the cutoff and everything after it, and anything younger than `min_age_s`.
    """
    files = list(files)
    commits = {v: f for f in files if (v := _version(f.name, _COMMIT)) is not None}
    checkpoints = sorted({v for f in files if (v := _version(f.name, _CHECKPOINT)) is not None})
    if not commits or not checkpoints:
        return []
    cutoff = max(commits) - keep_versions
    anchors = [c for c in checkpoints if c <= cutoff]
    if not anchors:
        return []
    anchor = anchors[-1]  # readers start here; everything older is redundant
    doomed = []
    for f in files:
        if now_s - f.mtime_s < min_age_s:
            continue
        for pattern in (_COMMIT, _CRC):
            v = _version(f.name, pattern)
            if v is not None and v < anchor:
                doomed.append(f.name)
        v = _version(f.name, _CHECKPOINT)
        if v is not None and v < anchor:
            doomed.append(f.name)
    return sorted(doomed)
