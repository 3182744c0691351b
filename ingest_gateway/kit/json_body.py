"""Parsing JSON from clients, bounded: depth, finite numbers, strict UTF-8 (no lone surrogates).

Pure. `loads` is what every hand-parsed JSON body goes through (produce's JSON and NDJSON);
FastAPI-parsed bodies get the same depth answer through the app's RecursionError handler.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ingest_gateway.kit.errors import JsonTooDeepError, MalformedRequestError

#: Objects and arrays may nest this deep (the produce envelope counts: {"records": [{"value": ...}]}).
MAX_JSON_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


_CHUNK = 1 << 20


def _depth(data: bytes) -> int:
    """Deepest bracket nesting, counting brackets everywhere, 1 MiB at a time (bounded memory)."""
    depth, deepest = 0, 0
    for start in range(0, len(data), _CHUNK):
        raw = np.frombuffer(data, dtype=np.uint8, count=min(_CHUNK, len(data) - start), offset=start)
        running = np.cumsum(_OPEN[raw], dtype=np.int64) + depth
        deepest = max(deepest, int(running.max()))
        depth = int(running[-1])
    return deepest


def check_depth(data: bytes, *, where: str = "The body") -> None:
    """Raises: JsonTooDeepError. Counts brackets in C; a body over the limit is counted again with its
    strings removed (brackets inside strings do not nest). Closing brackets inside strings can hide
    depth from the count: the parser's own recursion guard (`loads`) still answers 400 for those."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return  # too few brackets to nest that deep (most small bodies: no numpy pass)
    if _depth(data) > MAX_JSON_DEPTH and _depth(_STRING.sub(b'""', data)) > MAX_JSON_DEPTH:
        raise JsonTooDeepError(f"{where} nests objects and arrays deeper than {MAX_JSON_DEPTH} levels.")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(data: bytes, *, where: str = "The body") -> Any:
    """json.loads, bounded. Raises: JsonTooDeepError, MalformedRequestError (bad JSON, NaN/Infinity)."""
    check_depth(data, where=where)
    try:
        return json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise JsonTooDeepError(f"{where} nests objects and arrays deeper than {MAX_JSON_DEPTH} levels.") from None
    except json.JSONDecodeError as exc:
        raise MalformedRequestError(f"{where} is not valid JSON: {exc}, at {_near(exc)}. Fix the JSON there.") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedRequestError(f"{where} is not valid JSON: {exc}.") from exc


def _near(exc: json.JSONDecodeError, width: int = 24) -> str:
    """Where a JSON error is, as text a user can find: up to `width` characters either side."""
    doc, pos = exc.doc, exc.pos
    before = doc[max(0, pos - width) : pos].replace("\n", " ")
    after = doc[pos : pos + width].replace("\n", " ")
    near = f"{'...' if pos > width else ''}{before} >>>{after}{'...' if pos + width < len(doc) else ''}"
    # bytes that are no UTF-8 (json decodes lone surrogates) must not break the answer's encoding
    return near.encode("utf-8", "backslashreplace").decode("utf-8")


def dumps_value(value: Any) -> bytes:
    """A parsed JSON value back to compact UTF-8. Raises: ValueError (a non-finite number, as 1e400
    parses to inf), UnicodeEncodeError (a lone surrogate such as "\\ud800")."""
    kind = type(value)
    if kind is int:  # the text of a plain int is its JSON (a tenth of the encoder's time)
        return str(value).encode()
    if kind is str:
        return _string(value).encode()
    return _COMPACT.encode(value).encode()


# one encoder for every value: json.dumps with options builds a new one per call
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_string = json.encoder.encode_basestring  # the encoder's own string rule (ensure_ascii=False)
