"""The Kafka listener: Kafka's wire protocol on asyncio, one more face on the gateway's services.

Concurrency contract
- Runs on the gateway's event loop, beside the HTTP app, over the same `broker.services.Services`.
- One task reads a connection's frames; each request's handler runs its ordered part (decoding,
  checks, handing records to the writer) before the next frame is read, so a connection's
  requests reach the services in the order sent (idempotent sequences stay in order). What a
  handler then waits for (a Delta commit, a long-poll, a rebalance) runs as a future; one writer
  task sends the answers in request order (clients match answers to requests by order).
- Bounded: a frame over `max_request_bytes` (or a negative size) closes the connection before
  anything is read into memory; at most `max_in_flight` requests and `max_in_flight_bytes` of
  request frames wait for their answers per connection; connections are limited in total and per
  client address; a connection idle for `idle_timeout_s` (no frame, nothing owed) is closed, and a
  frame must arrive whole within that time.
- With API keys configured, a connection answers only ApiVersions and SASL until it has
  authenticated; anything else closes it (as Kafka's SASL listeners do).
- Nothing a client sends crashes the listener: an unknown API or version is answered with
  UNSUPPORTED_VERSION, a frame that does not parse with INVALID_REQUEST, each with a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from broker.connections import ConnectionGuard
from broker.services import Services
from conf import KafkaSettings
from delta_log.core.acl import ANONYMOUS, Principal
from kafka_gateway import apis, handlers, messages
from kafka_gateway.brokers import Broker, BrokerView, node_id_for
from kafka_gateway.errors import code_of

log = logging.getLogger(__name__)

__all__ = ["Connection", "KafkaListener", "handlers"]  # importing handlers registers every API

_SIZE = struct.Struct(">i")
#: the largest frame a connection may send before it authenticated (ApiVersions, SASL)
UNAUTHENTICATED_FRAME_BYTES = 512 * 1024


@dataclass(slots=True)
class Connection:
    """One client connection's state, as the handlers see it."""

    services: Services
    settings: KafkaSettings
    brokers: BrokerView
    peer: str
    principal: Principal | None  # None until SASL authenticated a key (keys configured)
    client_id: str | None = None
    #: SASL: the mechanism a handshake chose; "raw" after a v0 handshake (the next frame is the token)
    sasl_mechanism: str | None = None
    sasl_raw: bool = False
    close: bool = False  # close once the answers owed are written


