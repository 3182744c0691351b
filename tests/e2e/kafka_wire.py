"""One Kafka request at a time on a plain socket, typed by kio (Kafka's own message specs): for
tests that check the exact answer a client would parse (codes, nulls, what closes a connection)."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

API_VERSIONS = 18


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=15)


def request_frame(api_key: int, version: int, correlation: int = 1, **fields: Any) -> bytes:
    """One request whose body has `fields` (kio's field names and types), without its size."""
    schema = load_request_schema(api_key, version)
    flexible = bool(getattr(schema, "__flexible__", False))
    out = io.BytesIO()
    header = HeaderV2 if flexible else HeaderV1
    entity_writer(header)(
        out,
        header(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation),
            client_id="t",
        ),
    )
    entity_writer(schema)(out, schema(**fields))
    return out.getvalue()


def response_body(frame: bytes, api_key: int, version: int) -> Any:
    """An answer's body, typed (`frame`: the answer without its size)."""
    schema = load_response_schema(api_key, version)
    flexible = bool(getattr(schema, "__flexible__", False)) and api_key != API_VERSIONS
    offset = 4 + (1 if flexible else 0)  # correlation id, then (flexible) its empty tagged fields
    body, _ = entity_reader(schema)(frame, offset)
    return body


def send(sock: socket.socket, api_key: int, version: int, correlation: int = 1, **fields: Any) -> None:
    """Send one request whose body has `fields` (kio's field names and types)."""
    data = request_frame(api_key, version, correlation, **fields)
    sock.sendall(struct.pack(">i", len(data)) + data)


def receive(sock: socket.socket, api_key: int, version: int) -> Any:
    """The next answer, typed; raises ConnectionError when the server closed the connection."""
    head = _exactly(sock, 4)
    return response_body(_exactly(sock, struct.unpack(">i", head)[0]), api_key, version)


def _exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes (a socket with a timeout is non-blocking underneath: MSG_WAITALL may return fewer)."""
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        out += chunk
    return bytes(out)


def call(sock: socket.socket, api_key: int, version: int, **fields: Any) -> Any:
    send(sock, api_key, version, **fields)
    return receive(sock, api_key, version)


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (it sends nothing more)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def sasl_login(sock: socket.socket, user: str, password: str) -> Any:
    """SaslHandshake v1 (PLAIN) and SaslAuthenticate v2: the authenticate answer."""
    assert call(sock, 17, 1, mechanism="PLAIN").error_code == 0
    return call(sock, 36, 2, auth_bytes=b"\0" + user.encode() + b"\0" + password.encode())
