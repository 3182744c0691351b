"""The web console's face: its page, script, styles and chart library, served at /console.

The console is a small single-page app in the browser (console/static). It holds no data and adds
no data route: every topic, record, group and metric it shows comes from the same HTTP API any
client calls, with the API key the user logs in with (kept in the browser's sessionStorage, sent
as `Authorization: Bearer`). So the API's authorization decides what a key sees, and, since the
API takes no cookies, a page on another site cannot make the browser act with the key. Writes a
browser sends from another origin, and requests under a host name the server does not answer to,
are refused for the whole API (ingest_gateway.browser_guard): that also covers a server without keys.

The files themselves are the same bytes for everyone and are served without a key (a user must be
able to load the login), GET and HEAD only; `server.console = false` turns them off. Every answer
carries a Content-Security-Policy that allows only this origin's scripts and refuses framing
(clickjacking), and `X-Frame-Options: DENY` for older browsers.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC = Path(__file__).parent / "static"
PREFIX = "/console"
#: Built by `make setup` (npm, pinned in the Makefile): the charting library the pages draw with.
CHART_LIBRARY = STATIC / "vendor" / "chart.umd.min.js"

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        b"frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


def is_console_file(method: str, path: str) -> bool:
    """A request for one of the console's own files (served without a key)."""
    return method in ("GET", "HEAD") and (path == PREFIX or path.startswith(PREFIX + "/"))


class _Secured:
    """Adds the console's security headers to every answer of `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, secured)


def install_console(app: FastAPI) -> None:
    """Serve the console at /console/ (and /console, redirected there)."""

    async def to_console() -> RedirectResponse:
        return RedirectResponse(PREFIX + "/", status_code=308)

    app.add_api_route(PREFIX, to_console, methods=["GET"], include_in_schema=False)
    app.mount(PREFIX, _Secured(StaticFiles(directory=STATIC, html=True)), name="console")