class KafkaListener:
    def __init__(
        self, services: Services | None, settings: KafkaSettings, *, host: str, tls: ssl.SSLContext | None
    ) -> None:
        self.services = services
        self.settings = settings
        self.host = host
        self.tls = tls
        self.guard = ConnectionGuard(
            max_connections=settings.max_connections,
            max_per_client=settings.max_connections_per_client,
            header_timeout_s=settings.idle_timeout_s,
        )
        self._server: asyncio.Server | None = None  # the advertised port's
        self._shared: asyncio.Server | None = None  # `serve --workers`: the port shared with sibling workers
        self._connections: set[asyncio.Task[None]] = set()
        self.view: BrokerView | None = None
        self.me: Broker | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def advertised(self) -> str:
        """The "host:port" clients are told to use (Metadata, FindCoordinator)."""
        host = self.settings.advertised_host or self.host
        if host in ("0.0.0.0", "::", ""):
            import socket

            host = socket.gethostname()
        port = self.settings.advertised_port or self.port
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def node_id(self) -> int:
        return self.settings.node_id if self.settings.node_id is not None else node_id_for(self.advertised)

    async def start(self) -> None:
        """Bind (the port is known once this returns: `port`, `advertised`); `serve` accepts."""
        if self.settings.shared_port:
            self._shared = await asyncio.start_server(
                self._serve,
                self.host,
                self.settings.port,
                ssl=self.tls,
                limit=64 * 1024,
                backlog=2048,
                reuse_port=True,
                start_serving=False,
            )
        own_port = 0 if self.settings.shared_port else self.settings.port
        self._server = await asyncio.start_server(
            self._serve, self.host, own_port, ssl=self.tls, limit=64 * 1024, backlog=2048, start_serving=False
        )
        host, _, port = self.advertised.rpartition(":")
        self.me = Broker(self.node_id, host.strip("[]"), int(port))
        log.info(
            "Kafka listener on %s:%d (advertised %s, node %d)", self.host, self.port, self.advertised, self.node_id
        )

    async def serve(self, services: Services) -> None:
        """Accept connections, over `services` (the cluster is known once they have started)."""
        assert self.me is not None
        self.services = services
        gateway_id = services.cluster.me.gateway_id if services.cluster is not None else None
        self.me = Broker(self.me.node_id, self.me.host, self.me.port, gateway_id)
        self.view = BrokerView(self.me, services.cluster)
        for server in (self._shared, self._server):
            if server is not None:
                await server.start_serving()

    async def stop(self) -> None:
        for server in (self._shared, self._server):
            if server is not None:
                server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if peername else "unknown"
        reason = self.guard.admit(peer)
        if reason is not None:
            self.guard.refused += 1
            log.warning("Kafka connection from %s refused: %s", peer, reason)
            writer.close()
            return
        self._connections.add(task)
        try:
            await self._run(reader, writer, peer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError):
            pass  # the client went away, or sent half a frame and stopped
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("Kafka connection from %s failed", peer)
        finally:
            self._connections.discard(task)
            self.guard.release(peer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        assert self.view is not None and self.services is not None, "serve() starts accepting"
        auth = self.services.settings.auth
        conn = Connection(
            services=self.services,
            settings=self.settings,
            brokers=self.view,
            peer=peer,
            principal=None if auth.enabled else ANONYMOUS,
        )
        owed: asyncio.Queue[tuple[messages.RequestFrame | None, Awaitable[Any], int]] = asyncio.Queue(
            self.settings.max_in_flight
        )
        budget = _ByteBudget(self.settings.max_in_flight_bytes)
        answers = asyncio.create_task(self._answer(conn, owed, writer, budget))
        try:
            while not conn.close and not answers.done():
                size = await self._read_size(reader, budget)
                if size is None:
                    break
                # before authentication only small frames (Kafka's sasl.server.max.receive.size)
                limit = self.settings.max_request_bytes if conn.principal is not None else UNAUTHENTICATED_FRAME_BYTES
                if size < 8 or size > limit:
                    log.warning("Kafka client %s sent a %d-byte frame (limit %d); closing", peer, size, limit)
                    break
                held = min(size, self.settings.max_in_flight_bytes)
                if not budget.try_take(held) and not await _unless_done(budget.take(held), answers):
                    break
                frame = await asyncio.wait_for(reader.readexactly(size), self.settings.idle_timeout_s)
                pending = await apis.dispatch(conn, frame)
                item = (pending.request, pending.answer, held)
                if not owed.full():
                    owed.put_nowait(item)
                elif not await _unless_done(owed.put(item), answers):
                    break
        finally:
            # the writer stops after what is owed (unless it stopped already: the client is gone)
            await _unless_done(owed.put((None, _STOP, 0)), answers)
            with contextlib.suppress(Exception):
                await answers

    async def _read_size(self, reader: asyncio.StreamReader, budget: _ByteBudget) -> int | None:
        """The next frame's size; None at a clean end. Idle only counts while no answer is owed
        (one being written or waited for, a long JoinGroup say, holds request bytes)."""
        while True:
            try:
                head = await asyncio.wait_for(reader.readexactly(4), self.settings.idle_timeout_s)
                return int(_SIZE.unpack(head)[0])
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise
                return None
            except TimeoutError:
                if budget.idle:
                    log.info(
                        "closing an idle Kafka connection (connections.max.idle %.0f s)", self.settings.idle_timeout_s
                    )
                    return None

    async def _answer(
        self,
        conn: Connection,
        owed: asyncio.Queue[tuple[messages.RequestFrame | None, Awaitable[Any], int]],
        writer: asyncio.StreamWriter,
        budget: _ByteBudget,
    ) -> None:
        while True:
            request, answer, size = await owed.get()
            if answer is _STOP:
                return
            try:
                data = await answer
            except Exception as exc:  # a handler bug: answer it, never leave the client waiting
                log.exception("Kafka request %s failed", request and apis.name_of(request.api_key))
                data = apis.error_answer(request, code_of(exc)) if request is not None else None
            finally:
                budget.give(size)
            if data is not None:
                writer.writelines(data)
                await writer.drain()
            if conn.close and owed.empty():
                writer.close()
                return


#: queued after a connection's last request: the writer stops once what is owed is written
_STOP: Any = object()


async def _unless_done(step: Awaitable[Any], writer: asyncio.Task[None]) -> bool:
    """Run `step` (a wait for room: the byte budget, the queue of answers owed) unless the
    connection's writer stops first (the client went away, or a close was answered); then the
    step is cancelled and False returned, so the reader never waits on a writer that is gone."""
    task = asyncio.ensure_future(step)
    if writer.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    await asyncio.wait({task, writer}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return not task.cancelled()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


class _ByteBudget:
    """Request bytes a connection may hold while their answers are owed. One reader takes, the
    writer gives back; a reader short of room sleeps until bytes come back (never polls)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.free = limit
        self._returned = asyncio.Event()

    @property
    def idle(self) -> bool:
        """Nothing is held: every request read was answered."""
        return self.free == self.limit

    def try_take(self, n: int) -> bool:
        if self.free < n:
            return False
        self.free -= n
        return True

    async def take(self, n: int) -> None:
        while not self.try_take(n):
            self._returned.clear()
            await self._returned.wait()

    def give(self, n: int) -> None:
        self.free += n
        self._returned.set()
