"""Careless and hostile inputs against real server processes: a 4xx with the error envelope, nothing
written, the server healthy; a key on every route but the health checks."""

from __future__ import annotations

import io
import json
import socket
import time

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from tests.e2e.conftest import hw
from tests.e2e.server import ServerProcess

ARROW = "application/vnd.apache.arrow.stream"


def arrow_body(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def assert_refused(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"], err


def deep(n: int) -> str:
    return "[" * n + "]" * n


BAD_PRODUCE = [
    # (what, content type, body, status, code)
    (
        "json nested 100,000 deep",
        "application/json",
        '{"records": [{"value": ' + deep(100_000) + "}]}",
        400,
        "JSON_TOO_DEEP",
    ),
    ("ndjson nested 100,000 deep", "application/x-ndjson", '{"value": ' + deep(100_000) + "}\n", 400, "JSON_TOO_DEEP"),
    (
        "json nested just past the limit",
        "application/json",
        '{"records": [{"value": ' + deep(62) + "}]}",
        400,
        "JSON_TOO_DEEP",
    ),
    ("lone surrogate in a value", "application/json", '{"records": [{"value": "\\ud800"}]}', 422, "INVALID_RECORD"),
    (
        "lone surrogate in a key",
        "application/json",
        '{"records": [{"key": "\\ud800", "value": 1}]}',
        422,
        "INVALID_RECORD",
    ),
    (
        "lone surrogate in a header",
        "application/json",
        '{"records": [{"value": 1, "headers": {"h": "\\udfff"}}]}',
        422,
        "INVALID_RECORD",
    ),
    ("1e400 in a value", "application/json", '{"records": [{"value": {"x": 1e400}}]}', 422, "INVALID_RECORD"),
    ("NaN literal", "application/json", '{"records": [{"value": NaN}]}', 400, "MALFORMED_REQUEST"),
    (
        "timestamp 1e400",
        "application/json",
        '{"records": [{"value": 1, "timestamp": 1e400}]}',
        422,
        "INVALID_TIMESTAMP",
    ),
    (
        "timestamp year 10000",
        "application/json",
        '{"records": [{"value": 1, "timestamp": 253402300800000}]}',
        422,
        "INVALID_TIMESTAMP",
    ),
    (
        "timestamp before 1970",
        "application/json",
        '{"records": [{"value": 1, "timestamp": "1969-12-31T23:59:59Z"}]}',
        422,
        "INVALID_TIMESTAMP",
    ),
    (
        "negative timestamp",
        "application/json",
        '{"records": [{"value": 1, "timestamp": -5}]}',
        422,
        "INVALID_TIMESTAMP",
    ),
]


@pytest.mark.parametrize(("what", "ctype", "body", "status", "code"), BAD_PRODUCE, ids=[b[0] for b in BAD_PRODUCE])
def test_bad_produce_bodies_are_refused_and_write_nothing(http, topic, what, ctype, body, status, code):
    before = hw(http, topic)
    r = http.post(f"/topics/{topic}/records", content=body.encode(), headers={"content-type": ctype})
    assert_refused(r, status, code)
    assert hw(http, topic) == before
    assert http.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "column",
    [
        pa.array([2**62], pa.int64()),  # would wrap around when scaled to microseconds
        pa.array([-5], pa.int64()),
        pa.array([253402300800000], pa.int64()),  # 10000-01-01
        pa.array([-(2**62)], pa.timestamp("us", tz="UTC")),
    ],
)
def test_arrow_timestamps_outside_the_table_are_refused(http, topic, column):
    body = arrow_body(pa.table({"value": pa.array([b"v"]), "timestamp": column}))
    before = hw(http, topic)
    r = http.post(f"/topics/{topic}/records", content=body, headers={"content-type": ARROW})
    assert_refused(r, 422, "INVALID_TIMESTAMP")
    assert hw(http, topic) == before


def test_minus_one_means_the_servers_time(http, topic):
    r = http.post(f"/topics/{topic}/records", json={"records": [{"value": 1, "timestamp": -1, "partition": 0}]})
    assert r.status_code == 200, r.text
    got = http.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0}).json()["records"][0]
    assert got["timestamp"] > 1_600_000_000_000 and got["timestamp_type"] == 1


