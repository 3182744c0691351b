"""topiclake.Consumer: consumer groups over HTTP, Kafka-style. Imports only httpx and pyarrow.

from topiclake import Consumer
c = Consumer("http://127.0.0.1:8080", group_id="billing", auto_offset_reset="earliest")
c.subscribe(["orders"], on_assign=print, on_revoke=print)
while True:
    for record in c.poll(1.0):
        handle(record)          # record.value is bytes
    # offsets are auto-committed every auto_commit_interval_ms (or call c.commit())
c.close()                       # commits, then leaves the group (its partitions move at once)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc

from topiclake.client import DEFAULT_URL, TopiclakeClientError, client_error, http_client, raise_for_error

ARROW = "application/vnd.apache.arrow.stream"
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    timestamp_type: int
    headers: tuple[tuple[str, bytes | None], ...]


class Consumer:
    """Subscribes to topics as a member of a consumer group (or reads assigned partitions)."""

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        group_id: str | None = None,
        *,
        api_key: str | None = None,
        auto_offset_reset: Literal["earliest", "latest", "error"] = "latest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int | None = None,
        assignor: Literal["range", "roundrobin", "sticky", "uniform", "lag"] = "range",
        group_protocol: Literal["classic", "consumer"] = "classic",
        instance_id: str | None = None,
        max_poll_records: int = 500,
        fetch_max_bytes: int = 4 * 1024 * 1024,
        request_timeout: float = 70.0,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
    ) -> None:
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_s = (heartbeat_interval_ms or session_timeout_ms // 3) / 1000
        self.assignor = assignor
        self.group_protocol = group_protocol
        self.instance_id = instance_id
        self.max_poll_records = max_poll_records
        self.fetch_max_bytes = fetch_max_bytes
        self._http = http_client(
            url, api_key=api_key, timeout=request_timeout, ca_file=ca_file, client_cert=client_cert
        )
        self._hb_http = http_client(url, api_key=api_key, timeout=10, ca_file=ca_file, client_cert=client_cert)
        self._lock = threading.RLock()
        self._topics: list[str] = []
        self._member_id: str | None = None
        self._generation = -1
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._committed_positions: dict[TopicPartition, int] = {}
        self._rejoin = threading.Event()
        self._closed = threading.Event()
        self._on_assign: Callable[[list[TopicPartition]], Any] | None = None
        self._on_revoke: Callable[[list[TopicPartition]], Any] | None = None
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_s
        self._rr = 0
        self._hb_thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="topiclake-commit")

    # -- group membership -----------------------------------------------------------------------
    def subscribe(
        self,
        topics: Iterable[str],
        *,
        on_assign: Callable[[list[TopicPartition]], Any] | None = None,
        on_revoke: Callable[[list[TopicPartition]], Any] | None = None,
    ) -> None:
        if self.group_id is None:
            raise ValueError("subscribe needs a group_id; use assign() without a group")
        self._topics = list(topics)
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._join()
        if self._hb_thread is None:
            self._hb_thread = threading.Thread(target=self._heartbeats, name="topiclake-heartbeat", daemon=True)
            self._hb_thread.start()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read these partitions without a group (positions from committed offsets if group_id is set)."""
        with self._lock:
            self._assignment = sorted(partitions)
            self._init_positions(self._assignment)

    def assignment(self) -> list[TopicPartition]:
        with self._lock:
            return list(self._assignment)

    @property
    def member_id(self) -> str | None:
        return self._member_id

    @property
    def generation(self) -> int:
        return self._generation

    def _group_call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A group request, retried while the group's coordinator moves between gateways (503
        NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE, or the gateway unreachable), for up to a session
        timeout or 30 s: Kafka's clients rediscover the coordinator the same way."""
        deadline = time.monotonic() + max(self.session_timeout_ms / 1000, 30.0)
        while True:
            try:
                resp = self._http.request(method, path, **kw)
                if resp.status_code != 503 or time.monotonic() >= deadline:
                    return resp
            except httpx.TransportError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.2)

    def _join(self) -> None:
        with self._lock:
            body: dict[str, Any] = {
                "topics": self._topics,
                "session_timeout_ms": self.session_timeout_ms,
                "assignor": self.assignor,
                "instance_id": self.instance_id,
                "group_protocol": self.group_protocol,
            }
            if self._member_id:
                body["member_id"] = self._member_id
            for _ in range(3):
                resp = self._group_call("POST", f"/groups/{self.group_id}/members", json=body)
                err = client_error(resp)
                if err is None or err.code != "UNKNOWN_MEMBER":
                    break
                # our session expired, or the group dropped us while we waited: join as new
                # (Kafka's clients reset their member id on UNKNOWN_MEMBER_ID the same way)
                self._member_id = None
                body.pop("member_id", None)
            if err is not None:
                raise err
            data = resp.json()
            self._member_id, self._generation = data["member_id"], data["generation"]
            new = sorted((t, p) for t, ps in data["assignment"].items() for p in ps)
            self._rejoin.clear()
            self._assignment = new
            self._positions = {tp: off for tp, off in self._positions.items() if tp in new}
            self._init_positions([tp for tp in new if tp not in self._positions])
        if self._on_assign:
            self._on_assign(list(new))

    def _rebalance(self) -> None:
        """Commit what was processed (still our generation), revoke, rejoin, assign."""
        revoked = self.assignment()
        if self.enable_auto_commit:
            with contextlib.suppress(TopiclakeClientError):  # fenced: the next owner resumes from the last commit
                self.commit()
        if self._on_revoke:
            self._on_revoke(revoked)
        with self._lock:
            self._positions.clear()
        self._join()

    def _heartbeats(self) -> None:
        while not self._closed.wait(self.heartbeat_interval_s):
            member, generation = self._member_id, self._generation
            if member is None:
                continue
            try:
                resp = self._hb_http.post(
                    f"/groups/{self.group_id}/members/{member}/heartbeat", json={"generation": generation}
                )
                if resp.status_code in (404, 409) or (resp.status_code == 200 and resp.json()["rebalance"]):
                    self._rejoin.set()
            except httpx.TransportError:
                continue

    # -- positions ------------------------------------------------------------------------------
    def _lookup(self, topic: str, at: str) -> dict[int, int]:
        resp = self._http.get(f"/topics/{topic}/offsets", params={"at": at})
        raise_for_error(resp)
        return {p["partition"]: p["offset"] for p in resp.json()["partitions"]}

    def _init_positions(self, tps: list[TopicPartition]) -> None:
        committed: dict[TopicPartition, int] = {}
        if self.group_id is not None and tps:
            resp = self._group_call("GET", f"/groups/{self.group_id}/offsets")
            if resp.status_code == 200:
                committed = {(o["topic"], o["partition"]): o["offset"] for o in resp.json()["offsets"]}
        for tp in tps:
            if tp in committed:
                self._positions[tp] = committed[tp]
                self._committed_positions[tp] = committed[tp]
            else:
                self._reset(tp)

    def _reset(self, tp: TopicPartition) -> None:
        if self.auto_offset_reset == "error":
            raise TopiclakeClientError(
                416, "NO_OFFSET", f"No committed or valid offset for {tp[0]}-{tp[1]} and auto_offset_reset=error."
            )
        self._positions[tp] = self._lookup(tp[0], self.auto_offset_reset)[tp[1]]

    def position(self, tp: TopicPartition) -> int:
        with self._lock:
            return self._positions[tp]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            self._positions[tp] = offset

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_to("earliest", partitions)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_to("latest", partitions)

    def seek_to_timestamp(self, timestamp_ms: int, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_to(str(int(timestamp_ms)), partitions)

    def _seek_to(self, at: str, partitions: Iterable[TopicPartition] | None) -> None:
        tps = list(partitions) if partitions is not None else self.assignment()
        for topic in {t for t, _ in tps}:
            offsets = self._lookup(topic, at)
            with self._lock:
                for t, p in tps:
                    if t == topic:
                        self._positions[(t, p)] = offsets[p]

    # -- consuming ------------------------------------------------------------------------------
    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """Records from the assigned partitions (at most max_poll_records), waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            return self._poll(deadline, timeout)
        except httpx.TransportError:
            # The server is unreachable (restarting, failing over): keep trying on the next poll,
            # as Kafka's clients do; the group's session decides whether we are still a member.
            time.sleep(max(0.0, min(deadline - time.monotonic(), 0.2)))
            return []

    def _poll(self, deadline: float, timeout: float) -> list[ConsumerRecord]:
        if self._rejoin.is_set():
            self._rebalance()
        self._maybe_auto_commit()
        tps = self.assignment()
        if not tps:
            time.sleep(max(0.0, min(timeout, 0.1)))
            return []
        out: list[ConsumerRecord] = []
        first = True
        while True:
            for i in range(len(tps)):
                tp = tps[(self._rr + i) % len(tps)]
                wait = 0
                if not first and not out and i == 0:
                    wait = int(max(0.0, min(deadline - time.monotonic(), 0.5)) * 1000)
                try:
                    out.extend(self._fetch(tp, self.max_poll_records - len(out), wait))
                except httpx.TransportError:
                    if out:
                        return out  # positions moved past these records: hand them over first
                    raise
                if len(out) >= self.max_poll_records:
                    break
            self._rr += 1
            first = False
            if out or time.monotonic() >= deadline or self._rejoin.is_set():
                return out

    def _fetch(self, tp: TopicPartition, max_records: int, wait_ms: int) -> list[ConsumerRecord]:
        with self._lock:
            if tp not in self._positions:
                return []
            offset = self._positions[tp]
        resp = self._http.get(
            f"/topics/{tp[0]}/partitions/{tp[1]}/records",
            params={
                "offset": offset,
                "max_records": max(1, max_records),
                "max_bytes": self.fetch_max_bytes,
                "max_wait_ms": wait_ms,
            },
            headers={"Accept": ARROW},
        )
        if resp.status_code == 416:
            with self._lock:
                self._reset(tp)
            return []
        raise_for_error(resp)
        table = ipc.open_stream(pa.BufferReader(resp.content)).read_all()
        with self._lock:
            if self._positions.get(tp) != offset:
                return []  # seeked or revoked meanwhile
            self._positions[tp] = int(resp.headers["X-Next-Offset"])
        cols = table.to_pydict()
        return [
            ConsumerRecord(
                topic=tp[0],
                partition=tp[1],
                offset=cols["offset"][i],
                key=cols["key"][i],
                value=cols["value"][i],
                timestamp_ms=int(cols["timestamp"][i].timestamp() * 1000) if cols["timestamp"][i] else 0,
                timestamp_type=cols["timestampType"][i],
                headers=tuple((h["key"], h["value"]) for h in (cols["headers"][i] or ())),
            )
            for i in range(table.num_rows)
        ]

    # -- committing -----------------------------------------------------------------------------
    def commit(
        self, offsets: dict[TopicPartition, int] | None = None, *, asynchronous: bool = False
    ) -> Future[None] | None:
        """Commit `offsets` (default: current positions). Raises TopiclakeClientError (409 FENCED_MEMBER
        after a rebalance took the partitions away)."""
        with self._lock:
            todo = (
                dict(offsets)
                if offsets is not None
                else {tp: off for tp, off in self._positions.items() if self._committed_positions.get(tp) != off}
            )
        if asynchronous:
            return self._pool.submit(self._commit, todo)
        self._commit(todo)
        return None

    def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        if not offsets or self.group_id is None:
            return
        body: dict[str, Any] = {"offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()]}
        if self._member_id is not None:
            body.update(member_id=self._member_id, generation=self._generation)
        resp = self._group_call("POST", f"/groups/{self.group_id}/offsets", json=body)
        if resp.status_code in (404, 409):
            self._rejoin.set()
        raise_for_error(resp)
        with self._lock:
            self._committed_positions.update(offsets)

    def _maybe_auto_commit(self) -> None:
        if self.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.auto_commit_interval_s
            with contextlib.suppress(TopiclakeClientError):
                self.commit()

    def close(self) -> None:
        """Commit (with auto-commit), leave the group, release connections."""
        if self._closed.is_set():
            return
        if self.enable_auto_commit:
            with contextlib.suppress(TopiclakeClientError):
                self.commit()
        self._closed.set()
        if self._member_id and self.group_id:
            with contextlib.suppress(httpx.TransportError):
                self._http.delete(f"/groups/{self.group_id}/members/{self._member_id}")
        self._pool.shutdown(wait=True)
        self._http.close()
        self._hb_http.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
