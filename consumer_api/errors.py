"""Errors only the HTTP front door raises (request bodies, media types, query formats).

They sit under the one root (delta_log.errors.TopiclakeError) with stable codes; the gateway's
status table maps them like every other error. Errors every front door shares (authentication,
authorization, records, offsets) live in delta_log.errors.
"""

from __future__ import annotations

from delta_log.errors import TopiclakeError


class MalformedRequestError(TopiclakeError):
    """The body cannot be parsed (bad JSON, NDJSON line or Arrow stream); `index` names the record."""

    code = "MALFORMED_REQUEST"


class JsonTooDeepError(MalformedRequestError):
    """A JSON document nested deeper than MAX_JSON_DEPTH (see consumer_api.json_body)."""

    code = "JSON_TOO_DEEP"
    hint = "Flatten the document: objects and arrays may nest at most 64 levels."


class UnsupportedMediaTypeError(TopiclakeError):
    code = "UNSUPPORTED_MEDIA_TYPE"
    hint = "Use application/json, application/x-ndjson or application/vnd.apache.arrow.stream."


class CrossSiteRequestError(TopiclakeError):
    """A browser sent a state-changing request from another site's page (CSRF)."""

    code = "CROSS_SITE_REQUEST"
    hint = (
        "The API takes writes from its own origin (the console) and from clients outside a browser; "
        "call it from this origin, or from a backend."
    )


class HostNotAllowedError(TopiclakeError):
    """The Host header names a host this server does not serve (DNS rebinding)."""

    code = "HOST_NOT_ALLOWED"
    hint = "Use the address the server listens on, or add the name to server.allowed_hosts."
