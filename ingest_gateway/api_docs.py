"""The API's docs page, /docs, served whole by the gateway: Swagger UI from npm at a pinned version
(`make setup` copies it to ingest_gateway/static/swagger), never from a CDN, so the page works on
a machine without internet. /redoc (FastAPI's second docs page, which would need another
library) leads to it."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

SWAGGER = Path(__file__).parent / "static" / "swagger"
DOCS = "/docs"
ASSETS = "/docs/assets"
MISSING = (
    "<!doctype html><title>topiclake API</title><p>This page needs Swagger UI, which <code>make setup</code> "
    "(or <code>make run</code>) fetches with npm: run it, then reload. The API's description is at "
    '<a href="/openapi.json">/openapi.json</a>.</p>'
)


def is_docs_asset(path: str) -> bool:
    return path.startswith(ASSETS + "/")


def install_docs(app: FastAPI) -> None:
    """/docs (Swagger UI over /openapi.json), its files under /docs/assets, and /redoc -> /docs.
    The app must be made with `docs_url=None, redoc_url=None`."""

    async def docs() -> Response:
        if not (SWAGGER / "swagger-ui-bundle.js").exists():
            return HTMLResponse(MISSING, status_code=503)
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url="data:,",
        )

    async def redoc() -> RedirectResponse:
        return RedirectResponse(DOCS, status_code=308)

    app.add_api_route(DOCS, docs, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)
    app.mount(ASSETS, StaticFiles(directory=SWAGGER, check_dir=False), name="docs-assets")
