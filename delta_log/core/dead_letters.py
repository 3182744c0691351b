"""Records refused by a topic's value schema: the per-record error list, and the dead-letter
records Kafka Connect would write (errors.tolerance=all). Pure: Arrow in, Arrow out.

A dead letter keeps the record's key, value, timestamp and headers, and adds Kafka Connect's error
headers (`__connect.errors.*`) plus the record's index in its request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from delta_log.core.records import HEADERS_TYPE
from delta_log.errors import SchemaValidationError

#: at most this many per-record errors in one answer (the count says how many there were)
MAX_REPORTED_ERRORS = 100
STAGE = "VALUE_CONVERTER"
EXCEPTION_CLASS = "topiclake.SchemaValidationError"


def validation_error(topic: str, subject: str, total: int, reasons: Mapping[int, str]) -> SchemaValidationError:
    """The refusal of a whole request, naming the first MAX_REPORTED_ERRORS bad records."""
    shown = sorted(reasons)[:MAX_REPORTED_ERRORS]
    return SchemaValidationError(
        f"{len(reasons)} of {total} records do not match the value schema of topic {topic!r} (subject "
        f"{subject!r}); nothing of the request was written.",
        topic=topic,
        subject=subject,
        invalid_count=len(reasons),
        records=[{"index": i, "reason": reasons[i]} for i in shown],
    )


@dataclass(frozen=True, slots=True)
class Split:
    """A request split by its value schema: the valid records, and the dead letters with the index
    of each in the request (ascending)."""

    valid: pa.Table
    valid_indexes: np.ndarray
    dead: pa.Table
    dead_indexes: np.ndarray
    reasons: list[str]  # in dead_indexes' order

    def reasons_by_index(self) -> dict[int, str]:
        return dict(zip(self.dead_indexes.tolist(), self.reasons, strict=True))


def split_invalid(table: pa.Table, reasons: Mapping[int, str], *, topic: str, subject: str) -> Split:
    """Split `table` (a decoded request: key, value, headers...) by `reasons` (index -> why)."""
    bad = np.zeros(table.num_rows, dtype=bool)
    bad_indexes = np.array(sorted(reasons), dtype=np.int64)
    bad[bad_indexes] = True
    dead = table.filter(pa.array(bad))
    why = [reasons[int(i)] for i in bad_indexes]
    extra = [
        [
            ("__connect.errors.topic", topic),
            ("__connect.errors.stage", STAGE),
            ("__connect.errors.exception.class.name", EXCEPTION_CLASS),
            ("__connect.errors.exception.message", reason),
            ("topiclake.errors.schema.subject", subject),
            ("topiclake.errors.record.index", str(int(index))),
        ]
        for index, reason in zip(bad_indexes, why, strict=True)
    ]
    old = dead.column("headers").to_pylist() if "headers" in dead.column_names else [None] * dead.num_rows
    headers = [
        [*(h or []), *({"key": k, "value": v.encode()} for k, v in more)] for h, more in zip(old, extra, strict=True)
    ]
    column = pa.array(headers, HEADERS_TYPE)
    if "headers" in dead.column_names:
        dead = dead.set_column(dead.column_names.index("headers"), "headers", column)
    else:
        dead = dead.append_column("headers", column)
    if "partition" in dead.column_names:  # a partition of the topic, not of its dead-letter topic
        dead = dead.drop_columns(["partition"])
    return Split(
        valid=table.filter(pa.array(~bad)),
        valid_indexes=np.flatnonzero(~bad),
        dead=dead,
        dead_indexes=bad_indexes,
        reasons=why,
    )
