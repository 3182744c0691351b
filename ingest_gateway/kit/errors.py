"""The HTTP face's errors: those only it raises, one table from every error class to its HTTP
status (`STATUS`), and the app's exception handlers."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from delta_log import errors as e

log = logging.getLogger(__name__)


# --- errors only the HTTP face raises (request bodies, media types, query formats); the errors
# every face shares (authentication, authorization, records, offsets) live in delta_log.errors


class MalformedRequestError(e.TopiclakeError):
    """The body cannot be parsed (bad JSON, NDJSON line or Arrow stream); `index` names the record."""

    code = "MALFORMED_REQUEST"


class JsonTooDeepError(MalformedRequestError):
    """A JSON document nested deeper than MAX_JSON_DEPTH (see ingest_gateway.kit.json_body)."""

    code = "JSON_TOO_DEEP"
    hint = "Flatten the document: objects and arrays may nest at most 64 levels."


class UnsupportedMediaTypeError(e.TopiclakeError):
    code = "UNSUPPORTED_MEDIA_TYPE"
    hint = "Use application/json, application/x-ndjson or application/vnd.apache.arrow.stream."


class CrossSiteRequestError(e.TopiclakeError):
    """A browser sent a state-changing request from another site's page (CSRF)."""

    code = "CROSS_SITE_REQUEST"
    hint = (
        "The API takes writes from its own origin (the console) and from clients outside a browser; "
        "call it from this origin, or from a backend."
    )


class HostNotAllowedError(e.TopiclakeError):
    """The Host header names a host this server does not serve (DNS rebinding)."""

    code = "HOST_NOT_ALLOWED"
    hint = "Use the address the server listens on, or add the name to server.allowed_hosts."


STATUS: dict[type[e.TopiclakeError], int] = {
    e.TopiclakeError: 500,
    e.InvalidTopicError: 400,
    e.TopicNotFoundError: 404,
    e.TopicExistsError: 409,
    e.PartitionNotFoundError: 404,
    e.InvalidConfigError: 400,
    e.SourceOptionError: 400,
    e.InvalidPartitionsError: 400,
    e.PartitionCountConflictError: 409,
    e.InvalidRecordError: 422,
    e.CorruptRecordError: 400,
    e.UnsupportedCompressionError: 415,
    e.UnsupportedMessageFormatError: 400,
    e.ProducerFencedError: 409,
    e.InvalidProducerIdMappingError: 409,
    e.InvalidTxnStateError: 409,
    e.InvalidTransactionTimeoutError: 400,
    e.ConcurrentTransactionsError: 503,
    e.TransactionalIdNotFoundError: 404,
    e.UnstableOffsetCommitError: 503,
    e.InvalidSchemaError: 422,
    e.RecordTooLargeError: 413,
    e.RequestTooLargeError: 413,
    e.OffsetOutOfRangeError: 416,
    e.InvalidOffsetError: 400,
    e.OffsetMetadataTooLargeError: 413,
    e.InvalidTimestampError: 422,
    e.DuplicateSequenceError: 409,
    e.OutOfOrderSequenceError: 409,
    e.CommitConflictError: 503,
    e.StorageUnavailableError: 503,
    e.WriteAheadGapError: 503,
    e.BackPressureError: 429,
    e.WriterClosedError: 503,
    MalformedRequestError: 400,
    JsonTooDeepError: 400,
    UnsupportedMediaTypeError: 415,
    CrossSiteRequestError: 403,
    HostNotAllowedError: 400,
    e.SourcesGoneError: 503,
    e.DataLossError: 409,
    e.AuthenticationError: 401,
    e.AuthorizationError: 403,
    e.TransactionalIdAuthorizationError: 403,
    e.UnknownGroupError: 404,
    e.UnknownGroupMemberError: 404,
    e.UnknownJobError: 404,
    e.UnknownMemberError: 404,
    e.FencedMemberError: 409,
    e.MemberIdRequiredError: 409,
    e.GroupMaxSizeReachedError: 409,
    e.FencedInstanceIdError: 409,
    e.NotCoordinatorError: 503,
    e.CoordinatorNotAvailableError: 503,
    e.OwnerNotAvailableError: 503,
    e.NotPartitionOwnerError: 421,
    e.PartitionRecoveringError: 503,
    e.UnknownAssignorError: 400,
    e.FencedMemberEpochError: 409,
    e.StaleMemberEpochError: 409,
    e.UnreleasedInstanceIdError: 409,
    e.UnsupportedAssignorError: 400,
    e.InvalidRegularExpressionError: 400,
    e.InvalidGroupRequestError: 400,
    e.InconsistentGroupProtocolError: 409,
    e.RebalanceInProgressError: 409,
    e.GroupNotEmptyError: 409,
    e.GroupSubscribedToTopicError: 409,
    e.ReplicaStateError: 409,
    e.InvalidGroupError: 400,
    e.SinkRefusedError: 502,
    e.SchemaRegistryError: 500,
    e.SubjectNotFoundError: 404,
    e.VersionNotFoundError: 404,
    e.SchemaNotFoundError: 404,
    e.SubjectNotSoftDeletedError: 404,
    e.VersionNotSoftDeletedError: 404,
    e.SubjectConfigNotFoundError: 404,
    e.IncompatibleSchemaError: 409,
    e.InvalidValueSchemaError: 422,
    e.InvalidCompatibilityLevelError: 422,
    e.SchemaValidationError: 422,
}


