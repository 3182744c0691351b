"""The served OpenAPI document, complete: what a generated client or a fuzzer needs.

FastAPI derives operations and models from the routes; this module adds what it cannot see:
- every operation's error responses: the one envelope, and per status the codes it may carry
  (from the STATUS table, so a new error class is documented by being mapped);
- bearer authentication when keys are configured (health checks stay open);
- the produce body for each media type (JSON, NDJSON, Arrow IPC stream), which the route reads
  itself to stream and bound it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from conf import Settings
from ingest_gateway.kit.errors import STATUS
from ingest_gateway.schemas import ProduceRequest

ERROR_ENVELOPE: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "description": "Stable error code; branch on this."},
                "message": {"type": "string", "description": "What happened and what to do."},
                "details": {"type": "object", "description": "The values involved (names, limits, indexes)."},
            },
        }
    },
}

#: Errors raised outside the STATUS table: the request gate, the validators, the router.
_EXTRA_CODES = {
    401: ["UNAUTHENTICATED"],
    404: ["NOT_FOUND"],
    405: ["METHOD_NOT_ALLOWED"],
    413: ["REQUEST_TOO_LARGE"],
    422: ["INVALID_REQUEST"],
    503: ["TOO_MANY_CONNECTIONS"],
}
OPEN_OPERATIONS = {("/healthz", "get"), ("/readyz", "get")}


def codes_by_status() -> dict[int, list[str]]:
    out: dict[int, set[str]] = defaultdict(set)
    for cls, status in STATUS.items():
        if status < 500 or status == 503:
            out[status].add(cls.code)
    for status, codes in _EXTRA_CODES.items():
        out[status].update(codes)
    return {s: sorted(c) for s, c in sorted(out.items())}


def _error_response(status: int, codes: list[str]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": "Error codes: " + ", ".join(codes) + ".",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    if status in (429, 503):
        response["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}}
    if status == 401:
        response["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    return response


PRODUCE_BODY: dict[str, Any] = {
    "required": True,
    "description": (
        "Records to append, all or nothing. Content-Encoding: gzip is accepted. JSON records: `value` (any "
        "JSON for value_format=json, a string for string, base64 for binary), optional `key`, `partition`, "
        "`timestamp` (epoch ms or ISO-8601; -1 or absent: the server's time) and `headers`."
    ),
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ProduceRequest"}},
        "application/x-ndjson": {
            "schema": {"type": "string", "description": "One JSON record object per line (as in `records`)."}
        },
        "application/vnd.apache.arrow.stream": {
            "schema": {
                "type": "string",
                "format": "binary",
                "description": "Arrow IPC stream: `value` (binary/string), optional `key`, `partition` (int32), "
                "`timestamp` (timestamp or int64 epoch ms), `headers` (list<struct<key: string, value: binary>>).",
            }
        },
    },
}


def install_openapi(app: FastAPI, settings: Settings) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        schemas["Error"] = ERROR_ENVELOPE
        produce = ProduceRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(produce.pop("$defs", {}))
        schemas["ProduceRequest"] = produce
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        errors = codes_by_status()
        if settings.auth.enabled:
            components["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        for path, item in schema.get("paths", {}).items():
            for method, op in item.items():
                if (path, method) in OPEN_OPERATIONS:
                    op["security"] = []
                    if path == "/readyz":
                        op.setdefault("responses", {})["503"] = _error_response(503, ["STORAGE_UNAVAILABLE"])
                    continue
                if settings.auth.enabled:
                    op["security"] = [{"apiKey": []}]
                responses = op.setdefault("responses", {})
                for status, codes in errors.items():
                    if status == 401 and not settings.auth.enabled:
                        continue
                    responses[str(status)] = _error_response(status, codes)
                if path == "/topics/{topic}/records" and method == "post":
                    op["requestBody"] = PRODUCE_BODY
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
