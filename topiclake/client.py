"""Python clients for a topiclake server. Imports only httpx and pyarrow (and the standard library).

from topiclake import Producer, AdminClient
admin = AdminClient("http://127.0.0.1:8080")
admin.create_topic("orders", partitions=3)
with Producer("http://127.0.0.1:8080") as p:
    fut = p.send("orders", value={"id": 1}, key="customer-7")
    print(fut.result())   # RecordMetadata(topic='orders', partition=2, offset=0)
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8080"


class TopiclakeClientError(Exception):
    """An error answered by the server: `code` is the server's stable error code."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}

    @property
    def retriable(self) -> bool:
        return self.status in (429, 503) or self.status >= 500


def raise_for_error(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        err = resp.json()["error"]
        raise TopiclakeClientError(resp.status_code, err["code"], err["message"], err.get("details"))
    except (ValueError, KeyError, TypeError):
        raise TopiclakeClientError(resp.status_code, "HTTP_ERROR", resp.text[:500]) from None


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class AdminClient:
    """Topic administration over HTTP."""

    def __init__(self, url: str = DEFAULT_URL, *, api_key: str | None = None, timeout: float = 30.0) -> None:
        self._http = httpx.Client(base_url=url, headers=_auth_headers(api_key), timeout=timeout)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._http.request(method, path, **kw)
        raise_for_error(resp)
        return resp.json() if resp.content else None

    def create_topic(self, name: str, *, partitions: int = 1, config: dict[str, Any] | None = None) -> dict:
        return self._call("POST", "/topics", json={"name": name, "partitions": partitions, "config": config or {}})

    def list_topics(self) -> list[str]:
        return self._call("GET", "/topics")["topics"]

    def describe_topic(self, name: str) -> dict:
        return self._call("GET", f"/topics/{name}")

    def alter_config(self, name: str, config: dict[str, Any]) -> dict:
        return self._call("PATCH", f"/topics/{name}/config", json={"config": config})

    def add_partitions(self, name: str, count: int) -> dict:
        return self._call("POST", f"/topics/{name}/partitions", json={"count": count})

    def delete_topic(self, name: str) -> None:
        self._call("DELETE", f"/topics/{name}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int


@dataclass(slots=True)
class _Pending:
    record: dict[str, Any]
    future: Future[RecordMetadata]
    callback: Callable[[RecordMetadata | None, Exception | None], None] | None
    size: int


class Producer:
    """Batches records per topic and sends them with idempotence and retries.

    - `linger_ms` / `batch_size` (records) / `batch_bytes`: when a batch is sent.
    - Idempotent: each batch carries Producer-Id and a Producer-Sequence; a retry after a timeout
      or a 429/503 re-sends the same sequence, so the server never writes it twice.
    - `compression="gzip"` compresses request bodies (Content-Encoding: gzip).
    - `send()` returns a Future[RecordMetadata]; `callback(metadata, error)` runs when it resolves.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        linger_ms: float = 5.0,
        batch_size: int = 10_000,
        batch_bytes: int = 4 * 1024 * 1024,
        retries: int = 10,
        retry_backoff_ms: float = 100.0,
        request_timeout: float = 30.0,
        compression: str | None = None,
        value_format: str = "json",
        key_format: str = "string",
        producer_id: str | None = None,
    ) -> None:
        if compression not in (None, "gzip"):
            raise ValueError("compression must be None or 'gzip'")
        self.url = url
        self.linger_s = linger_ms / 1000
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.retries = retries
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.compression = compression
        self.value_format = value_format
        self.key_format = key_format
        self.producer_id = producer_id or f"py-{uuid.uuid4().hex[:20]}"
        self._sequence = 0
        self._http = httpx.Client(base_url=url, headers=_auth_headers(api_key), timeout=request_timeout)
        self._lock = threading.Condition()
        self._batches: dict[str, list[_Pending]] = {}
        self._first: dict[str, float] = {}
        self._bytes: dict[str, int] = {}
        self._in_flight = 0
        self._closed = False
        self._sender = threading.Thread(target=self._run, name="topiclake-producer", daemon=True)
        self._sender.start()

    def send(
        self,
        topic: str,
        value: Any,
        *,
        key: Any = None,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
        timestamp_ms: int | None = None,
        callback: Callable[[RecordMetadata | None, Exception | None], None] | None = None,
    ) -> Future[RecordMetadata]:
        if self._closed:
            raise RuntimeError("Producer is closed")
        record: dict[str, Any] = {"value": self._encode(value, self.value_format)}
        if key is not None:
            record["key"] = self._encode(key, self.key_format)
        if partition is not None:
            record["partition"] = partition
        if headers:
            record["headers"] = headers
        if timestamp_ms is not None:
            record["timestamp"] = timestamp_ms
        fut: Future[RecordMetadata] = Future()
        size = len(json.dumps(record))
        with self._lock:
            batch = self._batches.setdefault(topic, [])
            if not batch:
                self._first[topic] = time.monotonic()
                self._bytes[topic] = 0
            batch.append(_Pending(record, fut, callback, size))
            self._bytes[topic] += size
            self._lock.notify()
        return fut

    @staticmethod
    def _encode(value: Any, fmt: str) -> Any:
        if fmt == "binary":
            raw = value if isinstance(value, bytes) else str(value).encode()
            return base64.b64encode(raw).decode()
        if fmt == "string":
            return value.decode() if isinstance(value, bytes) else str(value)
        return value

    def _ready(self, now: float, force: bool) -> list[tuple[str, list[_Pending]]]:
        out = []
        for topic, batch in list(self._batches.items()):
            if not batch:
                continue
            full = len(batch) >= self.batch_size or self._bytes[topic] >= self.batch_bytes
            if force or full or now - self._first[topic] >= self.linger_s:
                take = batch[: self.batch_size]
                rest = batch[self.batch_size :]
                self._batches[topic] = rest
                self._bytes[topic] = sum(p.size for p in rest)
                self._first[topic] = now
                out.append((topic, take))
        return out

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    ready = self._ready(time.monotonic(), force=self._closed)
                    if ready or (self._closed and not any(self._batches.values())):
                        break
                    waits = [self._first[t] + self.linger_s - time.monotonic() for t, b in self._batches.items() if b]
                    self._lock.wait(max(0.0005, min(waits)) if waits else None)
                if not ready and self._closed:
                    return
                self._in_flight += len(ready)
            for topic, batch in ready:
                with self._lock:
                    seq = self._sequence
                    self._sequence += 1
                self._send_batch(topic, batch, seq)
                with self._lock:
                    self._in_flight -= 1
                    self._lock.notify_all()

    def _send_batch(self, topic: str, batch: list[_Pending], sequence: int) -> None:
        body = json.dumps(
            {
                "key_format": self.key_format,
                "value_format": self.value_format,
                "records": [p.record for p in batch],
            }
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "Producer-Id": self.producer_id,
            "Producer-Sequence": str(sequence),
        }
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        error: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.post(f"/topics/{topic}/records", content=body, headers=headers)
                raise_for_error(resp)
                offsets = resp.json()["offsets"]
                for p, o in zip(batch, offsets, strict=True):
                    md = RecordMetadata(topic, o["partition"], o["offset"])
                    p.future.set_result(md)
                    if p.callback:
                        p.callback(md, None)
                return
            except TopiclakeClientError as exc:
                error = exc
                if not exc.retriable:
                    break
            except httpx.TransportError as exc:  # timeouts, resets: safe to retry (idempotent)
                error = exc
            time.sleep(self.retry_backoff_s * (2 ** min(attempt, 6)) * random.uniform(0.5, 1.0))
        for p in batch:
            p.future.set_exception(error or RuntimeError("send failed"))
            if p.callback:
                p.callback(None, error)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait for the answers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            for topic in self._first:
                self._first[topic] = 0.0  # due now
            self._lock.notify_all()
            while any(self._batches.values()) or self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("flush timed out")
                self._lock.wait(0.01 if remaining is None else min(remaining, 0.01))

    def close(self, timeout: float | None = None) -> None:
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._sender.join(timeout)
        self._http.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
