"""The Kafka listener: the socket layer of the Kafka face. It accepts connections, reads size-
prefixed frames within its bounds, hands each to kafka_gateway.protocol (which knows Kafka's
protocol and nothing of sockets) and writes the answers back in order.

Concurrency contract
- Runs on the gateway's event loop, beside the HTTP app, over the same `broker.services.Services`.
- One task reads a connection's frames; each request's handler runs its ordered part (decoding,
  checks, handing records to the writer) before the next frame is read, so a connection's
  requests reach the services in the order sent (idempotent sequences stay in order). What a
  handler then waits for (a Delta commit, a long-poll, a rebalance) runs as a future; one writer
  task sends the answers in request order (clients match answers to requests by order). The
  group membership requests that answer without waiting for other members run one after
  another, each after the connection's previous one has been answered
  (kafka_gateway.protocol.GROUP_MEMBERSHIP), without holding up the reading of the next frame.
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
from collections.abc import Awaitable, Callable
from typing import Any, cast

from broker.connections import ConnectionGuard
from broker.services import Services
from conf import KafkaSettings
from delta_log.core.acl import ANONYMOUS
from kafka_gateway import messages, protocol
from kafka_gateway.apis import name_of
from kafka_gateway.brokers import Broker, BrokerView, node_id_for
from kafka_gateway.errors import code_of
from kafka_gateway.session import Session

log = logging.getLogger(__name__)

__all__ = ["KafkaListener"]

_SIZE = struct.Struct(">i")
#: the largest frame a connection may send before it authenticated (ApiVersions, SASL)
UNAUTHENTICATED_FRAME_BYTES = 512 * 1024


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
        self.unreceived = _ByteBudget(UNRECEIVED_BYTES)  # its reads never wait: try_take
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
        loop = asyncio.get_running_loop()
        if self.settings.shared_port:
            self._shared = await loop.create_server(
                lambda: _Wire(self),
                self.host,
                self.settings.port,
                ssl=self.tls,
                backlog=2048,
                reuse_port=True,
                start_serving=False,
            )
        own_port = 0 if self.settings.shared_port else self.settings.port
        self._server = await loop.create_server(
            lambda: _Wire(self), self.host, own_port, ssl=self.tls, backlog=2048, start_serving=False
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

    async def _serve(self, reader: _Wire, writer: asyncio.StreamWriter) -> None:
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

    async def _run(self, reader: _Wire, writer: asyncio.StreamWriter, peer: str) -> None:
        assert self.view is not None and self.services is not None, "serve() starts accepting"
        auth = self.services.settings.auth
        conn = Session(
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
                frame = await reader.readexactly(size, self.settings.idle_timeout_s)
                pending = await protocol.dispatch(conn, frame)
                del frame  # not held while the next frame is awaited (its budget is given back)
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

    async def _read_size(self, reader: _Wire, budget: _ByteBudget) -> int | None:
        """The next frame's size; None at a clean end. Idle only counts while no answer is owed
        (one being written or waited for, a long JoinGroup say, holds request bytes)."""
        while True:
            try:
                head = await reader.readexactly(4, self.settings.idle_timeout_s)
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
        conn: Session,
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
                log.exception("Kafka request %s failed", request and name_of(request.api_key))
                data = protocol.error_answer(request, code_of(exc)) if request is not None else None
            finally:
                budget.give(size)
            if data is not None:
                writer.writelines(data)
                await writer.drain()
            if conn.close and owed.empty():
                writer.close()
                return


class _Wire(asyncio.BufferedProtocol):
    """A connection's bytes, read as `readexactly` asks. Small reads come from one buffer (4 KiB,
    grown to 64 KiB when more arrives at once); a frame over 32 KiB is received straight into its
    own bytearray (of its size, or grown as its bytes arrive: UNRECEIVED_BYTES), handed on as a
    read-only view.
    (asyncio's StreamReader copied every byte twice, into its buffer and out of it, and paused and
    resumed the socket every 128 KiB: 0.37-0.54 against 0.13 ms of the event loop's CPU per MB,
    measured receiving 1 MiB frames.) The socket is paused while the buffer is full and no read
    waits, so a connection holds at most the buffer and the frame being read. (Not a subclass
    of asyncio.Protocol, as StreamReaderProtocol is: uvloop then would not use `get_buffer`.)"""

    def __init__(self, listener: KafkaListener) -> None:
        self._loop = asyncio.get_running_loop()
        self._listener = listener
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._buf = bytearray(_FIRST)  # grows to _CHUNK when more arrives than it holds
        self._start = self._end = 0  # the bytes received and not yet read: _buf[_start:_end]
        self._target: bytearray | None = None  # a large read, received in place
        self._filled = 0
        self._need = 0  # the large read's size (its buffer grows toward it as bytes arrive)
        self._whole: bytearray | None = None  # a large read once all of it arrived
        self._want = 0  # how many buffered bytes the waiting read needs
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._error: BaseException | None = None
        self._paused = False
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._transport: asyncio.Transport | None = None

    # -- the transport's side --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        writer = asyncio.StreamWriter(self._transport, self, None, self._loop)
        self._loop.create_task(self._listener._serve(self, writer))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            return memoryview(self._target)[self._filled :]
        if self._end == len(self._buf):  # room at the front: move the unread bytes there
            self._compact(len(self._buf))
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._filled += nbytes
            if self._filled == self._need:
                self._whole, self._target = self._target, None  # what comes next goes to the buffer
                self._wake()
            elif self._filled == len(self._target):
                # more is coming: twice the room, in a new buffer (the transport may hold a view)
                grown = bytearray(min(self._need, 2 * self._filled))
                grown[: self._filled] = self._target
                self._target = grown
            return
        self._end += nbytes
        if self._end - self._start >= self._want:
            self._wake()
        if self._end - self._start == len(self._buf):
            if len(self._buf) < _CHUNK:
                self._compact(2 * len(self._buf))
            else:
                self._pause()  # full: nothing more until a read takes some

    def _compact(self, size: int) -> None:
        """The unread bytes at the front of a buffer of `size` bytes: a new one when larger (never
        resized in place: the transport may still hold a view of it)."""
        unread = self._end - self._start
        if size > len(self._buf):
            grown = bytearray(size)
            grown[:unread] = memoryview(self._buf)[self._start : self._end]
            self._buf = grown
        else:
            self._buf[:unread] = self._buf[self._start : self._end]
        self._start, self._end = 0, unread

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # keep the socket open to write the answers owed (not possible over TLS: it closes)
        return self._transport is not None and self._transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof, self._error = True, exc
        self._wake()
        self.resume_writing()
        if not self._closed.done():
            self._closed.set_result(None)

    # -- StreamWriter's protocol (what FlowControlMixin gives StreamReaderProtocol) --------------
    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    async def _drain_helper(self) -> None:
        """StreamWriter.drain: wait while the transport's write buffer is above its high mark."""
        if self._closed.done():
            raise ConnectionResetError("Session lost")
        if not self._writing_paused:
            return
        if self._drained is None:
            self._drained = self._loop.create_future()
        await asyncio.shield(self._drained)
        if self._closed.done():
            raise ConnectionResetError("Session lost")

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed  # StreamWriter.wait_closed

    # -- the reader's side -----------------------------------------------------------------------
    async def readexactly(self, n: int, timeout: float) -> bytes | memoryview:
        """The next `n` bytes. Raises: IncompleteReadError (the client closed first), TimeoutError
        (they did not all arrive within `timeout` seconds), ConnectionError. After a large read
        (over _LARGE bytes) failed, what it received is gone: the caller closes the connection."""
        unread = self._end - self._start
        if unread < n and n > _LARGE:  # large: received in place
            ahead = self._listener.unreceived.try_take(n)  # else room grows as the bytes arrive
            target = bytearray(n if ahead else min(n, max(2 * unread, _LARGE_FIRST)))
            target[:unread] = memoryview(self._buf)[self._start : self._end]
            self._start = self._end = 0
            self._target, self._filled, self._need = target, unread, n
            try:
                await self._until(lambda: self._filled == n, timeout)
                whole = self._whole
            finally:
                partial, self._target, self._whole = self._target, None, None
                if ahead:
                    self._listener.unreceived.give(n)
            if whole is None:
                received = bytes(partial[: self._filled]) if partial is not None else b""
                raise asyncio.IncompleteReadError(received, n)
            return memoryview(whole).toreadonly()  # kio reads only read-only buffers
        if unread < n:
            if len(self._buf) - self._start < n:  # make room behind the unread bytes
                self._compact(max(len(self._buf), 1 << (n - 1).bit_length()))
            self._want = n
            try:
                await self._until(lambda: self._end - self._start >= n, timeout)
            finally:
                self._want = 0
            if self._end - self._start < n:
                raise asyncio.IncompleteReadError(bytes(self._buf[self._start : self._end]), n)
        data = bytes(memoryview(self._buf)[self._start : self._start + n])
        self._start += n
        if self._start == self._end:
            self._start = self._end = 0
        self._resume()
        return data

    async def _until(self, ready: Callable[[], bool], timeout: float) -> None:
        self._resume()
        async with asyncio.timeout(timeout):
            while not ready() and not self._eof:
                self._waiter = self._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        if not ready() and self._error is not None:
            if isinstance(self._error, OSError):
                raise self._error
            raise ConnectionResetError(str(self._error))

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _pause(self) -> None:
        if not self._paused and not self._eof and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def _resume(self) -> None:
        if self._paused and not self._eof and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()


_FIRST = 4 * 1024  # a connection's buffer at first (most sit idle between small requests)
_CHUNK = 64 * 1024  # and at most: the bytes it reads ahead of the requests
_LARGE = _CHUNK // 2  # a read larger than this is received in place,
_LARGE_FIRST = 1024 * 1024  # into a buffer of up to this much at first, when not of its size


#: bytes a listener's connections may hold in all for frames whose bytes have not arrived yet. Up
#: to this, a large frame gets a buffer of its size as soon as its size is read: one allocation, no
#: copy (measured receiving 1.1 MB frames: 0.19 ms of CPU per MB, against 1.3 ms for a buffer grown
#: from 1 MiB). Past it, buffers grow as bytes arrive: sizes alone (4 bytes a client sends) make the
#: gateway take at most this, plus 1 MiB a connection.
UNRECEIVED_BYTES = 256 * 1024 * 1024

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
