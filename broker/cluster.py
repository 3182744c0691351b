"""This gateway's view of the gateways on its storage root: who is live, and who owns what.

Membership lives in the root (delta_log.system.gateways): every gateway rewrites its record each
`heartbeat_interval_s`; a gateway whose record is older than `member_timeout_s` is out. Ownership
is rendezvous hashing over the live gateways (delta_log.core.ownership): every gateway computes
the same owner for a group with no messages exchanged.

A gateway that cannot refresh its own record for `member_timeout_s` (its storage is gone) counts
itself out too, and owns nothing: it forwards instead of acting on state others have taken over.

Protocol-agnostic on purpose: the HTTP forwarding (ingest_gateway.kit.forwarding) and a Kafka listener
(FindCoordinator answers with `owner(group_resource(g))`) read the same view.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from conf import ClusterSettings
from delta_log.core.ownership import owner, partition_resource
from delta_log.system.gateways import GatewayDirectory, this_process
from delta_log.system.gateways import GatewayRecord as GatewayRecord

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: topics whose partition owners are cached at once (the cache starts over beyond that)
_PARTITION_CACHE_TOPICS = 4096
_OWNER_CACHE = 65536  # resources (groups, transactional ids, ...) whose owner is kept


def new_gateway_id() -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:30] or "gw"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Cluster:
    def __init__(
        self,
        directory: GatewayDirectory,
        settings: ClusterSettings,
        *,
        url: str,
        kafka: str = "",
        node_id: int = -1,
        auth: bool = False,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.settings = settings
        self.clock = wall_clock
        now = self._now_ms()
        self.me = GatewayRecord(
            gateway_id=settings.gateway_id or new_gateway_id(),
            url=(settings.advertise_url or url).rstrip("/"),
            started_at_ms=now,
            heartbeat_ms=now,
            host=socket.gethostname(),
            pid=os.getpid(),
            kafka=kafka,
            node_id=node_id,
            auth=auth,
            process=this_process(),
        )
        self._members: list[GatewayRecord] = [self.me]
        # the live members by id, and the owner among them of each resource asked about: both
        # replaced together when a refresh changes the members (read without a lock)
        self._owned: tuple[dict[str, GatewayRecord], dict[str, str | None]] = ({self.me.gateway_id: self.me}, {})
        #: ids of gateways whose records remain but whose processes are known to have ended
        self._gone: frozenset[str] = frozenset()
        self._partition_owners: dict[tuple[str, int], list[str | None]] = {}
        self._published_ms = now
        self._listeners: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        #: the membership's own thread: its heartbeat never queues behind request work in the
        #: event loop's default executor (a few threads on a small machine; when requests held
        #: them all, a gateway missed its own heartbeat, counted itself out and dropped its groups)
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cluster-membership")

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def _run(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._io, functools.partial(fn, *args))

    @property
    def timeout_ms(self) -> int:
        return int(self.settings.member_timeout_s * 1000)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        await self._beat()
        self._task = asyncio.create_task(self._loop(), name="cluster-heartbeat")

    async def stop(self) -> None:
        """Leave cleanly: the record goes, so others take this gateway's groups at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self._run(self.directory.remove, self.me.gateway_id)
        self._io.shutdown(wait=False)

    def on_change(self, listener: Callable[[], None]) -> None:
        """`listener()` runs on the event loop whenever the live membership changes."""
        self._listeners.append(listener)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            try:
                await self._beat()
            except Exception:
                log.exception("gateway heartbeat failed; retrying")

    async def refresh(self) -> None:
        """Re-read the membership now (every heartbeat, and when a forward failed: the owner may
        have left). If the root cannot be read, the others stay as last seen."""
        try:
            records = await self._run(self.directory.read_all)
            await self._run(self._prune, records)
        except Exception as exc:
            log.warning("could not read the gateway membership: %s", exc)
            records = [r for r in self._members if r.gateway_id != self.me.gateway_id]
        self._set_members(records)

    async def _beat(self) -> None:
        now = self._now_ms()
        record = dataclasses.replace(self.me, heartbeat_ms=now)
        try:
            await self._run(self.directory.publish, record)
            self.me, self._published_ms = record, now
        except Exception as exc:  # storage trouble: we may be counted out soon
            log.warning("could not publish this gateway's heartbeat: %s", exc)
        await self.refresh()

    def _predecessor(self, r: GatewayRecord) -> bool:
        """An earlier incarnation of this gateway (same host and advertised address, started
        before it: only one process serves an address)."""
        return r.url == self.me.url and r.host == self.me.host and r.started_at_ms <= self.me.started_at_ms

    def _ended(self, r: GatewayRecord) -> bool:
        """A gateway known to be dead, whatever its heartbeat says: an earlier incarnation of this
        one, or a process of this machine that is gone (a restart, a `--workers` child started
        again). Its groups and partitions move at once instead of after the membership timeout,
        and its write-ahead leases bind no one (`gone`)."""
        return r.gateway_id != self.me.gateway_id and (self._predecessor(r) or r.process_gone())

    def _prune(self, records: list[GatewayRecord]) -> None:
        """Forget gateways dead for ten membership timeouts (their files would pile up)."""
        now = self._now_ms()
        for r in records:
            if r.gateway_id != self.me.gateway_id and now - r.heartbeat_ms > 10 * self.timeout_ms:
                with contextlib.suppress(Exception):
                    self.directory.remove(r.gateway_id)

    def _set_members(self, records: list[GatewayRecord]) -> None:
        now = self._now_ms()
        # (a dead gateway's record stays ten membership timeouts, far past its write-ahead leases)
        ended = self._gone = frozenset(r.gateway_id for r in records if self._ended(r))
        live = [
            r
            for r in records
            if r.gateway_id != self.me.gateway_id and r.gateway_id not in ended and r.live(now, self.timeout_ms)
        ]
        if self.self_live:
            live.append(self.me)
        live.sort(key=lambda r: r.gateway_id)
        changed = [r.gateway_id for r in live] != [r.gateway_id for r in self._members]
        self._members = live
        self._owned = ({r.gateway_id: r for r in live}, {} if changed else self._owned[1])
        if changed:
            self._partition_owners = {}
            log.info("cluster: %d live gateways: %s", len(live), ", ".join(r.gateway_id for r in live))
            for listener in self._listeners:
                try:
                    listener()
                except Exception:
                    log.exception("cluster membership listener failed")

    # -- queries --------------------------------------------------------------------------------
    @property
    def self_live(self) -> bool:
        """False once this gateway could not refresh its record for the membership timeout."""
        return self._now_ms() - self._published_ms <= self.timeout_ms

    @property
    def members(self) -> list[GatewayRecord]:
        return list(self._members)

    def owner(self, resource: str) -> GatewayRecord | None:
        """The live gateway that owns `resource` (None if none is live, not even this one)."""
        by_id, owners = self._owned  # (one snapshot: a refresh replaces both together)
        try:
            chosen = owners[resource]
        except KeyError:
            if len(owners) >= _OWNER_CACHE:
                owners.clear()
            chosen = owners[resource] = owner(resource, by_id)
        return by_id[chosen] if chosen is not None else None

    def partition_owners(self, topic: str, partitions: int) -> list[str | None]:
        """The owner gateway id of each of `topic`'s partitions (Kafka: each partition's leader),
        cached until the membership changes."""
        key = (topic, partitions)
        owners = self._partition_owners.get(key)
        if owners is None:
            if len(self._partition_owners) >= _PARTITION_CACHE_TOPICS:
                self._partition_owners = {}
            ids = [r.gateway_id for r in self._members]
            owners = [owner(partition_resource(topic, p), ids) for p in range(partitions)]
            self._partition_owners[key] = owners
        return owners

    @property
    def gone(self) -> frozenset[str]:
        """The gateways known to have ended (not merely silent for a while): what they held,
        another may take at once."""
        return self._gone

    def member(self, gateway_id: str) -> GatewayRecord | None:
        return next((r for r in self._members if r.gateway_id == gateway_id), None)

    def owns(self, resource: str) -> bool:
        chosen = self.owner(resource)
        return chosen is not None and chosen.gateway_id == self.me.gateway_id and self.self_live

    def describe(self) -> dict[str, object]:
        now = self._now_ms()
        return {
            "self": self.me.gateway_id,
            "member_timeout_s": self.settings.member_timeout_s,
            "gateways": [
                {
                    "gateway_id": r.gateway_id,
                    "url": r.url,
                    "host": r.host,
                    "pid": r.pid,
                    "started_at_ms": r.started_at_ms,
                    "kafka": r.kafka or None,
                    "node_id": r.node_id if r.kafka else None,
                    "tls": r.url.startswith("https://"),
                    "auth": r.auth,
                    "heartbeat_age_ms": now - r.heartbeat_ms,
                    "live": r.live(now, self.timeout_ms),
                }
                for r in self._members
            ],
        }
