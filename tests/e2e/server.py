"""Start `topiclake serve` as a user does (a separate process on 127.0.0.1), stop it by pid."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(
        self,
        root: Path | str,
        *,
        env: dict[str, str] | None = None,
        port: int | None = None,
        args: list[str] | None = None,
        ca_file: str | None = None,
        repo: Path = REPO,
    ) -> None:
        self.root = root
        self.port = port or free_port()
        self.args = args or []
        self.repo = repo  # the checkout whose code serves (benchmarks compare two)
        # https when serving TLS: `ca_file` is the CA the test client trusts
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self.url = f"{'https' if ca_file else 'http'}://127.0.0.1:{self.port}"
        # The job scheduler is off unless a test asks for it: its runs would add noise to the others.
        self.env = {**os.environ, "TOPICLAKE_JOBS__SCHEDULE": "false", **(env or {})}
        # Kafka's protocol on a port of its own, known to the test (`kafka`: the bootstrap address)
        if self.env.get("TOPICLAKE_KAFKA__PORT", "0") == "0":
            kafka_port = free_port()
            while kafka_port == self.port:  # two asks may get the same free port (seen in CI)
                kafka_port = free_port()
            self.env["TOPICLAKE_KAFKA__PORT"] = str(kafka_port)
        self.kafka = f"127.0.0.1:{self.env['TOPICLAKE_KAFKA__PORT']}"
        self.proc: subprocess.Popen[bytes] | None = None
        # a local root's logs sit beside it; an object-store root's in the temp folder
        logs = root.parent if isinstance(root, Path) else Path(tempfile.gettempdir())
        self.log = logs / f"server-{self.port}.log"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        if isinstance(self.root, Path):
            self.root.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "topiclake",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--root",
                str(self.root),
                *self.args,
            ],
            cwd=self.repo,
            env={**self.env, "PYTHONPATH": str(self.repo)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1, verify=self.verify).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not become healthy")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc, timeout=30)


def stop_process(proc: subprocess.Popen[bytes], *, timeout: float) -> None:
    """SIGTERM, then SIGKILL if `proc` has not exited within `timeout` seconds (by its own id)."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
