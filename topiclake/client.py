"""Python clients for a topiclake server. Imports httpx and pyarrow (and the standard library); the
Producer also takes the gateway's own key partitioner (delta_log.core.partitioner, Kafka's murmur2)
once it places keyed records itself.

from topiclake import Producer, AdminClient
admin = AdminClient("http://127.0.0.1:8080")
admin.create_topic("orders", partitions=3)
with Producer("http://127.0.0.1:8080") as p:
    fut = p.send("orders", value={"id": 1}, key="customer-7")
    print(fut.result())   # RecordMetadata(topic='orders', partition=2, offset=0)

Every client takes one gateway URL or several (a list, or "http://a:8080,http://b:8080"): it talks
to one and moves to the next when a connection fails.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import queue
import random
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from delta_log.core.murmur2 import partition_for_key  # the gateway's own (Kafka's murmur2)

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


def client_error(resp: httpx.Response) -> TopiclakeClientError | None:
    """The server's error in `resp` (None for a success)."""
    if resp.status_code < 400:
        return None
    try:
        err = resp.json()["error"]
        return TopiclakeClientError(resp.status_code, err["code"], err["message"], err.get("details"))
    except (ValueError, KeyError, TypeError):
        return TopiclakeClientError(resp.status_code, "HTTP_ERROR", resp.text[:500])


def raise_for_error(resp: httpx.Response) -> None:
    err = client_error(resp)
    if err is not None:
        raise err


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class FailoverTransport(httpx.BaseTransport):
    """Several gateways, one client: requests go to the gateway that last answered; one that
    cannot be connected to is skipped for the next. Only connection failures move a request (it
    was never sent), so moving is safe for any request; a producer's retries after a timeout keep
    their sequence, so the server never writes a batch twice."""

    def __init__(self, urls: Sequence[str], verify: ssl.SSLContext | bool) -> None:
        self._urls = [httpx.URL(u) for u in urls]
        self._current = 0
        self._inner = httpx.HTTPTransport(verify=verify)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        error: httpx.ConnectError | httpx.ConnectTimeout | None = None
        for i in range(len(self._urls)):
            index = (self._current + i) % len(self._urls)
            base = self._urls[index]
            request.url = request.url.copy_with(scheme=base.scheme, host=base.host, port=base.port)
            request.headers["Host"] = base.netloc.decode("ascii")
            try:
                response = self._inner.handle_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # not sent: try the next gateway
                error = exc
                continue
            self._current = index
            return response
        assert error is not None
        raise error

    def close(self) -> None:
        self._inner.close()


def gateway_urls(url: str | Sequence[str]) -> list[str]:
    """`url` as a list: one URL, a comma-separated string, or a sequence of them."""
    parts = url.split(",") if isinstance(url, str) else list(url)
    urls = [u.strip().rstrip("/") for u in parts if u.strip()]
    if not urls:
        raise ValueError("give at least one gateway URL")
    return urls


def http_client(
    url: str | Sequence[str],
    *,
    api_key: str | None,
    timeout: float,
    ca_file: str | None = None,
    client_cert: tuple[str, str] | None = None,
) -> httpx.Client:
    """The HTTP client every topiclake client uses: the key; for https the CA file to trust
    (default: the system's) and an optional client certificate (cert file, key file); with
    several gateway URLs (a list, or comma-separated), failover between them."""
    verify: ssl.SSLContext | bool = True
    if ca_file or client_cert:
        verify = ssl.create_default_context(cafile=ca_file)
        if client_cert:
            verify.load_cert_chain(*client_cert)
    urls = gateway_urls(url)
    transport = FailoverTransport(urls, verify) if len(urls) > 1 else None
    return httpx.Client(
        base_url=urls[0], headers=_auth_headers(api_key), timeout=timeout, verify=verify, transport=transport
    )


class AdminClient:
    """Topic administration over HTTP."""

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
    ) -> None:
        self._http = http_client(url, api_key=api_key, timeout=timeout, ca_file=ca_file, client_cert=client_cert)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._http.request(method, path, **kw)
        raise_for_error(resp)
        return resp.json() if resp.content else None

    def create_topic(
        self,
        name: str,
        *,
        partitions: int = 1,
        config: dict[str, Any] | None = None,
        value_schema: str | dict | None = None,
        schema_type: str = "AVRO",
    ) -> dict:
        """Create a topic; `value_schema` (Avro, or JSON Schema with schema_type="JSON"; text or a
        dict) is registered under `<name>-value` with it, or nothing is created."""
        body: dict[str, Any] = {"name": name, "partitions": partitions, "config": config or {}}
        if value_schema is not None:
            text = value_schema if isinstance(value_schema, str) else json.dumps(value_schema)
            body["value_schema"] = {"schema": text, "schemaType": schema_type}
        return self._call("POST", "/topics", json=body)

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


