"""Fetched Arrow records -> JSON records (pure). Values as base64 (binary), UTF-8 (string) or JSON."""

from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa

from ingest_gateway.kit.errors import MalformedRequestError

OUTPUT_FORMATS = ("binary", "string", "json")


def check_format(name: str, fmt: str) -> str:
    if fmt not in OUTPUT_FORMATS:
        raise MalformedRequestError(f"{name} must be one of binary, string, json; got {fmt!r}.", field=name)
    return fmt


def _decode(value: bytes | None, fmt: str) -> Any:
    if value is None:
        return None
    if fmt == "binary":
        return base64.b64encode(value).decode()
    text = value.decode("utf-8", errors="replace")
    if fmt == "string":
        return text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text  # not JSON (or nested beyond the parser): the text as it is


def records_to_json(records: pa.Table, *, key_format: str, value_format: str) -> list[dict[str, Any]]:
    """JSON-ready records. Timestamps are epoch ms computed from the stored integer, never through
    datetime: a record written by another engine with any timestamp still renders (no 500)."""
    micros = records.column("timestamp").cast(pa.int64()).to_pylist()
    cols = records.drop_columns(["timestamp"]).to_pydict()
    out = []
    for i in range(records.num_rows):
        headers = cols["headers"][i] or []
        out.append(
            {
                "partition": cols["partition"][i],
                "offset": cols["offset"][i],
                "timestamp": micros[i] // 1000 if micros[i] is not None else None,
                "timestamp_type": cols["timestamp_type"][i] if "timestamp_type" in cols else cols["timestampType"][i],
                "key": _decode(cols["key"][i], key_format),
                "value": _decode(cols["value"][i], value_format),
                "headers": {
                    h["key"]: (h["value"].decode("utf-8", "replace") if h["value"] is not None else None)
                    for h in headers
                },
            }
        )
    return out
