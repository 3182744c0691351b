"""Gateway membership, kept in the storage root itself: no coordination service.

Each gateway owns one small file, `<root>/_system/gateways/<gateway id>.json`, and rewrites it every
heartbeat (a local rename or an object store PUT: readers never see half a file). A gateway is live
while its last heartbeat is younger than the membership timeout; its file is removed when it stops
cleanly, and ignored (then pruned) when it died. Heartbeats carry the writer's wall clock: gateways
on different hosts need synchronized clocks (NTP), within a small part of the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import asdict, dataclass

import pyarrow.fs as pafs

from delta_log.table.storage import StorageRoot, translate_storage_errors

GATEWAYS_DIR = "gateways"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayRecord:
    gateway_id: str
    url: str  # where other gateways and clients reach it
    started_at_ms: int
    heartbeat_ms: int
    host: str = ""
    pid: int = 0
    #: the Kafka listener's advertised "host:port" ("" without one) and its broker id
    kafka: str = ""
    node_id: int = -1
    #: whether its API (and Kafka listener) require keys: what the console's Cluster page shows
    #: (None: a gateway of a version that did not say)
    auth: bool | None = None
    #: which process this is, for a gateway on the same machine to tell it died (`this_process`;
    #: "" where that cannot be told)
    process: str = ""

    def live(self, now_ms: int, timeout_ms: int) -> bool:
        return now_ms - self.heartbeat_ms <= timeout_ms

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> GatewayRecord:
        raw = json.loads(data)
        return cls(
            gateway_id=str(raw["gateway_id"]),
            url=str(raw["url"]),
            started_at_ms=int(raw["started_at_ms"]),
            heartbeat_ms=int(raw["heartbeat_ms"]),
            host=str(raw.get("host", "")),
            pid=int(raw.get("pid", 0)),
            kafka=str(raw.get("kafka", "")),
            node_id=int(raw.get("node_id", -1)),
            auth=None if raw.get("auth") is None else bool(raw["auth"]),
            process=str(raw.get("process", "")),
        )

    def process_gone(self) -> bool:
        """Whether this gateway's process is known to have ended: it ran on this machine (same
        boot, same process namespace) and its pid is gone, a zombie, or another process's now.
        False whenever that cannot be told (another machine, another container, no /proc)."""
        return process_gone(self.process)


def _proc_stat(pid: int | str) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a process, from /proc; None if absent."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # after "pid (comm) ": the comm may hold spaces
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _machine() -> str | None:
    """This boot of this machine, and this process namespace: pids compare only within both."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def this_process() -> str:
    """This process as `<boot id>/<pid namespace>/<pid>/<start ticks>` ("" without /proc)."""
    machine, stat = _machine(), _proc_stat("self")
    return "" if machine is None or stat is None else f"{machine}/{os.getpid()}/{stat[1]}"


def process_gone(process: str) -> bool:
    """Whether the process `this_process()` named there has ended (False: alive, or unknown)."""
    boot, _, rest = process.partition("/")
    ns, _, rest = rest.partition("/")
    pid, _, start = rest.partition("/")
    if not (boot and ns and pid.isdigit() and start) or _machine() != f"{boot}/{ns}":
        return False
    stat = _proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X") or stat[1] != start


class GatewayDirectory:
    """The gateway records under one storage root."""

    def __init__(self, storage: StorageRoot) -> None:
        self.storage = storage
        self.fs, base = storage.filesystem()
        self.dir = f"{base}/_system/{GATEWAYS_DIR}"

    def _path(self, gateway_id: str) -> str:
        return f"{self.dir}/{gateway_id}.json"

    def publish(self, record: GatewayRecord) -> None:
        """Write (or refresh) a gateway's record. Raises: StorageUnavailableError."""
        with translate_storage_errors():
            if self.storage.is_local:
                self.fs.create_dir(self.dir, recursive=True)
                tmp = f"{self.dir}/.{record.gateway_id}.{uuid.uuid4().hex}.tmp"
                with self.fs.open_output_stream(tmp) as f:
                    f.write(record.to_json())
                self.fs.move(tmp, self._path(record.gateway_id))  # atomic rename
            else:
                with self.fs.open_output_stream(self._path(record.gateway_id)) as f:  # one atomic PUT
                    f.write(record.to_json())

    def remove(self, gateway_id: str) -> None:
        with translate_storage_errors(), contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self._path(gateway_id))

    def read_all(self) -> list[GatewayRecord]:
        """Every gateway record (live or not), skipping ones being written or unreadable.

        Raises: StorageUnavailableError."""
        with translate_storage_errors():
            infos = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        out = []
        for info in infos:
            if (
                info.type != pafs.FileType.File
                or not info.base_name.endswith(".json")
                or info.base_name.startswith(".")
            ):
                continue
            try:
                with self.fs.open_input_stream(info.path) as f:
                    out.append(GatewayRecord.from_json(f.read()))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # removed meanwhile, or not ours: not a member
        return sorted(out, key=lambda r: r.gateway_id)