class RecordMetadata(NamedTuple):
    """Where a record went (a named tuple: made once per acked record, at half a frozen
    dataclass's cost)."""

    topic: str
    partition: int
    #: None for a record of a transaction: its offset is assigned when the transaction commits
    offset: int | None


class _BatchResult:
    """The answer to one produce request, shared by the futures of its records."""

    __slots__ = ("callbacks", "dead_letters", "done", "error", "offsets", "partitions", "send_callbacks", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.dead_letters: dict[int, str] = {}  # index -> the dead-letter topic that took the record
        self.done = threading.Event()
        self.partitions: list[int] = []
        self.offsets: list[int | None] = []
        self.error: BaseException | None = None
        self.callbacks: list[tuple[int, Callable[[RecordFuture], None]]] = []
        self.send_callbacks: list[tuple[int, Callable[[RecordMetadata | None, Exception | None], None]]] = []

    def metadata(self, index: int) -> RecordMetadata:
        """Where record `index` went: the topic, or for a value its schema refused on a topic with
        errors.tolerance=all, the dead-letter topic."""
        return RecordMetadata(self.dead_letters.get(index, self.topic), self.partitions[index], self.offsets[index])


class RecordFuture:
    """The eventual RecordMetadata of one sent record, as Kafka's FutureRecordMetadata.

    `result(timeout)`, `exception(timeout)`, `done()` and `add_done_callback(fn)` behave as on a
    `concurrent.futures.Future`; all records of one request resolve together.
    """

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _BatchResult, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        return self._batch.done.is_set()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.done.wait(timeout):
            raise TimeoutError("the record was not acknowledged in time")
        return self._batch.error

    def result(self, timeout: float | None = None) -> RecordMetadata:
        error = self.exception(timeout)
        if error is not None:
            raise error
        return self._batch.metadata(self._index)

    def add_done_callback(self, fn: Callable[[RecordFuture], None]) -> None:
        with _CALLBACKS_LOCK:
            if not self._batch.done.is_set():
                self._batch.callbacks.append((self._index, fn))
                return
        fn(self)


_CALLBACKS_LOCK = threading.Lock()


class _Batch:
    """Records queued for one topic, column by column (sent as one Arrow IPC request)."""

    __slots__ = ("first", "headers", "keys", "nbytes", "partitions", "result", "timestamps", "values")

    def __init__(self, topic: str, now: float) -> None:
        self.first = now
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        # by record index, only the records that have one (most have none: a list of Nones a
        # record cost a send() three appends, and to_arrow() three scans)
        self.partitions: dict[int, int] = {}
        self.timestamps: dict[int, int] = {}
        self.headers: dict[int, list[dict[str, Any]]] = {}
        self.nbytes = 0
        self.result = _BatchResult(topic)

    def __len__(self) -> int:
        return len(self.values)

    @staticmethod
    def to_arrow(batches: Sequence[_Batch], partition: int | None = None) -> bytes:
        """The records of `batches` (one lane's, in order) as one Arrow IPC stream; `partition`:
        the lane's, every record's (None: each record's own where it gave one, else the gateway's
        choice)."""

        def column(name: str) -> list[Any]:
            return list(itertools.chain.from_iterable(getattr(b, name) for b in batches))

        def sparse(name: str) -> list[Any] | None:
            if not any(getattr(b, name) for b in batches):
                return None
            out: list[Any] = []
            for b in batches:
                given = getattr(b, name)
                out.extend(given.get(i) for i in range(len(b)))
            return out

        cols: dict[str, pa.Array] = {"key": _binary_array(column("keys")), "value": _binary_array(column("values"))}
        if partition is not None:
            cols["partition"] = _int64_array(np.full(len(cols["value"]), partition, np.int64))
        elif (partitions := sparse("partitions")) is not None:
            cols["partition"] = _int64_array(partitions)
        if (timestamps := sparse("timestamps")) is not None:
            cols["timestamp"] = _int64_array(timestamps)  # epoch ms
        if (headers := sparse("headers")) is not None:
            cols["headers"] = pa.array(headers, _HEADERS)  # (the one column built from Python objects)
        table = pa.table(cols)
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        return bytes(sink.getvalue())


# The request's columns are built from buffers: `pa.array` on Python objects imports pandas the
# first time a process calls it (0.2-0.5 s measured here), which stalled a new producer's first
# request by that much. Headers, rarer, still take that path.
def _binary_array(items: list[bytes | None]) -> pa.Array:
    """`items` as one Arrow binary column (None: null)."""
    n = len(items)
    nulls = items.count(None)
    if nulls == n:
        return pa.nulls(n, pa.binary())
    validity = None
    present: list[bytes] = items  # type: ignore[assignment]  # (no None left below)
    if nulls:
        validity = pa.py_buffer(
            np.packbits(np.fromiter((x is not None for x in items), np.bool_, n), bitorder="little")
        )
        present = [b"" if x is None else x for x in items]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter(map(len, present), np.int64, n), out=offsets[1:])
    large = offsets[-1] > np.iinfo(np.int32).max  # (past 2 GiB: 64-bit offsets)
    return pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        n,
        [validity, pa.py_buffer(offsets if large else offsets.astype(np.int32)), pa.py_buffer(b"".join(present))],
        null_count=nulls,
    )


