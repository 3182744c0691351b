"""Produce request bodies -> Arrow tables (key, value, partition, timestamp, headers).

Pure: bytes in, a table out. JSON and NDJSON records look like
`{"key": ..., "value": ..., "partition": 0, "timestamp": 1700000000000, "headers": {"h": "v"}}`.
How key and value are encoded is said once per request (as Kafka REST proxies do):
`key_format` / `value_format` = "json" (any JSON, stored as its compact UTF-8 text), "string"
(UTF-8 text) or "binary" (base64). Defaults: key "string", value "json".
Timestamps are epoch milliseconds or ISO-8601 strings. Header values are strings (UTF-8) or null;
`headers` may be an object or a list of {"key", "value"}.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
from collections.abc import Iterable
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from delta_log.core.records import HEADERS_TYPE, MAX_TIMESTAMP_MS, NO_TIMESTAMP, TIMESTAMP_TYPE
from delta_log.errors import InvalidRecordError, InvalidSchemaError, InvalidTimestampError
from ingest_gateway.kit import json_body
from ingest_gateway.kit.errors import JsonTooDeepError, MalformedRequestError

Format = Literal["json", "string", "binary"]
FORMATS = ("json", "string", "binary")
ARROW_STREAM = "application/vnd.apache.arrow.stream"

INPUT_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("partition", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("headers", HEADERS_TYPE),
    ]
)


def _check_format(name: str, fmt: object) -> Format:
    if fmt not in FORMATS:
        raise MalformedRequestError(f"{name} must be one of {', '.join(FORMATS)}; got {fmt!r}.", field=name)
    return fmt  # type: ignore[return-value]


def _not_utf8(index: int, field: str) -> InvalidRecordError:
    return InvalidRecordError(
        f"Record {index}: {field} is not valid UTF-8 (it holds a lone surrogate such as \\ud800).",
        index=index,
        field=field,
    )


def _utf8(text: str, index: int, field: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise _not_utf8(index, field) from None


def _encode(value: Any, fmt: Format, index: int, field: str) -> bytes | None:
    if value is None:
        return None
    if fmt == "json":
        try:
            return json_body.dumps_value(value)
        except ValueError:
            raise InvalidRecordError(
                f"Record {index}: {field} holds a number JSON cannot carry (NaN or infinite, e.g. 1e400).",
                index=index,
                field=field,
            ) from None
        except UnicodeEncodeError:
            raise _not_utf8(index, field) from None
        except RecursionError:
            raise JsonTooDeepError(f"Record {index}: {field} nests too deeply.", index=index) from None
    if not isinstance(value, str):
        raise InvalidRecordError(
            f"Record {index}: {field} must be a string with {field}_format={fmt}.", index=index, field=field
        )
    if fmt == "string":
        return _utf8(value, index, field)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRecordError(f"Record {index}: {field} is not valid base64.", index=index, field=field) from None


def _timestamp_us(value: Any, index: int) -> int | None:
    """Epoch microseconds of a record's timestamp; None (the server's time) for null or -1.

    Raises: InvalidTimestampError outside 0 .. 9999-12-31T23:59:59.999Z (what a topic table holds).
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == NO_TIMESTAMP):
        return None
    if isinstance(value, bool):
        raise InvalidTimestampError(f"Record {index}: timestamp must be epoch ms or ISO-8601.", index=index)
    if isinstance(value, int | float):
        if not (math.isfinite(value) and 0 <= value <= MAX_TIMESTAMP_MS):
            raise InvalidTimestampError(
                f"Record {index}: timestamp {value} is outside 0..{MAX_TIMESTAMP_MS} epoch ms (-1: the server's time).",
                index=index,
            )
        return int(value * 1000)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidTimestampError(
                f"Record {index}: timestamp {value[:64]!r} is not ISO-8601 or epoch ms.", index=index
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        us = int(parsed.timestamp() * 1_000_000)
        if not 0 <= us <= MAX_TIMESTAMP_MS * 1000:
            raise InvalidTimestampError(f"Record {index}: timestamp {value[:64]!r} is before 1970.", index=index)
        return us
    raise InvalidTimestampError(f"Record {index}: timestamp must be epoch ms or ISO-8601.", index=index)


def _headers(value: Any, index: int) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        try:
            items = [(h["key"], h.get("value")) for h in value]
        except (TypeError, KeyError):
            raise InvalidRecordError(
                f"Record {index}: headers must be an object or a list of {{key, value}}.", index=index
            ) from None
    else:
        raise InvalidRecordError(f"Record {index}: headers must be an object or a list.", index=index)
    out = []
    for k, v in items:
        if not isinstance(k, str) or not (v is None or isinstance(v, str)):
            raise InvalidRecordError(f"Record {index}: header keys and values must be strings.", index=index)
        _utf8(k, index, "header key")
        out.append({"key": k, "value": None if v is None else _utf8(v, index, "header value")})
    return out


_FIELDS = {"key", "value", "partition", "timestamp", "headers"}


def records_to_table(records: list[Any], key_format: Format, value_format: Format) -> pa.Table:
    """Raises: MalformedRequestError, InvalidRecordError (with `index`)."""
    if not records:
        raise InvalidRecordError("The request holds no records; send at least one.")
    cols: dict[str, list[Any]] = {name: [] for name in INPUT_SCHEMA.names}
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise InvalidRecordError(f"Record {i} must be a JSON object.", index=i)
        extra = set(rec) - _FIELDS
        if extra:
            raise InvalidRecordError(f"Record {i} has unknown fields: {', '.join(sorted(extra))}.", index=i)
        if "value" not in rec:
            raise InvalidRecordError(f"Record {i} has no 'value' (use null for a tombstone).", index=i)
        part = rec.get("partition")
        if part is not None and (isinstance(part, bool) or not isinstance(part, int)):
            raise InvalidRecordError(f"Record {i}: partition must be an integer.", index=i)
        cols["key"].append(_encode(rec.get("key"), key_format, i, "key"))
        cols["value"].append(_encode(rec["value"], value_format, i, "value"))
        cols["partition"].append(part)
        cols["timestamp"].append(_timestamp_us(rec.get("timestamp"), i))
        cols["headers"].append(_headers(rec.get("headers"), i))
    # A column no record filled is left out (what it means is the same: none given, as in an Arrow
    # request without it), so a small request builds only the arrays it has: each pyarrow call costs
    # microseconds, and the event loop makes them for every request.
    filled = [f for f in INPUT_SCHEMA if f.name == "value" or any(v is not None for v in cols[f.name])]
    try:
        return pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in filled], schema=pa.schema(filled))
    except (pa.ArrowInvalid, OverflowError) as exc:
        raise InvalidRecordError(f"A record field is out of range: {exc}") from exc


