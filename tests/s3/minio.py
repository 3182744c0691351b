"""A real S3 server for tests: MinIO, built from its Go module at a pinned version, cached.

    python -m tests.s3.minio build     # once per machine (make setup does it when Go is installed)

The binary lives in ~/.cache/topiclake/minio/<version>/minio. `MinioServer` starts it on
127.0.0.1 with a temporary data folder and stops it by pid.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow.fs as pafs

#: MinIO's Go module has no semver tags; this pseudo-version is its source of 2026-02-12.
MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "topiclake" / "minio" / MINIO_VERSION
BINARY = CACHE / "minio"
ACCESS_KEY = "topiclake-test"
SECRET_KEY = "topiclake-test-secret"
BUCKET = "topiclake"


def unavailable_reason() -> str | None:
    """Why the S3 tests cannot run here (None: they can)."""
    if BINARY.exists():
        return None
    if shutil.which("go") is None:
        return f"MinIO is not built and Go is not installed: install Go, then run `python -m tests.s3.minio build` ({BINARY})."
    return f"MinIO is not built yet: run `python -m tests.s3.minio build` (needs Go; caches {BINARY})."


def build() -> Path:
    """`go install` MinIO at the pinned version into the cache (a few minutes, once)."""
    if BINARY.exists():
        return BINARY
    if shutil.which("go") is None:
        raise SystemExit(unavailable_reason())
    CACHE.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(CACHE), "CGO_ENABLED": "0"}
    subprocess.run(["go", "install", f"{MINIO_MODULE}@{MINIO_VERSION}"], check=True, env=env)
    return BINARY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MinioServer:
    """One MinIO process on 127.0.0.1 over a temporary folder, with one bucket."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.data = Path(tempfile.mkdtemp(prefix="minio-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self) -> dict[str, str]:
        """What a topiclake root on this server needs (delta-rs names)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def root(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def start(self) -> MinioServer:
        env = {
            **os.environ,
            "MINIO_ROOT_USER": ACCESS_KEY,
            "MINIO_ROOT_PASSWORD": SECRET_KEY,
            "MINIO_PROMETHEUS_AUTH_TYPE": "public",  # request counts for bench/s3_bench.py
        }
        console = _free_port()
        self.proc = subprocess.Popen(
            [
                str(BINARY),
                "server",
                str(self.data),
                "--address",
                f"127.0.0.1:{self.port}",
                "--console-address",
                f"127.0.0.1:{console}",
                "--quiet",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"MinIO exited: {self.proc.stderr.read().decode()[-2000:] if self.proc.stderr else ''}"
                )
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/live", timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError("MinIO did not become live in 60 s")
        fs = pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir(BUCKET)
        return self

    def requests(self) -> dict[str, float]:
        """S3 requests served so far, by API (`PutObject`, `GetObject`, `ListObjectsV2`, ...), from
        MinIO's live request counters (its v2 cluster metrics are cached for a while)."""
        with urllib.request.urlopen(f"{self.endpoint}/minio/metrics/v3/api/requests", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("minio_api_requests_total{") and 'type="s3"' in line:
                api = line.split('name="', 1)[1].split('"', 1)[0]
                out[api] = out.get(api, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.data, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        print(build())
    elif sys.argv[1:] == ["check"]:
        print(unavailable_reason() or f"MinIO ready: {BINARY}")
    else:
        raise SystemExit("usage: python -m tests.s3.minio build|check")