def _int64_array(items: Sequence[int | None] | np.ndarray) -> pa.Array:
    """`items` as one Arrow int64 column (None: null)."""
    n = len(items)
    validity = None
    nulls = 0
    if not isinstance(items, np.ndarray):
        valid = np.fromiter((x is not None for x in items), np.bool_, n)
        nulls = n - int(valid.sum())
        if nulls:
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        items = np.fromiter((0 if x is None else x for x in items), np.int64, n)
    return pa.Array.from_buffers(pa.int64(), n, [validity, pa.py_buffer(items)], null_count=nulls)


#: what a record takes in a request beyond its key, value and headers (Arrow offsets, validity,
#: partition and timestamp slots), as `send()` counts it
_ROW_BYTES = 24

log = logging.getLogger("topiclake.client")


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _text_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


#: how `send()` encodes keys and values, per format ("binary" takes bytes as they are, as "string" does)
_ENCODERS: dict[str, Callable[[Any], bytes]] = {"json": _json_bytes, "string": _text_bytes, "binary": _text_bytes}


def _check_int64(**numbers: int | None) -> None:
    """Raises: TypeError unless each of `numbers` is None or an int of 64 bits (what the request's
    columns hold: checked at `send()`, not where its batch is built)."""
    for name, number in numbers.items():
        if number is not None and (not isinstance(number, int) or not -(2**63) <= number < 2**63):
            raise TypeError(f"{name} must be an int of 64 bits or None; got {number!r}.")


def _call(fn: Callable[..., Any], *args: Any) -> None:
    """A user's callback: what it raises is logged, as Kafka's producer does, never fatal."""
    try:
        fn(*args)
    except Exception:
        log.exception("a send callback raised")


_HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_ARROW = "application/vnd.apache.arrow.stream"


#: how long a topic's partition count is trusted (Kafka's metadata.max.age.ms), and how soon one
#: that could not be read (no such topic yet, the gateway unreachable) is asked again
METADATA_MAX_AGE_S = 300.0
UNKNOWN_RETRY_S = 1.0
#: keys whose partition a topic remembers (murmur2 in Python costs a few microseconds a key)
_KEY_CACHE = 100_000
#: the longest producer id that leaves room for a lane's ".<partition>" (the gateway takes 128)
_MAX_PRODUCER_ID = 116


class _Lane:
    """Where one topic partition's records queue (or a topic's whose partition count is unknown:
    the gateway partitions those): the batch being filled, the full batches behind it, the next
    request's sequence, and whether a request of it is in flight. A lane has at most one request
    in flight, so its records are written in send order (Kafka's order is per partition); lanes go
    in parallel, up to `max_in_flight`. Each lane is its own idempotent producer on the gateway
    (`<producer id>.<partition>`), so its sequences are checked against its partition alone."""

    __slots__ = ("batch", "busy", "full", "partition", "producer_id", "sequence", "topic")

    def __init__(self, topic: str, partition: int | None, producer_id: str) -> None:
        self.topic = topic
        self.partition = partition
        self.producer_id = producer_id if partition is None else f"{producer_id}.{partition}"
        self.batch: _Batch | None = None  # being filled
        self.full: list[_Batch] = []  # full, in order, waiting for the lane's turn
        self.sequence = 0
        self.busy = False