@pytest.mark.parametrize(
    ("headers", "code"),
    [({"Producer-Id": "p", "Producer-Sequence": str(2**70)}, "INVALID_RECORD")],
)
def test_out_of_range_sequences_are_refused(http, topic, headers, code):
    r = http.post(f"/topics/{topic}/records", json={"records": [{"value": 1}]}, headers=headers)
    assert_refused(r, 422, code)


@pytest.mark.parametrize(
    ("offsets", "status", "code"),
    [
        ([{"topic": "{topic}", "partition": 0, "offset": 2**63}], 400, "INVALID_OFFSET"),
        ([{"topic": "{topic}", "partition": 0, "offset": 1, "metadata": "x" * 8192}], 422, "INVALID_REQUEST"),
        ([{"topic": "no-such-topic", "partition": 0, "offset": 1}], 404, "UNKNOWN_TOPIC"),
        ([{"topic": "{topic}", "partition": 99, "offset": 1}], 404, "UNKNOWN_PARTITION"),
        ([{"topic": "{topic}", "partition": 2**40, "offset": 1}], 404, "UNKNOWN_PARTITION"),
    ],
)
def test_bad_offset_commits_are_refused(http, topic, offsets, status, code):
    group = f"g-{topic}"
    body = json.loads(json.dumps({"offsets": offsets}).replace("{topic}", topic))
    assert_refused(http.post(f"/groups/{group}/offsets", json=body), status, code)
    assert http.get(f"/groups/{group}/offsets").status_code == 404  # nothing was committed


def test_metadata_over_4096_utf8_bytes_is_refused(http, topic):
    body = {"offsets": [{"topic": topic, "partition": 0, "offset": 1, "metadata": "é" * 3000}]}  # 6000 bytes
    assert_refused(http.post(f"/groups/m-{topic}/offsets", json=body), 413, "OFFSET_METADATA_TOO_LARGE")


def test_joins_are_bounded_and_deduplicated(http, topic):
    big = http.post(f"/groups/j-{topic}/members", json={"topics": [topic], "instance_id": "i" * 100_000})
    assert_refused(big, 422, "INVALID_REQUEST")
    huge = http.post(f"/groups/j-{topic}/members", json={"topics": [topic], "instance_id": "i" * (1 << 20)})
    assert_refused(huge, 413, "REQUEST_TOO_LARGE")
    r = http.post(f"/groups/j-{topic}/members", json={"topics": [topic] * 1000, "session_timeout_ms": 5000})
    assert r.status_code == 200, r.text
    assert r.json()["assignment"] == {topic: [0, 1, 2]}
    http.delete(f"/groups/j-{topic}/members/{r.json()['member_id']}")


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("keyed")
    cfg = root / "auth.toml"
    cfg.write_text(
        '[[auth.api_keys]]\nkey = "ops-secret"\nprincipal = "ops"\nacls = { "*" = ["admin"] }\n'
        '[[auth.api_keys]]\nkey = "reader-secret"\nprincipal = "reader"\nacls = { "orders-*" = ["consume"] }\n'
    )
    srv = ServerProcess(root / "data", env={"TOPICLAKE_CONFIG": str(cfg)}).start()
    yield srv
    srv.stop()


OPEN = ["/healthz", "/readyz"]
KEYED = [
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/redoc"),
    ("GET", "/topics"),
    ("GET", "/groups"),
    ("GET", "/groups/any"),
    ("GET", "/groups/any/offsets"),
    ("POST", "/groups/any/members/someone/heartbeat"),
    ("DELETE", "/groups/any/members/someone"),
    ("GET", "/no-such-route"),
]


