"""topiclake's own Hive metastore: Hive's metastore service on embedded Derby, one per root.

Embedded Derby lets one JVM open a database at a time, and a root has several Spark JVMs at once:
the SQL endpoint, the scheduler's Spark jobs, every notebook. So no JVM opens the Derby database
itself: one metastore service (Hive's own `HiveMetaStore`, from the jars pyspark ships) holds it,
and every session talks to it over Thrift (`hive.metastore.uris`), the way Spark talks to any shared
metastore. No new dependency and no extra service to install.

- The database lives in `<root>/_system/metastore/derby`; on an S3 root (Derby needs a local disk)
  in `~/.cache/topiclake/metastore/<hash of the root>`.
- `ensure_metastore(settings)` returns the URI of a metastore that answers: the configured
  `catalog.metastore_uri`, else this root's service (its address is in `endpoint.json` beside the
  database), else it starts one. Starting is serialized by a lock file, so two processes never boot
  the database twice.
- The service lives as long as the process that started it (the first catalog session on the root:
  `topiclake sql-server`, a notebook, `topiclake sql`, a Spark job): a small wrapper process (this module's
  `__main__`) waits on both pids, woken by their exit, with no polling. A service that died is
  started again on the same port by the next `ensure_metastore`, so sessions already connected
  reconnect to it (Hive's client retries).

    python -m delta_log.spark.metastore --dir DIR --port PORT [--parent-pid PID]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from conf import Settings
from delta_log.errors import InvalidConfigError
from delta_log.table.storage import StorageRoot

ENDPOINT = "endpoint.json"
_HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    pid: int

    @property
    def uri(self) -> str:
        return f"thrift://{self.host}:{self.port}"


def metastore_dir(settings: Settings) -> Path:
    """Where this root's metastore keeps its Derby database, its log and its address."""
    storage = StorageRoot(settings.root, settings.storage_options)
    if storage.is_local:
        return Path(storage.root) / "_system" / "metastore"
    digest = hashlib.sha256(storage.root.encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "topiclake" / "metastore" / digest


def warehouse_dir(settings: Settings) -> Path:
    """spark.sql.warehouse.dir of catalog sessions: managed tables a user saves outlive the session."""
    return metastore_dir(settings) / "warehouse"


def _answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def read_endpoint(folder: Path) -> Endpoint | None:
    try:
        raw = json.loads((folder / ENDPOINT).read_text())
        return Endpoint(str(raw["host"]), int(raw["port"]), int(raw["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def _start_lock(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "start.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # held while one process checks and starts the service
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


_STARTED: dict[int, subprocess.Popen[bytes]] = {}  # wrappers this process started, reaped when they exit


def _alive(pid: int) -> bool:
    if pid in _STARTED and _STARTED[pid].poll() is not None:
        del _STARTED[pid]
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:  # a pid reused since (a restart) is not ours
            return b"delta_log.spark.metastore" in fh.read()
    except (OSError, IndexError):
        return False


def ensure_metastore(settings: Settings, *, wait: bool = True) -> str:
    """The thrift URI of this root's Hive metastore (or the configured one), starting it if none
    runs. `wait`: until it answers; else return as soon as it is started (call wait_for_metastore
    before the first use: a Spark JVM starts meanwhile).

    Raises: InvalidConfigError if the service cannot start (Java missing, the port taken); the
    message names the log to read."""
    if settings.catalog.metastore_uri:
        return settings.catalog.metastore_uri
    folder = metastore_dir(settings)
    with _start_lock(folder):
        known = read_endpoint(folder)
        if known is None or not (_answers(known.host, known.port) or _alive(known.pid)):
            port = settings.catalog.metastore_port or (
                known.port if known is not None and not _answers(_HOST, known.port, 0.2) else 0
            )
            known = _start(settings, folder, port or _free_port())
            (folder / ENDPOINT).write_text(json.dumps({"host": known.host, "port": known.port, "pid": known.pid}))
    if wait:
        wait_for_metastore(settings)
    return known.uri


def wait_for_metastore(settings: Settings) -> None:
    """Until this root's metastore answers (at once for a configured URI).

    Raises: InvalidConfigError when it exits or does not answer within catalog.start_timeout_s."""
    if settings.catalog.metastore_uri:
        return
    folder = metastore_dir(settings)
    known = read_endpoint(folder)
    deadline = time.monotonic() + settings.catalog.start_timeout_s
    restarted = False
    while known is not None and time.monotonic() < deadline:
        if _answers(known.host, known.port, 0.5):
            return
        if not _alive(known.pid):
            # the service we found was shutting down (the session that started it ended as this one
            # began): start it again, on the same port if it is free, once
            if restarted:
                break
            restarted, port = True, known.port
            ensure_metastore(settings, wait=False)
            known = read_endpoint(folder)
            if known is not None and known.port != port:  # this session's Spark was told the old port
                raise InvalidConfigError(
                    f"the Hive metastore for {settings.root} restarted on port {known.port} (port {port} was "
                    "still taken): start this Spark session again"
                )
            continue
        time.sleep(0.25)  # waiting once, for a JVM to start, bounded by start_timeout_s
    log_path = folder / "metastore.log"
    tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
    raise InvalidConfigError(
        f"the Hive metastore for {settings.root} did not answer"
        f"{f' on {known.host}:{known.port}' if known else ''} (read {log_path}; set catalog.metastore_uri to "
        f"use one you run, or catalog.enabled = false to keep the catalog in the session): {tail}"
    )


def _start(settings: Settings, folder: Path, port: int) -> Endpoint:
    log_path = folder / "metastore.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "delta_log.spark.metastore",
                "--dir",
                str(folder),
                "--port",
                str(port),
                "--heap",
                settings.catalog.metastore_heap,
                "--parent-pid",
                str(os.getpid()),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the caller's terminal goes to the caller, which stops us
        )
    _STARTED[proc.pid] = proc
    return Endpoint(_HOST, port, proc.pid)


def stop_metastore(settings: Settings) -> bool:
    """Stop this root's service if this process started it (its wrapper's parent is us). Returns
    whether one was stopped."""
    folder = metastore_dir(settings)
    known = read_endpoint(folder)
    if known is None:
        return False
    try:
        with open(f"/proc/{known.pid}/stat") as fh:
            parent = int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return False
    if parent != os.getpid():
        return False
    os.kill(known.pid, signal.SIGTERM)
    proc = _STARTED.pop(known.pid, None)
    if proc is not None:
        proc.wait()
    return True


# --- the wrapper process ---------------------------------------------------------------------------


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found:
        raise SystemExit("the Hive metastore needs Java 17 on PATH or in JAVA_HOME (see README, Setup)")
    return found


def metastore_command(folder: Path, port: int, heap: str) -> list[str]:
    """Hive's metastore service from the jars pyspark ships, on Derby in `folder/derby`, listening on
    127.0.0.1 only (topiclake.metastore.LoopbackMetastore: Hive 2.3's own main binds every
    interface, and the service has no authentication)."""
    import pyspark

    from delta_log.spark.java_build import METASTORE_SOURCES, ensure_jar

    jars = Path(pyspark.__file__).parent / "jars"
    hive_conf = {
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={folder / 'derby'};create=true",
        "datanucleus.schema.autoCreateAll": "true",
        "hive.metastore.schema.verification": "false",
        "hive.metastore.warehouse.dir": str(folder / "warehouse"),
        "hive.metastore.event.db.notification.api.auth": "false",
    }
    return [
        _java(),
        f"-Xmx{heap}",
        # Hive's log4j2 defaults ask for async loggers, whose library pyspark does not ship
        "-Dlog4j2.contextSelector=org.apache.logging.log4j.core.selector.BasicContextSelector",
        f"-Dderby.stream.error.file={folder / 'derby.log'}",
        "-cp",
        f"{jars}/*:{ensure_jar(METASTORE_SOURCES, 'topiclake-metastore')}",
        "topiclake.metastore.LoopbackMetastore",
        _HOST,
        str(port),
        *(f"{k}={v}" for k, v in hive_conf.items()),
    ]


def _serve(folder: Path, port: int, heap: str, parent_pid: int | None) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    jvm = subprocess.Popen(metastore_command(folder, port, heap), stdin=subprocess.DEVNULL)
    stop = False

    def _term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True
        jvm.terminate()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    watched = [os.pidfd_open(jvm.pid)]
    if parent_pid is not None:
        try:
            watched.append(os.pidfd_open(parent_pid))
        except ProcessLookupError:
            jvm.terminate()
    while jvm.poll() is None and not stop:
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select(watched, [], [])  # woken by either exit, no timeout
            if any(fd != watched[0] for fd in ready):
                jvm.terminate()
                break
    try:
        return jvm.wait(timeout=15)
    except subprocess.TimeoutExpired:
        jvm.kill()
        return jvm.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--port", required=True, type=int)
    ap.add_argument("--heap", default="384m")
    ap.add_argument("--parent-pid", type=int, help="stop when this process is gone")
    args = ap.parse_args(argv)
    return _serve(args.dir, args.port, args.heap, args.parent_pid)


if __name__ == "__main__":
    sys.exit(main())