class _Topic:
    """What the producer knows of a topic: its partition count (None: unknown), until when, the
    sticky partition of records with neither key nor partition (Kafka's: one partition until its
    batch leaves), each key's partition (murmur2, as the gateway and Kafka's clients place it),
    and its lanes."""

    __slots__ = ("keys", "lanes", "partitions", "refresh_at", "sticky")

    def __init__(self, partitions: int | None, refresh_at: float) -> None:
        self.partitions = partitions
        self.refresh_at = refresh_at
        self.sticky = random.randrange(partitions) if partitions else 0
        self.keys: dict[bytes, int] = {}
        self.lanes: dict[int | None, _Lane] = {}

    def key_partition(self, key: bytes) -> int:
        part = self.keys.get(key)
        if part is None:
            assert self.partitions is not None
            if len(self.keys) >= _KEY_CACHE:
                self.keys.clear()
            part = self.keys[key] = partition_for_key(key, self.partitions)
        return part

    def moved_on(self, lane: _Lane) -> None:
        """`lane`'s batch left (full, or taken by a request): records without key or partition go
        to the next partition, so that the next request can go beside this one."""
        if self.partitions and lane.partition == self.sticky:
            self.sticky = (self.sticky + 1) % self.partitions


class Producer:
    """Batches records per partition and sends them with idempotence and retries.

    - `linger_ms` / `batch_size` (records) / `batch_bytes`: when a batch is sent.
    - Partitions are chosen here, as Kafka's clients choose them: a record's own `partition`; else
      its key's murmur2 over the topic's partition count (read from the gateway when the topic is
      first sent to, and every `metadata_max_age_ms`); else one sticky partition until its batch
      leaves. A topic whose partition count cannot be read is partitioned by the gateway.
    - Each partition is a lane: one request of it in flight at a time, so its records keep their
      order; up to `max_in_flight` requests of different lanes go at once (Kafka's
      max.in.flight.requests.per.connection, 5 with idempotence). Batches of a lane that filled
      meanwhile go together in its next request, up to `max_request_bytes` (the gateway's
      `max_request_bytes` is 64 MiB).
    - `buffer_bytes` (Kafka's buffer.memory): what may wait to be sent or acknowledged. A `send()`
      that does not fit blocks until acks make room, at most `max_block_ms` (then TimeoutError),
      as Kafka's `send()` does; a `send()` from a callback (they run on one thread of their own,
      while the next requests are sent) never blocks on the buffer.
    - Batches travel as Arrow IPC (the gateway's fastest decoder); keys and values are encoded on
      `send()` by `key_format` / `value_format` ("json", "string", "binary": raw bytes), exactly as
      the JSON API would store them.
    - Idempotent: each request carries Producer-Id (the lane's: `<producer_id>.<partition>`) and
      its Producer-Sequence; a retry after a timeout or a 429/503 re-sends the same sequence, so
      the gateway never writes it twice.
    - `compression="gzip"` compresses request bodies (Content-Encoding: gzip).
    - `send()` returns a RecordFuture; `callback(metadata, error)` runs when it resolves.
    - Transactions (`transactional_id`): `init_transactions()` once (it fences older producers of
      the id), then `begin_transaction()`, `send()`s, `send_offsets_to_transaction()`, and
      `commit_transaction()` (every record and offset visible at once; a record's offset is None
      until then) or `abort_transaction()` (none of them, ever), as with Kafka's producers.
    """

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        *,
        api_key: str | None = None,
        linger_ms: float = 5.0,
        batch_size: int = 100_000,
        batch_bytes: int = 4 * 1024 * 1024,
        buffer_bytes: int = 32 * 1024 * 1024,
        max_request_bytes: int = 16 * 1024 * 1024,
        max_block_ms: float = 60_000.0,
        max_in_flight: int = 5,
        metadata_max_age_ms: float = METADATA_MAX_AGE_S * 1000,
        retries: int = 10,
        retry_backoff_ms: float = 100.0,
        request_timeout: float = 30.0,
        compression: str | None = None,
        value_format: str = "json",
        key_format: str = "string",
        producer_id: str | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        if compression not in (None, "gzip"):
            raise ValueError("compression must be None or 'gzip'")
        if min(batch_bytes, max_request_bytes, buffer_bytes) <= 0:
            raise ValueError("batch_bytes, max_request_bytes and buffer_bytes must be positive.")
        if not 1 <= max_in_flight <= 64:
            raise ValueError("max_in_flight must be between 1 and 64.")
        if producer_id is not None and len(producer_id) > _MAX_PRODUCER_ID:
            raise ValueError(
                f"producer_id must be at most {_MAX_PRODUCER_ID} characters (each partition's lane adds "
                "'.<partition>', and the gateway takes 128)."
            )
        max_request_bytes = min(max_request_bytes, buffer_bytes)  # a request is at most what may wait
        batch_bytes = min(batch_bytes, max_request_bytes)
        for name, fmt in (("value_format", value_format), ("key_format", key_format)):
            if fmt not in _ENCODERS:
                raise ValueError(f"{name} must be 'json', 'string' or 'binary'")
        self.url = url
        self.linger_s = linger_ms / 1000
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.buffer_bytes = buffer_bytes
        self.max_request_bytes = max_request_bytes
        self.max_block_s = max_block_ms / 1000
        self.max_in_flight = max_in_flight
        self.metadata_max_age_s = metadata_max_age_ms / 1000
        self.retries = retries
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.request_timeout = request_timeout
        self.compression = compression
        self.value_format = value_format
        self.key_format = key_format
        self.producer_id = producer_id or f"py-{uuid.uuid4().hex[:20]}"
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        #: the transaction's headers while one is open (None: records are appended at once)
        self._txn_headers: dict[str, str] | None = None
        self._txn_producer: tuple[int, int] | None = None  # (producer id, epoch) from init_transactions
        self._txn_failed: BaseException | None = None  # a send of the open transaction failed
        self._http = http_client(
            url, api_key=api_key, timeout=request_timeout, ca_file=ca_file, client_cert=client_cert
        )
        # `send()` takes the condition's lock itself: `with` on the Condition is a Python-level call
        # on every record
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._topics: dict[str, _Topic] = {}
        self._pending: dict[_Lane, None] = {}  # lanes with a batch to send, oldest first
        self._in_flight = 0  # batches in requests not yet answered
        self._buffered = 0  # bytes of records queued or in flight (bounded by buffer_bytes)
        self._closed = False
        # answered requests, resolved (futures, callbacks) on their own thread while others are sent
        self._answered: queue.SimpleQueue[tuple[list[_Batch], BaseException | None] | None] = queue.SimpleQueue()
        self._encode_value, self._encode_key = _ENCODERS[value_format], _ENCODERS[key_format]
        self._stopped = False  # a thread of the producer's ended (set as it ends)
        # the dispatcher takes requests off the lanes (under the lock, woken by sends, answers and
        # lingers), and `max_in_flight` senders each send one at a time (woken by the queue alone)
        self._requests: queue.SimpleQueue[tuple[_Lane, list[_Batch], int] | None] = queue.SimpleQueue()
        self._senders_left = max_in_flight
        self._senders = [
            threading.Thread(target=self._watched(self._send_loop), name=f"topiclake-producer-{i}", daemon=True)
            for i in range(max_in_flight)
        ]
        self._dispatcher = threading.Thread(
            target=self._watched(self._dispatch), name="topiclake-producer", daemon=True
        )
        self._resolver = threading.Thread(
            target=self._watched(self._resolve_answers), name="topiclake-producer-callbacks", daemon=True
        )
        for thread in (self._dispatcher, *self._senders, self._resolver):
            thread.start()

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
    ) -> RecordFuture:
        """Queue one record; `value=None` is a tombstone (a null value: compaction and upsert tables
        delete the key), as with Kafka's producers. The first send to a topic reads its partition
        count (at most max_block_ms). Raises: RuntimeError (closed), TypeError/ValueError
        (unencodable value; a partition or timestamp that is not a 64-bit int)."""
        if partition is not None or timestamp_ms is not None:  # (most records give neither)
            _check_int64(partition=partition, timestamp_ms=timestamp_ms)
        v = None if value is None else self._encode_value(value)
        k = None if key is None else self._encode_key(key)
        hs = None
        if headers:
            if not all(isinstance(hk, str) for hk in headers):
                raise TypeError("Header keys must be strings.")
            hs = [{"key": hk, "value": str(hv).encode()} for hk, hv in headers.items()]
        # what the record takes in the request's Arrow columns (offsets, validity, the partition
        # and timestamp slots: ~24 bytes a row), so a request's body stays near its estimate
        size = (len(v) if v else 0) + (len(k) if k else 0) + _ROW_BYTES
        if hs:
            size += sum(len(h["key"]) + len(h["value"]) + _ROW_BYTES for h in hs)
        if size > self.max_request_bytes:  # (at most buffer_bytes)
            raise ValueError(
                f"A record of {size} bytes cannot fit buffer_bytes ({self.buffer_bytes}) or max_request_bytes "
                f"({self.max_request_bytes}); send smaller records or raise both."
            )
        if self._stopped:
            self._check_running()
        if self.transactional_id is not None and self._txn_headers is None:
            raise RuntimeError("A transactional producer sends inside a transaction: call begin_transaction() first.")
        state = self._topics.get(topic)
        if state is None or time.monotonic() >= state.refresh_at:
            state = self._refresh(topic)
        with self._mutex:
            if self._closed:
                raise RuntimeError("Producer is closed")
            if self._buffered + size > self.buffer_bytes and threading.current_thread() is not self._resolver:
                self._wait_for_room(size)
            self._buffered += size
            lane_partition: int | None = None  # the gateway's choice
            if state.partitions is not None:
                if partition is not None:
                    lane_partition = partition
                elif k is not None:
                    lane_partition = state.key_partition(k)
                else:
                    lane_partition = state.sticky
            lane = state.lanes.get(lane_partition)
            if lane is None:
                lane = state.lanes[lane_partition] = _Lane(topic, lane_partition, self.producer_id)
            batch = lane.batch
            if batch is None:
                batch = lane.batch = _Batch(topic, time.monotonic())
                self._pending[lane] = None
            index = len(batch.values)
            batch.values.append(v)
            batch.keys.append(k)
            if partition is not None and lane.partition is None:
                batch.partitions[index] = partition
            if timestamp_ms is not None:
                batch.timestamps[index] = timestamp_ms
            if hs is not None:
                batch.headers[index] = hs
            batch.nbytes += size
            if callback is not None:
                batch.result.send_callbacks.append((index, callback))
            if len(batch.values) >= self.batch_size or batch.nbytes >= self.batch_bytes:
                lane.batch = None  # full: it goes as it is, the next send starts another
                lane.full.append(batch)
                state.moved_on(lane)
                self._lock.notify_all()  # the senders (a flush or a blocked send may wait here too)
            elif index == 0:
                self._lock.notify_all()
        return RecordFuture(batch.result, index)

    def _refresh(self, topic: str) -> _Topic:
        """Read `topic`'s partition count from the gateway (at most max_block_ms; any failure
        leaves it unknown, and the gateway partitions the topic's records until it is read)."""
        partitions: int | None = None
        try:
            resp = self._http.get(f"/topics/{topic}", timeout=min(self.request_timeout, self.max_block_s))
            if resp.status_code == 200:
                partitions = int(resp.json()["partitions"]) or None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        now = time.monotonic()
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                state = self._topics[topic] = _Topic(partitions, now)
            elif partitions is not None and partitions != state.partitions:
                unplaced = state.lanes.get(None)
                if unplaced is None or not (unplaced.busy or unplaced in self._pending):
                    # (records the gateway places go first: a key's records keep their order)
                    state.partitions = partitions
                    state.keys.clear()
                    state.sticky %= partitions
            known = state.partitions is not None
            state.refresh_at = now + (self.metadata_max_age_s if known else UNKNOWN_RETRY_S)
        return state

    def _check_running(self) -> None:
        """Raises: RuntimeError when a sending or the callback thread is gone (what is queued
        would not all be sent or answered any more)."""
        if not self._closed and self._stopped:
            raise RuntimeError("The producer's sending thread stopped (see the log); make a new Producer.")

    def _watched(self, body: Callable[[], None]) -> Callable[[], None]:
        """A thread's body that marks the producer stopped when it ends (`_check_running`)."""

        def run() -> None:
            try:
                body()
            finally:
                self._stopped = True

        return run

    def _wait_for_room(self, size: int) -> None:
        """Under the lock: wait until `size` more bytes fit the buffer (woken as acks free bytes).
        Raises: TimeoutError after max_block_ms, RuntimeError when the producer closes."""
        deadline = time.monotonic() + self.max_block_s
        self._due_now()  # its acks make the room
        while self._buffered + size > self.buffer_bytes:
            if self._closed:
                raise RuntimeError("Producer is closed")
            self._check_running()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"The producer's buffer ({self.buffer_bytes} bytes) stayed full for max_block_ms: the "
                    "gateway acknowledges more slowly than records are sent. Send less, or raise "
                    "buffer_bytes or max_block_ms."
                )
            self._lock.wait(remaining)

    def _due_now(self) -> None:
        """Under the lock: every batch being filled goes with its lane's next request."""
        for lane in self._pending:
            if lane.batch is not None:
                lane.batch.first = 0.0
        self._lock.notify_all()

    def _take(self, now: float) -> tuple[_Lane, list[_Batch]] | None:
        """Under the lock: the next request, from the oldest lane that has none in flight and a
        batch to send (full, or lingered): its full batches in order, then the one being filled
        if it is due, up to max_request_bytes. None: nothing to send yet."""
        for lane in self._pending:
            if lane.busy:
                continue
            batch = lane.batch
            due = batch is not None and (self._closed or now - batch.first >= self.linger_s)
            if not lane.full and not due:
                continue
            request: list[_Batch] = []
            size = 0
            while lane.full and (not request or size + lane.full[0].nbytes <= self.max_request_bytes):
                size += lane.full[0].nbytes
                request.append(lane.full.pop(0))
            if (
                due
                and not lane.full
                and batch is not None
                and (not request or size + batch.nbytes <= self.max_request_bytes)
            ):
                request.append(batch)
                lane.batch = None
                self._topics[lane.topic].moved_on(lane)
            if not lane.full and lane.batch is None:
                del self._pending[lane]
            return lane, request
        return None

    def _wait_s(self, now: float) -> float | None:
        """Under the lock: how long until a lane that could send has a batch due (None: until
        woken: a send, a lane's answer, a flush, close)."""
        waits = [
            lane.batch.first + self.linger_s - now for lane in self._pending if not lane.busy and lane.batch is not None
        ]
        return max(0.0005, min(waits)) if waits else None

    def _dispatch(self) -> None:
        """Take each request as its lane can go (its batch full or lingered, none of its own in
        flight), and hand it to the senders; when closed and nothing is left, stop them."""
        with self._lock:
            while True:
                while (taken := self._take(time.monotonic())) is not None:
                    lane, request = taken
                    lane.busy = True
                    self._in_flight += len(request)
                    self._requests.put((lane, request, lane.sequence))
                    lane.sequence += 1
                if self._closed and not self._pending:
                    break
                self._lock.wait(self._wait_s(time.monotonic()))
        for _ in self._senders:
            self._requests.put(None)

    def _send_loop(self) -> None:
        while (item := self._requests.get()) is not None:
            lane, request, sequence = item
            try:
                error = self._send_batches(lane, request, sequence)
            except BaseException as exc:  # the request fails; the producer goes on
                log.exception("producing to %s failed", lane.topic)
                error = exc
            self._answered.put((request, error))  # before the lane's next request: answers in order
            with self._lock:
                lane.busy = False
                if lane in self._pending:
                    self._lock.notify_all()  # the dispatcher: the lane may go again
        with self._lock:
            self._senders_left -= 1
            if self._senders_left == 0:
                self._answered.put(None)  # after every answer: the callback thread ends

    def _resolve_answers(self) -> None:
        while (answered := self._answered.get()) is not None:
            request, error = answered
            for batch in request:
                self._resolve(batch.result, error)
            with self._lock:
                self._in_flight -= len(request)
                self._buffered -= sum(b.nbytes for b in request)
                self._lock.notify_all()

    def _send_batches(self, lane: _Lane, batches: list[_Batch], sequence: int) -> BaseException | None:
        """One produce request of `batches` (one lane's), retried with the same sequence; the
        batches' results are set, and the last error returned."""
        body = _Batch.to_arrow(batches, lane.partition)
        headers = {"Content-Type": _ARROW, "Producer-Id": lane.producer_id, "Producer-Sequence": str(sequence)}
        if self._txn_headers is not None:
            headers |= self._txn_headers
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        error: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.post(
                    f"/topics/{lane.topic}/records", params={"record_offsets": "true"}, content=body, headers=headers
                )
                raise_for_error(resp)
                data = resp.json()
                dead = {d["index"]: data["dead_letter_topic"] for d in data.get("dead_letters", ())}
                start = 0
                for batch in batches:
                    result, end = batch.result, start + len(batch)
                    result.partitions = data["record_partitions"][start:end]
                    result.offsets = data["record_offsets"][start:end]
                    result.dead_letters = {i - start: t for i, t in dead.items() if start <= i < end}
                    start = end
                error = None
                break
            except TopiclakeClientError as exc:
                error = exc
                if not exc.retriable:
                    break
            except httpx.TransportError as exc:  # timeouts, resets: safe to retry (idempotent)
                error = exc
            time.sleep(self.retry_backoff_s * (2 ** min(attempt, 6)) * random.uniform(0.5, 1.0))
        return error

    def _resolve(self, result: _BatchResult, error: BaseException | None) -> None:
        if error is not None and self._txn_headers is not None and self._txn_failed is None:
            self._txn_failed = error  # the open transaction cannot commit
        result.error = error
        with _CALLBACKS_LOCK:
            result.done.set()
            callbacks, result.callbacks = result.callbacks, []
        for index, fn in callbacks:
            _call(fn, RecordFuture(result, index))
        failure = None if error is None else error if isinstance(error, Exception) else RuntimeError(str(error))
        for index, send_cb in result.send_callbacks:
            if failure is None:
                _call(send_cb, result.metadata(index), None)
            else:
                _call(send_cb, None, failure)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait for the answers (and their callbacks). Raises:
        TimeoutError; RuntimeError from a callback (it would wait for itself)."""
        if threading.current_thread() is self._resolver:
            raise RuntimeError("flush() cannot be called from a send callback: it would wait for that callback.")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._due_now()
            while self._pending or self._in_flight:  # woken when a request is answered
                self._check_running()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("flush timed out")
                self._lock.wait(remaining)

    # -- transactions ----------------------------------------------------------------------------
    def _transaction_call(self, action: str, body: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        assert self.transactional_id is not None
        path = f"/transactions/{urllib.parse.quote(self.transactional_id, safe='')}/{action}"
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.post(path, json=body, timeout=timeout or self.request_timeout)
                raise_for_error(resp)
                return dict(resp.json())
            except TopiclakeClientError as exc:
                if not exc.retriable or attempt == self.retries:
                    raise
            except httpx.TransportError:  # the call is safe to repeat (a decision is answered again)
                if attempt == self.retries:
                    raise
            time.sleep(self.retry_backoff_s * (2 ** min(attempt, 6)) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def _producer_body(self) -> dict[str, int]:
        if self.transactional_id is None or self._txn_producer is None:
            raise RuntimeError("Call init_transactions() first (a Producer made with transactional_id).")
        return {"producer_id": self._txn_producer[0], "producer_epoch": self._txn_producer[1]}

    def init_transactions(self, timeout: float | None = None) -> None:
        """Become the transactional id's producer (POST /transactions/{id}/init): a transaction the
        id left open is aborted, and older producers of the id are fenced. Raises:
        TopiclakeClientError, RuntimeError (no transactional_id)."""
        if self.transactional_id is None:
            raise RuntimeError("init_transactions() needs a Producer made with transactional_id.")
        answer = self._transaction_call("init", {"timeout_ms": self.transaction_timeout_ms}, timeout)
        self._txn_producer = (int(answer["producer_id"]), int(answer["producer_epoch"]))

    def begin_transaction(self) -> None:
        """Begin a transaction: the records sent until commit or abort belong to it."""
        self._producer_body()
        if self._txn_headers is not None:
            raise RuntimeError("A transaction is already open: commit or abort it first.")
        assert self.transactional_id is not None and self._txn_producer is not None
        self._txn_failed = None
        self._txn_headers = {
            "Transactional-Id": self.transactional_id,
            "Transactional-Producer": f"{self._txn_producer[0]}.{self._txn_producer[1]}",
        }

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[tuple[str, int], int],
        group: str,
        *,
        member_id: str | None = None,
        generation: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Commit a group's offsets ((topic, partition) -> the next offset to consume) with the open
        transaction; with `member_id` and `generation` the member is checked as for a commit."""
        if self._txn_headers is None:
            raise RuntimeError("No transaction is open: call begin_transaction() first.")
        body: dict[str, Any] = {
            **self._producer_body(),
            "group": group,
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()],
        }
        if member_id is not None:
            body["member_id"] = member_id
        if generation is not None:
            body["generation"] = generation
        self._transaction_call("offsets", body, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Send what is queued, then commit: every record and offset of the transaction becomes
        visible at once. Raises: TopiclakeClientError (a send of the transaction failed: abort it;
        or the commit was refused, e.g. 409 PRODUCER_FENCED), TimeoutError."""
        if self._txn_headers is None:
            raise RuntimeError("No transaction is open: call begin_transaction() first.")
        self.flush(timeout)
        if self._txn_failed is not None:
            raise TopiclakeClientError(
                409,
                "TRANSACTION_ABORTABLE",
                f"A record of this transaction was not sent ({self._txn_failed}); abort it.",
            ) from self._txn_failed
        self._transaction_call("commit", self._producer_body(), timeout)
        self._txn_headers = None

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Wait for what was sent, then abort: none of the transaction's records or offsets ever
        becomes visible."""
        if self._txn_headers is None:
            raise RuntimeError("No transaction is open: call begin_transaction() first.")
        self.flush(timeout)
        self._transaction_call("abort", self._producer_body(), timeout)
        self._txn_headers = None

    def close(self, timeout: float | None = None) -> None:
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for thread in (self._dispatcher, *self._senders, self._resolver):
            thread.join(timeout)
        if not any(t.is_alive() for t in self._senders):  # else a request is still out: the client stays open for it
            self._http.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