def test_only_health_checks_answer_without_a_key(keyed_server):
    with httpx.Client(base_url=keyed_server.url, timeout=30) as c:
        for path in OPEN:
            assert c.get(path).status_code == 200, path
        for method, path in KEYED:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = c.request(method, path, headers=headers, json={"generation": 1})
                assert_refused(r, 401, "UNAUTHENTICATED")
                assert r.headers.get("www-authenticate") == "Bearer"
        ok = {"Authorization": "Bearer ops-secret"}
        assert c.get("/metrics", headers=ok).status_code == 200
        assert c.get("/openapi.json", headers=ok).status_code == 200


# --- bounded resources ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tight_server(tmp_path_factory):
    """Small limits, so that tests reach them quickly."""
    root = tmp_path_factory.mktemp("tight")
    env = {
        "TOPICLAKE_SERVER__HEADER_TIMEOUT_S": "1",
        "TOPICLAKE_SERVER__MAX_CONNECTIONS_PER_CLIENT": "40",
        "TOPICLAKE_READER__MAX_FETCH_BYTES": "300000",
    }
    srv = ServerProcess(root / "data", env=env).start()
    yield srv
    srv.stop()


def _raw(srv: ServerProcess) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    return s


def test_every_route_refuses_a_body_over_its_limit_while_reading(tight_server):
    with httpx.Client(base_url=tight_server.url, timeout=30) as c:
        declared = c.post("/groups/g/offsets", content=b"{" + b" " * (2 << 20) + b"}")
        assert_refused(declared, 413, "REQUEST_TOO_LARGE")

        def chunks():  # no Content-Length: counted as it arrives, refused past the limit
            yield b'{"offsets": ['
            for _ in range(10_000):
                yield b" " * 1024

        chunked = c.post("/topics", content=chunks(), headers={"Content-Type": "application/json"})
        assert_refused(chunked, 413, "REQUEST_TOO_LARGE")
        assert c.get("/healthz").status_code == 200
        assert "g" not in [g["group"] for g in c.get("/groups").json()["groups"]]


def test_a_fetch_is_capped_at_a_record_boundary_never_refused(tight_server):
    with httpx.Client(base_url=tight_server.url, timeout=60) as c:
        assert c.post("/topics", json={"name": "big", "partitions": 1}).status_code == 201
        value = "v" * 100_000
        r = c.post("/topics/big/records?value_format=string", json={"records": [{"value": value}] * 8})
        assert r.status_code == 200, r.text
        got = c.get("/topics/big/partitions/0/records", params={"offset": 0, "max_bytes": 2**62, "max_records": 1000})
        assert got.status_code == 200, got.text
        records = got.json()["records"]
        assert 1 <= len(records) <= 3 and got.json()["next_offset"] == len(records)  # 300 kB cap, whole records
        one = c.get("/topics/big/partitions/0/records", params={"offset": 0, "max_bytes": 1})
        assert len(one.json()["records"]) == 1  # at least one record, even over the limit


def test_half_open_connections_are_closed_and_limited_per_client(tight_server):
    idle = [_raw(tight_server) for _ in range(40)]  # the per-client limit, none finishing its headers
    for s in idle:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    over = _raw(tight_server)
    answer = over.recv(4096)
    assert answer.startswith(b"HTTP/1.1 503") and b"TOO_MANY_CONNECTIONS" in answer, answer
    over.close()
    time.sleep(2.5)  # the 1 s header timeout has closed the half-open ones
    for s in idle:
        assert s.recv(10) == b""  # closed by the server
        s.close()
    ready = httpx.get(tight_server.url + "/readyz", timeout=10).json()
    assert ready["connections"] <= 1 and ready["refused_connections"] >= 1
    assert ready["open_files"]["soft"] == ready["open_files"]["hard"]


def test_a_kept_alive_connection_gets_the_header_timeout_for_its_next_request(tight_server):
    s = _raw(tight_server)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while not answer.endswith(b'"ok"}'):
        answer += s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200")
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # then never finishes
    s.settimeout(5)
    assert s.recv(10) == b""
    s.close()


