"""The Kafka listener's framing (kafka_gateway.listener._Wire) over real sockets on 127.0.0.1, on
asyncio's loop and on uvloop (the server's): frames of every size arrive whole and in order,
large ones as read-only views (kio refuses writable buffers), a client that stops mid-frame or
goes silent is told apart, and an answer larger than the socket's buffers is written whole."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from kafka_gateway.listener import _Wire

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}


def _frame(n: int) -> bytes:
    return struct.pack(">i", n) + bytes([n % 251]) * n


class _Listener:
    """What the listener gives _Wire: `_serve(reader, writer)`, here a loop that records frames."""

    def __init__(self, serve: Callable[[_Wire, asyncio.StreamWriter], Awaitable[None]]) -> None:
        self._serve = serve


def _run(loop: str, serve: Callable[[_Wire, asyncio.StreamWriter], Awaitable[None]], client: Callable[[int], Any]):
    async def main() -> Any:
        server = await asyncio.get_running_loop().create_server(lambda: _Wire(_Listener(serve)), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        out: list[Any] = []
        thread = threading.Thread(target=lambda: out.append(client(port)))
        thread.start()
        await asyncio.to_thread(thread.join, 60)
        server.close()
        assert not thread.is_alive(), "the client did not finish"
        return out[0]

    return LOOPS[loop](main())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_frames_of_every_size_arrive_whole_in_order_and_large_ones_read_only(loop):
    rng = random.Random(7)
    sizes = [rng.choice([8, 100, 5_000, 40_000, 70_000, 1 << 20, 3 << 20]) for _ in range(120)]
    got: list[tuple[int, bool, bool]] = []
    done = threading.Event()

    async def serve(reader: _Wire, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                n = struct.unpack(">i", await reader.readexactly(4, 10))[0]
                frame = await reader.readexactly(n, 10)
                whole = len(frame) == n and bytes(frame[:1]) == bytes(frame[-1:]) == bytes([n % 251])
                got.append((n, whole, isinstance(frame, bytes) or frame.readonly))
                writer.write(b"k")
                await writer.drain()
        except asyncio.IncompleteReadError as exc:
            assert exc.partial == b""  # the client ended between frames
        finally:
            writer.close()
            done.set()

    def client(port: int) -> int:
        with socket.create_connection(("127.0.0.1", port)) as s:
            for n in sizes:
                s.sendall(_frame(n))
            s.shutdown(socket.SHUT_WR)
            acks = b""
            while chunk := s.recv(65536):
                acks += chunk
            return len(acks)

    assert _run(loop, serve, client) == len(sizes)
    assert done.wait(10)
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
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(struct.pack(">i", 200_000) + b"x" * 50_000)  # a large frame, a quarter of it
            s.shutdown(socket.SHUT_WR)
            s.recv(1)

    def goes_silent(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(struct.pack(">i", 10) + b"x" * 3)
            s.recv(1)  # the server closes after its timeout

    _run(loop, serve, stops_mid_frame)
    _run(loop, serve, goes_silent)
    assert seen == ["incomplete 50000 of 200000", "timeout"]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_an_answer_larger_than_the_socket_buffers_is_drained_whole(loop):
    answer = bytes(range(256)) * (32 * 1024)  # 8 MiB: the transport pauses writing on the way

    async def serve(reader: _Wire, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4, 10)
        writer.write(answer)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"ping")
            got = bytearray()
            while chunk := s.recv(1 << 20):
                got += chunk
            return bytes(got)

    assert _run(loop, serve, client) == answer
