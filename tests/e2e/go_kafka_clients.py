"""The Go Kafka clients (franz-go, sarama, kafka-go) built from tests/e2e/go_clients at the versions its
go.mod pins, cached by the sources' hash.

    python -m tests.e2e.go_kafka_clients build     # make setup does it when Go is installed

The binary lives in ~/.cache/topiclake/go-kafka-clients/<hash>/go-clients.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).parent / "go_clients"
_FILES = ("go.mod", "go.sum", "main.go")


def binary() -> Path:
    digest = hashlib.sha256(b"".join((SOURCE / f).read_bytes() for f in _FILES)).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "topiclake" / "go-kafka-clients"
    return cache / digest / "go-clients"


def unavailable_reason() -> str | None:
    """Why the Go clients cannot run here (None: they can)."""
    if binary().exists() or shutil.which("go") is not None:
        return None
    return f"The Go Kafka clients are not built and Go is not installed: install Go, then run `python -m tests.e2e.go_kafka_clients build` ({binary()})."


def build() -> Path:
    """`go build` the clients into the cache (their modules download once; about 30 s)."""
    out = binary()
    if out.exists():
        return out
    if shutil.which("go") is None:
        raise SystemExit(unavailable_reason())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    subprocess.run(["go", "build", "-o", str(tmp), "."], cwd=SOURCE, check=True, env={**os.environ, "CGO_ENABLED": "0"})
    tmp.rename(out)
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        print(build())
    else:
        print(unavailable_reason() or "ready")