def test_timestamps_outside_the_topics_window_are_refused_on_every_path(http):
    name = "window"
    r = http.post("/topics", json={"name": name, "config": {"message.timestamp.before.max.ms": "60000"}})
    assert r.status_code == 201, r.text
    now = int(time.time() * 1000)
    old, ahead = now - 3_600_000, now + 2 * 3_600_000  # before.max.ms 60 s; after.max.ms Kafka's 1 h
    for ts in (old, ahead):
        bodies = [
            ("application/json", json.dumps({"records": [{"value": 1}, {"value": 2, "timestamp": ts}]})),
            ("application/x-ndjson", json.dumps({"value": 1}) + "\n" + json.dumps({"value": 2, "timestamp": ts})),
            (ARROW, arrow_body(pa.table({"value": [b"a", b"b"], "timestamp": pa.array([now, ts], pa.int64())}))),
        ]
        for ctype, body in bodies:
            r = http.post(f"/topics/{name}/records", content=body, headers={"Content-Type": ctype})
            assert_refused(r, 422, "INVALID_TIMESTAMP")
            assert r.json()["error"]["details"]["index"] == 1, r.text
    assert hw(http, name) == {0: 0}  # nothing written
    ok = http.post(f"/topics/{name}/records", json={"records": [{"value": 1, "timestamp": now - 1000}, {"value": 2}]})
    assert ok.status_code == 200, ok.text
    assert (
        http.patch(f"/topics/{name}/config", json={"config": {"message.timestamp.before.max.ms": None}}).status_code
        == 200
    )
    assert http.post(f"/topics/{name}/records", json={"records": [{"value": 3, "timestamp": old}]}).status_code == 200


def test_writes_a_browser_sends_from_another_origin_are_refused(http, topic):
    """CSRF: what browsers mark as coming from another origin (Sec-Fetch-Site, else Origin against
    Host) may not write, with or without keys; reads, same-origin writes and clients outside a
    browser (neither header) are unaffected."""
    body = {"records": [{"value": "x"}]}
    for headers in (
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},  # another port of the same host is another origin
        {"origin": "http://evil.example"},
        {"origin": "null"},  # a sandboxed frame or a file
    ):
        r = http.post(f"/topics/{topic}/records", json=body, headers=headers)
        assert_refused(r, 403, "CROSS_SITE_REQUEST")
        assert "from this origin" in r.json()["error"]["message"]
    assert_refused(
        http.delete(f"/topics/{topic}", headers={"origin": "http://evil.example"}), 403, "CROSS_SITE_REQUEST"
    )
    assert sum(hw(http, topic).values()) == 0  # nothing written, nothing deleted
    same = {"origin": str(http.base_url).rstrip("/"), "sec-fetch-site": "same-origin"}
    assert http.post(f"/topics/{topic}/records", json=body, headers=same).status_code == 200
    assert http.post(f"/topics/{topic}/records", json=body).status_code == 200
    assert http.get(f"/topics/{topic}", headers={"sec-fetch-site": "cross-site"}).status_code == 200
    assert sum(hw(http, topic).values()) == 2


def test_a_loopback_server_answers_only_loopback_host_names(server, http):
    """DNS rebinding: a page that points its own name at 127.0.0.1 is refused by the Host it sends,
    health checks included; localhost and the address itself are served."""
    for name in ("evil.example", "evil.example:8080", "10.0.0.1"):
        r = http.get("/healthz", headers={"host": name})
        assert_refused(r, 400, "HOST_NOT_ALLOWED")
        assert "server.allowed_hosts" in r.json()["error"]["message"]
        assert_refused(http.post("/topics", json={"name": "rebound"}, headers={"host": name}), 400, "HOST_NOT_ALLOWED")
    assert "rebound" not in http.get("/topics").json()["topics"]
    assert http.get("/healthz", headers={"host": f"localhost:{server.port}"}).status_code == 200
    assert http.get("/healthz", headers={"host": f"127.0.0.1:{server.port}"}).status_code == 200
