"""The Kafka listener's framing (kafka_gateway.listener._Wire) over real sockets on 127.0.0.1, on
asyncio's loop and on uvloop (the server's): frames of every size arrive whole and in order,
large ones as read-only views (kio refuses writable buffers), a client that stops mid-frame or
goes silent is told apart, and an answer larger than the socket's buffers is written whole."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from kafka_gateway.listener import UNRECEIVED_BYTES, _ByteBudget, _Wire

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}


def _frame(n: int) -> bytes:
    return struct.pack(">i", n) + bytes([n % 251]) * n


class _Listener:
    """What the listener gives _Wire: `_serve(reader, writer)`, here a loop that records frames."""

    def __init__(
        self, serve: Callable[[_Wire, asyncio.StreamWriter], Awaitable[None]], unreceived: int = UNRECEIVED_BYTES
    ) -> None:
        self._serve = serve
        self.unreceived = _ByteBudget(unreceived)


async def _answer_and_close(writer: asyncio.StreamWriter) -> None:
    writer.write(b"k")
    await writer.drain()
    writer.close()


def _run(
    loop: str,
    serve: Callable[[_Wire, asyncio.StreamWriter], Awaitable[None]],
    client: Callable[[int], Any],
    listener: _Listener | None = None,
):
    listener = listener or _Listener(serve)

    async def main() -> Any:
        server = await asyncio.get_running_loop().create_server(lambda: _Wire(listener), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        out: list[Any] = []
        thread = threading.Thread(target=lambda: out.append(client(port)), daemon=True)
        thread.start()
        await asyncio.to_thread(thread.join, 60)
        server.close()
        assert not thread.is_alive(), "the client did not finish"
        return out[0]

    return LOOPS[loop](main())


@pytest.mark.parametrize("ahead", [UNRECEIVED_BYTES, 0], ids=["allocated-ahead", "grown-as-they-arrive"])
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_frames_of_every_size_arrive_whole_in_order_and_large_ones_read_only(loop, ahead):
    rng = random.Random(7)
    sizes = [rng.choice([8, 100, 5_000, 40_000, 70_000, 1 << 20, 3 << 20]) for _ in range(120)]
    got: list[tuple[int, bool, bool]] = []
    done = threading.Event()

    async def serve(reader: _Wire, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                n = struct.unpack(">i", await reader.readexactly(4, 10))[0]
                frame = await reader.readexactly(n, 10)
                whole = bytes(frame) == bytes([n % 251]) * n
                got.append((n, whole, isinstance(frame, bytes) or frame.readonly))
                writer.write(b"k")
                await writer.drain()
        except asyncio.IncompleteReadError as exc:
            assert exc.partial == b""  # the client ended between frames
        finally:
            writer.close()
            done.set()

    def client(port: int) -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            for n in sizes:
                s.sendall(_frame(n))
            s.shutdown(socket.SHUT_WR)
            acks = b""
            while chunk := s.recv(65536):
                acks += chunk
            return len(acks)

    listener = _Listener(serve, ahead)
    assert _run(loop, serve, client, listener) == len(sizes)
    assert done.wait(10)
    assert listener.unreceived.idle  # every byte taken ahead was given back
    assert [n for n, _, _ in got] == sizes
    assert all(whole and readonly for _, whole, readonly in got)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_client_gone_mid_frame_and_a_silent_one_are_told_apart(loop):
    seen: list[str] = []

    async def serve(reader: _Wire, writer: asyncio.StreamWriter) -> None:
        n = struct.unpack(">i", await reader.readexactly(4, 10))[0]
        try:
            await reader.readexactly(n, 0.5 if n == 10 else 10)
        except asyncio.IncompleteReadError as exc:
            seen.append(f"incomplete {len(exc.partial)} of {exc.expected}")
        except TimeoutError:
            seen.append("timeout")
        writer.close()

    def stops_mid_frame(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(struct.pack(">i", 200_000) + b"x" * 50_000)  # a large frame, a quarter of it
            s.shutdown(socket.SHUT_WR)
            s.recv(1)

    def goes_silent(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(struct.pack(">i", 10) + b"x" * 3)
            s.recv(1)  # the server closes after its timeout

    _run(loop, serve, stops_mid_frame)
    _run(loop, serve, goes_silent)
    assert seen == ["incomplete 50000 of 200000", "timeout"]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_an_answer_larger_than_the_socket_buffers_waits_in_drain_and_arrives_whole(loop):
    answer = bytes(range(256)) * (32 * 1024)  # 8 MiB: the transport pauses writing on the way
    after_drain: list[tuple[int, int]] = []

    async def serve(reader: _Wire, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4, 10)
        writer.write(answer)
        await writer.drain()  # returns once the transport's buffer is back under its high mark
        after_drain.append((writer.transport.get_write_buffer_size(), writer.transport.get_write_buffer_limits()[1]))
        writer.close()
        await writer.wait_closed()

    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"ping")
            time.sleep(0.5)  # read late: the server's writes back up meanwhile
            got = bytearray()
            while chunk := s.recv(1 << 20):
                got += chunk
            return bytes(got)

    assert _run(loop, serve, client) == answer
    [(buffered, high)] = after_drain
    assert buffered <= high


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_reader_that_lags_pauses_the_socket_and_loses_nothing(loop):
    """300 KB of small frames sent while the server does not read: the buffer grows to its
    bound, the socket pauses, and every frame is read whole once the server reads on."""
    sizes = [100 + i % 900 for i in range(600)]
    got: list[bytes] = []

    async def serve(reader: _Wire, writer: asyncio.StreamWriter) -> None:
        deadline = time.monotonic() + 10  # the client's 300 KB arrive while this does not read
        while not reader._paused and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(reader._buf) == 64 * 1024 and reader._paused  # bounded, and the socket paused
        for n in sizes:
            assert struct.unpack(">i", await reader.readexactly(4, 10))[0] == n
            got.append(bytes(await reader.readexactly(n, 10)))
        await _answer_and_close(writer)

    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"".join(_frame(n) for n in sizes))
            return s.recv(1)

    assert _run(loop, serve, client) == b"k"
    assert got == [bytes([n % 251]) * n for n in sizes]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_size_cut_by_a_timeout_is_read_whole_on_the_next_try(loop):
    """The listener reads a frame's size again after an idle timeout while answers are owed:
    the bytes of the size that had arrived stay."""
    seen: list[object] = []

    async def serve(reader: _Wire, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readexactly(4, 0.3)
        except TimeoutError:
            seen.append("timeout")
        size = struct.unpack(">i", await reader.readexactly(4, 10))[0]
        seen.append(bytes(await reader.readexactly(size, 10)))
        await _answer_and_close(writer)

    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            head = struct.pack(">i", 40_000)
            s.sendall(head[:2])
            time.sleep(0.8)
            s.sendall(head[2:] + b"y" * 40_000)
            return s.recv(1)

    assert _run(loop, serve, client) == b"k"
    assert seen == ["timeout", b"y" * 40_000]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_declared_size_takes_no_memory_before_its_bytes_arrive(loop):
    """Past the listener's bytes held ahead, a client that sends a 60 MB size and a little of the
    frame does not make the gateway take 60 MB: the buffer grows as the bytes arrive."""
    grown: list[int] = []

    async def serve(reader: _Wire, writer: asyncio.StreamWriter) -> None:
        n = struct.unpack(">i", await reader.readexactly(4, 10))[0]
        before = _rss()
        read = asyncio.ensure_future(reader.readexactly(n, 10))
        await asyncio.sleep(0.5)  # the 100 KB the client sent have arrived; it waits
        grown.append(_rss() - before)
        read.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await read
        writer.close()

    def client(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(struct.pack(">i", 60_000_000) + b"z" * 100_000)
            s.recv(1)  # until the server closes

    listener = _Listener(serve, unreceived=50_000_000)  # the 60 MB do not fit: it grows as they come
    _run(loop, serve, client, listener)
    assert grown[0] < 20_000_000, grown
    assert listener.unreceived.idle  # every byte taken ahead was given back


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