def decode_json(body: bytes, *, key_format: str = "string", value_format: str = "json") -> pa.Table:
    """`{"key_format"?, "value_format"?, "records": [...]}`. Raises: MalformedRequestError, InvalidRecordError."""
    doc = json_body.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise MalformedRequestError('The body must be a JSON object with a "records" list.')
    unknown = set(doc) - {"records", "key_format", "value_format"}
    if unknown:
        raise MalformedRequestError(f"Unknown top-level fields: {', '.join(sorted(unknown))}.")
    kf = _check_format("key_format", doc.get("key_format", key_format))
    vf = _check_format("value_format", doc.get("value_format", value_format))
    return records_to_table(doc["records"], kf, vf)


def decode_ndjson(body: bytes, *, key_format: str = "string", value_format: str = "json") -> pa.Table:
    """One record object per line. Raises: MalformedRequestError (naming the line), InvalidRecordError."""
    kf = _check_format("key_format", key_format)
    vf = _check_format("value_format", value_format)
    records: list[Any] = []
    for i, line in enumerate(body.splitlines()):
        if not line.strip():
            continue
        try:
            records.append(json_body.loads(line, where=f"Line {i + 1} (record {len(records)})"))
        except MalformedRequestError as exc:
            exc.details.update(index=len(records), line=i + 1)
            raise
    return records_to_table(records, kf, vf)


def _epoch_ms_column(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """An integer epoch-ms column as timestamps; -1 (Kafka's "none") becomes null (the server's time).

    Raises: InvalidTimestampError for values outside 0 .. MAX_TIMESTAMP_MS (checked before scaling,
    so a huge value cannot wrap around into a plausible one)."""
    try:
        ms = col.cast(pa.int64())
    except pa.ArrowInvalid as exc:
        raise InvalidTimestampError(f"The timestamp column does not fit epoch ms: {exc}.") from None
    ms = pc.if_else(pc.equal(ms, NO_TIMESTAMP), pa.scalar(None, pa.int64()), ms)
    bad = pc.fill_null(pc.or_(pc.less(ms, 0), pc.greater(ms, MAX_TIMESTAMP_MS)), False)
    if pc.any(bad).as_py():
        idx = int(pc.index(bad, True).as_py())
        raise InvalidTimestampError(
            f"Record {idx}: timestamp {ms[idx].as_py()} is outside 0..{MAX_TIMESTAMP_MS} epoch ms.", index=idx
        )
    return pc.multiply(ms, 1000).cast(TIMESTAMP_TYPE)


def decode_arrow(body: bytes) -> pa.Table:
    """An Arrow IPC stream with key, value and optional partition, timestamp, headers columns.

    key/value may be binary or string. Raises: MalformedRequestError, InvalidSchemaError.
    """
    try:
        table = ipc.open_stream(pa.BufferReader(body)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise MalformedRequestError(f"The body is not a valid Arrow IPC stream: {exc}.") from exc
    unknown = set(table.column_names) - set(INPUT_SCHEMA.names)
    if unknown:
        raise InvalidSchemaError(f"Unknown columns: {', '.join(sorted(unknown))}.", columns=sorted(unknown))
    if "value" not in table.column_names:
        raise InvalidSchemaError("The Arrow stream has no 'value' column.", column="value")
    n = table.num_rows
    cols = {}
    for f in INPUT_SCHEMA:
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                if f.name == "timestamp" and pa.types.is_integer(col.type):
                    col = _epoch_ms_column(col)
                else:
                    try:
                        col = col.cast(f.type)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                        raise InvalidSchemaError(
                            f"Column {f.name!r} has type {col.type}; expected {f.type}.", column=f.name
                        ) from exc
            cols[f.name] = col
        else:
            cols[f.name] = pa.chunked_array([pa.nulls(n, f.type)])
    return pa.table(cols, schema=INPUT_SCHEMA)