def status_for(exc: e.TopiclakeError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


#: The schema registry API (Confluent's) lives under this prefix; its errors also carry Confluent's
#: `error_code` and `message` beside topiclake's envelope, for Confluent's clients.
REGISTRY_PREFIX = "/registry"


def registry_error_code(exc: e.TopiclakeError, status: int) -> int:
    """Confluent Schema Registry's error_code: its own for registry errors, else status * 100 + 1
    (40101 unauthorized, 40301 forbidden, 50001...)."""
    return exc.registry_code if isinstance(exc, e.SchemaRegistryError) else status * 100 + 1


def error_response(exc: e.TopiclakeError, *, retry_after: int = 1, path: str = "") -> JSONResponse:
    status = status_for(exc)
    body: dict[str, object] = {"error": exc.to_dict()}
    if _is_registry(path):
        body = {"error_code": registry_error_code(exc, status), "message": exc.message, **body}
    headers = {}
    if status in (429, 503):
        headers["Retry-After"] = str(retry_after)
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, headers=headers)


def _is_registry(path: str) -> bool:
    return path == REGISTRY_PREFIX or path.startswith(REGISTRY_PREFIX + "/")


def envelope(
    status: int,
    code: str,
    message: str,
    details: dict[str, object] | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    path: str = "",
) -> JSONResponse:
    """The error envelope for answers that are not a TopiclakeError (the router's, the validators')."""
    body: dict[str, object] = {"error": {"code": code, "message": message, "details": details or {}}}
    if _is_registry(path):
        body = {"error_code": status * 100 + 1, "message": message, **body}
    return JSONResponse(body, status_code=status, headers=headers)


def allowed_methods(app: FastAPI, path: str, fallback: str | None) -> list[str]:
    """Every method the API documents for this path (routers answer 405 naming only the first
    route they matched); the router's own Allow for undocumented paths (the docs pages)."""
    methods: set[str] = set()
    for template, item in app.openapi().get("paths", {}).items():
        if re.fullmatch(re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)), path):
            methods |= {m.upper() for m in item}
    if not methods and fallback:
        methods = {m.strip() for m in fallback.split(",")}
    return sorted(methods - {"HEAD", "OPTIONS"})


def install_error_handlers(app: FastAPI, *, retry_after: int, on_error: Callable[[str], None] | None = None) -> None:
    @app.exception_handler(e.TopiclakeError)
    async def _topiclake(request: Request, exc: e.TopiclakeError) -> JSONResponse:
        if on_error:
            on_error(exc.code)
        if status_for(exc) >= 500:
            log.warning("%s %s -> %s: %s", request.method, request.url.path, exc.code, exc.message)
        return error_response(exc, retry_after=retry_after, path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The router's own answers: no such path, or a method the path does not have.
        if exc.status_code == 405:
            allow = allowed_methods(app, request.url.path, (exc.headers or {}).get("Allow"))
            return envelope(
                405,
                "METHOD_NOT_ALLOWED",
                f"{request.method} is not allowed here; use {', '.join(allow)} (see /docs).",
                {"allow": allow},
                headers={"Allow": ", ".join(allow)},
                path=request.url.path,
            )
        if exc.status_code == 404:
            return envelope(404, "NOT_FOUND", "No such route; the API is described at /docs.", path=request.url.path)
        return envelope(exc.status_code, "HTTP_ERROR", str(exc.detail), headers=exc.headers)

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        # A JSON body nested beyond the parser's recursion guard (FastAPI-parsed bodies).
        return error_response(
            JsonTooDeepError("The body nests objects and arrays too deeply."),
            retry_after=retry_after,
            path=request.url.path,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        if on_error:
            on_error("INVALID_REQUEST")
        problems = [{"loc": list(err.get("loc", ())), "message": err.get("msg", "")} for err in exc.errors()]
        first = problems[0] if problems else {"loc": [], "message": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return envelope(
            422,
            "INVALID_REQUEST",
            f"{where}: {first['message']}. Fix the request and send it again.",
            {"problems": problems},
            path=request.url.path,
        )
