"""What a browser may ask of the API: writes from this origin only (CSRF), and only under the
names this server answers to (DNS rebinding).

Any web page a user opens can make the browser send a "simple" request (a form post, a no-cors
`fetch`) to 127.0.0.1:8080, with no CORS permission; without API keys nothing else stops it
from producing records or deleting topics. Browsers say where such a request comes from
(`Sec-Fetch-Site`, `Origin`): a state-changing request from another origin is refused. Clients
outside a browser send neither header and are not affected.

A page may also re-point its own host name at 127.0.0.1 (DNS rebinding): its requests are then
same-origin, and only their `Host` header tells them apart. A server bound to a loopback address
answers only to loopback names (and `server.allowed_hosts`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ingest_gateway.kit.errors import CrossSiteRequestError, HostNotAllowedError, error_response

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def cross_site(scope: Scope) -> str | None:
    """Why a state-changing request came from another site's page (None: it did not, or it did
    not come from a browser)."""
    headers = Headers(scope=scope)
    site = headers.get("sec-fetch-site")
    if site is not None:  # a page cannot set it, and it survives proxies that rewrite Host: it decides
        if site in ("same-origin", "none"):
            return None
        return f"A page of another origin sent this {scope['method']} (Sec-Fetch-Site: {site}) and it was refused."
    origin = headers.get("origin")  # browsers without Fetch Metadata
    host = headers.get("host", "")
    if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
        return f"A page of {origin} sent this {scope['method']} to {host or 'this server'} and it was refused."
    return None


class SameOriginMiddleware:
    """Refuses POST, PUT, PATCH and DELETE that a browser sent from another origin (403)."""

    def __init__(self, app: ASGIApp, retry_after: int = 1) -> None:
        self.app = app
        self.retry_after = retry_after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            reason = cross_site(scope)
            if reason is not None:
                response = error_response(
                    CrossSiteRequestError(reason), retry_after=self.retry_after, path=scope["path"]
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _hostname(host: str) -> str:
    """The name part of a Host header ("[::1]:8080" -> "::1", "Example:80" -> "example")."""
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name.rstrip(".")  # "localhost." is localhost


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind_host: str, configured: Iterable[str], advertised: Iterable[str] = ()) -> frozenset[str] | None:
    """The Host names to answer (None: any). `configured` (server.allowed_hosts) decides when
    given ("*": any), with the loopback names (a page cannot send those: local clients keep
    working); else a loopback-bound server answers its loopback names and `advertised`, and one
    bound elsewhere answers any name."""
    names = [n.strip().lower() for n in configured if n.strip()]
    if "*" in names:
        return None
    if names:
        return LOOPBACK_NAMES | {_hostname(n) for n in names} | {_hostname(h) for h in advertised if h}
    if not _is_loopback(bind_host):
        return None
    return LOOPBACK_NAMES | {bind_host.lower().strip("[]")} | {_hostname(h) for h in advertised if h}


class HostGuardMiddleware:
    """Answers 400 to a request whose Host header names a host outside `allowed` (health checks
    included: a rebinding page must not learn even that the server is up)."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host")
            if host is not None and _hostname(host) not in self.allowed:
                error = HostNotAllowedError(f"This server does not answer to the host name {_hostname(host)!r}.")
                await error_response(error, path=scope.get("path", ""))(scope, receive, send)
                return
        await self.app(scope, receive, send)
