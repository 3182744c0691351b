"""Schemathesis, the OpenAPI fuzzer, against a live keyed server with its default checks (server
errors, status codes, content types, response schemas and headers, schema-valid requests
accepted and invalid ones refused, 405 + Allow, auth not ignored...). Driven by the served
/openapi.json, configured by schemathesis.toml at the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import REPO, ServerProcess

pytestmark = pytest.mark.slow

ST = Path(sys.executable).parent / "st"  # schemathesis's CLI, installed beside this interpreter


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "auth.toml").write_text(
        '[[auth.api_keys]]\nkey = "fuzz-admin"\nprincipal = "ops"\nacls = { "*" = ["admin"] }\ngroups = { "*" = ["admin"] }\n'
    )
    srv = ServerProcess(root / "data", env={"TOPICLAKE_CONFIG": str(root / "auth.toml")}).start()
    yield srv
    srv.stop()


def test_the_served_schema_documents_errors_bodies_and_auth(server):
    doc = httpx.get(server.url + "/openapi.json", headers={"Authorization": "Bearer fuzz-admin"}).json()
    produce = doc["paths"]["/topics/{topic}/records"]["post"]
    assert set(produce["requestBody"]["content"]) == {
        "application/json",
        "application/x-ndjson",
        "application/vnd.apache.arrow.stream",
    }
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if path in ("/healthz", "/readyz"):
                assert op["security"] == []
                continue
            assert op["security"] == [{"apiKey": []}], (path, method)
            for status in ("400", "401", "403", "404", "422", "503"):
                assert op["responses"][status]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"
                }, (path, method, status)
    assert "UNKNOWN_TOPIC" in doc["paths"]["/topics/{topic}"]["get"]["responses"]["404"]["description"]
    r = httpx.put(server.url + "/topics", headers={"Authorization": "Bearer fuzz-admin"})
    assert (
        r.status_code == 405 and r.headers["allow"] == "GET, POST" and r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    )


@pytest.mark.timeout(1500)
def test_schemathesis_finds_nothing(server):
    run = subprocess.run(
        [
            str(ST),
            "run",
            server.url + "/openapi.json",
            "-H",
            "Authorization: Bearer fuzz-admin",
            "--max-examples",
            os.environ.get("TOPICLAKE_FUZZ_EXAMPLES", "20"),
            "--seed",
            os.environ.get("TOPICLAKE_FUZZ_SEED", "20261123"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
