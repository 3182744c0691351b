"""The gateway as users meet it: a real `topiclake serve` process on 127.0.0.1."""

import base64
import json
import threading

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from deltalake import DeltaTable

from tests.e2e.conftest import hw


def arrow_body(table):
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def rows(server, topic):
    t = DeltaTable(f"{server.root}/topics/{topic}").to_pyarrow_table()
    return t.sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()


def test_topic_admin_lifecycle(http):
    r = http.post("/topics", json={"name": "admin-t", "partitions": 2, "config": {"retention.ms": 1000}})
    assert r.status_code == 201 and r.json()["config"]["retention.ms"] == "1000"
    assert "admin-t" in http.get("/topics").json()["topics"]
    d = http.get("/topics/admin-t").json()
    assert d["partitions"] == 2 and [p["high_watermark"] for p in d["partition_offsets"]] == [0, 0]
    r = http.patch("/topics/admin-t/config", json={"config": {"cleanup.policy": "compact", "retention.ms": None}})
    assert r.json()["config"]["cleanup.policy"] == "compact" and r.json()["config"]["retention.ms"] == "604800000"
    assert http.post("/topics/admin-t/partitions", json={"count": 4}).json()["partitions"] == 4
    r = http.post("/topics/admin-t/partitions", json={"count": 3})
    assert r.status_code == 409 and r.json()["error"]["code"] == "INVALID_PARTITIONS"
    r = http.post("/topics", json={"name": "admin-t"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "TOPIC_ALREADY_EXISTS"
    assert http.delete("/topics/admin-t").status_code == 204
    assert http.get("/topics/admin-t").status_code == 404
    assert http.delete("/topics/admin-t").json()["error"]["code"] == "UNKNOWN_TOPIC"


def test_throughput_is_the_topics_delta_history(http):
    """GET /topics/{t}/throughput: the latest appends, from the table's history (each topic
    writer's commit says what it appended), oldest first."""
    assert http.post("/topics", json={"name": "tput", "partitions": 2}).status_code == 201
    for n in (3, 4, 5):
        assert http.post("/topics/tput/records", json={"records": [{"value": i} for i in range(n)]}).status_code == 200
    commits = http.get("/topics/tput/throughput").json()["commits"]
    assert sum(c["records"] for c in commits) == 12 and all(c["bytes"] > 0 for c in commits)
    assert [c["at_ms"] for c in commits] == sorted(c["at_ms"] for c in commits)
    assert len(http.get("/topics/tput/throughput", params={"commits": 1}).json()["commits"]) == 1
    assert http.get("/topics/tput/throughput", params={"commits": 0}).status_code == 422
    assert http.get("/topics/no-such-topic/throughput").status_code == 404


def test_topic_list_pages_and_search(http):
    """GET /topics pages by name (`limit`, then `after` = the page's `next`) and filters by a
    substring, server-side: a console with 10,000 topics asks for one page at a time."""
    names = [f"page-{c}-{i}" for c in "ab" for i in range(3)]
    for name in names:
        assert http.post("/topics", json={"name": name}).status_code == 201
    first = http.get("/topics", params={"search": "PAGE-", "limit": 4}).json()
    assert first == {"topics": names[:4], "next": names[3]}
    rest = http.get("/topics", params={"search": "page-", "limit": 4, "after": first["next"]}).json()
    assert rest == {"topics": names[4:]}  # the last page has no `next`
    assert http.get("/topics", params={"search": "page-b"}).json()["topics"] == names[3:]
    assert http.get("/topics", params={"limit": 0}).status_code == 422


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"name": "bad name"}, 400, "INVALID_TOPIC"),
        ({"name": "x" * 250}, 400, "INVALID_TOPIC"),
        ({"name": "ok1", "partitions": 0}, 400, "INVALID_PARTITIONS"),
        ({"name": "ok2", "config": {"retention.ms": "soon"}}, 400, "INVALID_CONFIG"),
        ({"name": "ok3", "config": {"no.such": 1}}, 400, "INVALID_CONFIG"),
        ({"partitions": 1}, 422, "INVALID_REQUEST"),
    ],
)
def test_bad_topic_creation(http, body, status, code):
    r = http.post("/topics", json=body)
    assert r.status_code == status and r.json()["error"]["code"] == code
    assert r.json()["error"]["message"]
    assert body.get("name") not in http.get("/topics").json()["topics"]


def test_produce_json_per_record_offsets(http, server, topic):
    r = http.post(
        f"/topics/{topic}/records",
        json={
            "records": [
                {"value": {"n": 0}, "partition": 0},
                {"value": {"n": 1}, "partition": 0, "headers": {"h": "v"}},
                {"value": {"n": 2}, "partition": 2, "timestamp": 1_700_000_000_000},
            ]
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["offsets"] == [
        {"partition": 0, "offset": 0},
        {"partition": 0, "offset": 1},
        {"partition": 2, "offset": 0},
    ]
    stored = rows(server, topic)
    assert [json.loads(x["value"]) for x in stored] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert stored[1]["headers"] == [{"key": "h", "value": b"v"}]
    assert stored[2]["timestampType"] == 0 and stored[0]["timestampType"] == 1
    assert stored[2]["timestamp"].timestamp() == 1_700_000_000


def test_value_formats(http, server, topic):
    http.post(f"/topics/{topic}/records?value_format=string", json={"records": [{"value": "plain", "partition": 1}]})
    http.post(
        f"/topics/{topic}/records",
        json={
            "value_format": "binary",
            "key_format": "binary",
            "records": [
                {
                    "key": base64.b64encode(b"\x01").decode(),
                    "value": base64.b64encode(b"\xff\x00").decode(),
                    "partition": 1,
                }
            ],
        },
    )
    assert [(x["key"], x["value"]) for x in rows(server, topic)] == [(None, b"plain"), (b"\x01", b"\xff\x00")]


def test_keys_land_where_kafka_puts_them(http, topic):
    # Kafka: toPositive(murmur2("foobar")) % 3, murmur2("foobar") = -790332482 (Kafka's UtilsTest)
    expected = (-790332482 & 0x7FFFFFFF) % 3
    r = http.post(f"/topics/{topic}/records", json={"records": [{"key": "foobar", "value": i} for i in range(5)]})
    assert {o["partition"] for o in r.json()["offsets"]} == {expected}
    assert [o["offset"] for o in r.json()["offsets"]] == [0, 1, 2, 3, 4]


def test_null_keys_are_sticky_per_request(http, topic):
    r = http.post(f"/topics/{topic}/records", json={"records": [{"value": i} for i in range(10)]})
    assert len({o["partition"] for o in r.json()["offsets"]}) == 1


def test_ndjson(http, topic):
    body = "\n".join(json.dumps({"value": i, "partition": 1}) for i in range(4)).encode()
    r = http.post(f"/topics/{topic}/records", content=body, headers={"Content-Type": "application/x-ndjson"})
    assert [o["offset"] for o in r.json()["offsets"]] == [0, 1, 2, 3]
    r = http.post(
        f"/topics/{topic}/records",
        content=b'{"value": 1}\n{oops\n',
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert r.status_code == 400 and r.json()["error"]["details"]["line"] == 2
    assert hw(http, topic)[1] == 4


def test_arrow_ipc(http, server, topic):
    t = pa.table(
        {
            "key": pa.array([None] * 6, pa.binary()),
            "value": [b"v%d" % i for i in range(6)],
            "partition": pa.array([0, 1, 1, 2, 2, 2], pa.int32()),
        }
    )
    r = http.post(
        f"/topics/{topic}/records",
        content=arrow_body(t),
        headers={"Content-Type": "application/vnd.apache.arrow.stream"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["partitions"] == [
        {"partition": 0, "base_offset": 0, "count": 1},
        {"partition": 1, "base_offset": 0, "count": 2},
        {"partition": 2, "base_offset": 0, "count": 3},
    ]
    assert r.json()["record_count"] == 6
    bad = pa.table({"value": [b"a"], "colour": ["red"]})
    r = http.post(
        f"/topics/{topic}/records",
        content=arrow_body(bad),
        headers={"Content-Type": "application/vnd.apache.arrow.stream"},
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_SCHEMA"
    assert len(rows(server, topic)) == 6


def test_idempotent_retry_never_duplicates(http, server, topic):
    headers = {"Producer-Id": "p1", "Producer-Sequence": "0"}
    body = {"records": [{"value": i, "partition": 0} for i in range(5)]}
    first = http.post(f"/topics/{topic}/records", json=body, headers=headers).json()
    again = http.post(f"/topics/{topic}/records", json=body, headers=headers).json()
    assert again["duplicate"] and again["offsets"] == first["offsets"] and not first["duplicate"]
    nxt = http.post(f"/topics/{topic}/records", json=body, headers={**headers, "Producer-Sequence": "1"}).json()
    assert not nxt["duplicate"]
    old = http.post(f"/topics/{topic}/records", json=body, headers=headers)
    assert old.status_code == 409 and old.json()["error"]["code"] == "DUPLICATE_SEQUENCE"  # older than the last
    ik = {"Idempotency-Key": "order-42"}
    a = http.post(f"/topics/{topic}/records", json=body, headers=ik).json()
    b = http.post(f"/topics/{topic}/records", json=body, headers=ik).json()
    assert b["duplicate"] and a["offsets"] == b["offsets"]
    assert len(rows(server, topic)) == 15


def test_concurrent_retries_of_one_request_write_once(http, server, topic):
    body = {"records": [{"value": i, "partition": 0} for i in range(3)]}
    headers = {"Producer-Id": "racer", "Producer-Sequence": "7"}
    results = []

    def go():
        import httpx

        results.append(httpx.post(f"{server.url}/topics/{topic}/records", json=body, headers=headers).json())

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({json.dumps(r["offsets"]) for r in results}) == 1
    assert hw(http, topic)[0] == 3


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({"json": {"records": [{"value": 1, "partition": 7}]}}, 404, "UNKNOWN_PARTITION"),
        ({"json": {"records": [{"value": 1, "partition": -1}]}}, 404, "UNKNOWN_PARTITION"),
        ({"json": {"records": [{"value": "x" * 2_000_000}]}}, 413, "RECORD_TOO_LARGE"),
        ({"content": b"{bad", "headers": {"Content-Type": "application/json"}}, 400, "MALFORMED_REQUEST"),
        ({"json": {"records": [{"value": 1}, {"nope": 1}]}}, 422, "INVALID_RECORD"),
        ({"json": {"records": []}}, 422, "INVALID_RECORD"),
        ({"content": b"x", "headers": {"Content-Type": "text/csv"}}, 415, "UNSUPPORTED_MEDIA_TYPE"),
        ({"json": {"records": [{"value": 1}]}, "headers": {"Producer-Id": "p"}}, 422, "INVALID_RECORD"),
        (
            {"json": {"records": [{"value": 1}]}, "headers": {"Producer-Id": "p", "Producer-Sequence": "x"}},
            422,
            "INVALID_RECORD",
        ),
    ],
)
@pytest.mark.parametrize("params", [{}, {"key_format": "string"}], ids=["queryless-route", "documented-route"])
def test_bad_produce_changes_nothing(http, server, topic, kwargs, status, code, params):
    """Both produce routes answer alike: a request without a query string is taken by
    QuerylessProduceRoute, one with any query parameter (here a default) by the documented route."""
    http.post(f"/topics/{topic}/records", json={"records": [{"value": 0, "partition": 0}]})
    before = hw(http, topic)
    r = http.post(f"/topics/{topic}/records", params=params, **kwargs)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    assert hw(http, topic) == before
    assert len(rows(server, topic)) == 1


def test_unknown_topic(http):
    r = http.post("/topics/missing/records", json={"records": [{"value": 1}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "UNKNOWN_TOPIC"
    assert "Create it first" in r.json()["error"]["message"]
    r = http.post("/topics/bad name!/records", json={"records": [{"value": 1}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_TOPIC"


def test_both_produce_routes_answer_alike(http, server, topic):
    """The same records with and without a query string (the queryless route and the documented
    one): the same answer but for the offsets, the same headers, the same stored records."""
    body = {"records": [{"key": "k", "value": {"n": 1}}, {"key": "j", "value": [1, 2]}]}
    plain = http.post(f"/topics/{topic}/records", json=body)
    documented = http.post(f"/topics/{topic}/records", params={"value_format": "json"}, json=body)
    assert plain.status_code == documented.status_code == 200
    assert plain.headers["content-type"] == documented.headers["content-type"] == "application/json"
    a, b = plain.json(), documented.json()
    assert [e["partition"] for e in a["offsets"]] == [e["partition"] for e in b["offsets"]]
    assert {k: v for k, v in a.items() if k != "offsets"} == {k: v for k, v in b.items() if k != "offsets"}
    stored = {(r["partition"], r["offset"]): (r["key"], r["value"]) for r in rows(server, topic)}
    pairs = [[stored[(e["partition"], e["offset"])] for e in answer["offsets"]] for answer in (a, b)]
    assert pairs[0] == pairs[1] == [(b"k", b'{"n":1}'), (b"j", b"[1,2]")]
    assert http.post(f"/topics/{topic}/records/", json=body).status_code in (307, 404)  # never the route


def test_ops_endpoints(http, topic):
    http.post(f"/topics/{topic}/records", json={"records": [{"value": 1}]})
    http.post("/topics/missing/records", json={"records": [{"value": 1}]})
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json()["status"] == "ready"
    text = http.get("/metrics").text
    assert f'topiclake_records_in_total{{topic="{topic}"}}' in text
    assert 'topiclake_errors_total{code="UNKNOWN_TOPIC"}' in text
    assert "topiclake_commit_latency_seconds_bucket" in text and "topiclake_queue_depth" in text
    docs = http.get("/docs")  # served whole by the gateway: no CDN (make setup fetched Swagger UI)
    assert docs.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in docs.text and "cdn" not in docs.text
    assert http.get("/docs/assets/swagger-ui-bundle.js").status_code == 200
    assert http.get("/redoc", follow_redirects=False).headers["location"] == "/docs"
    assert "/topics/{topic}/records" in http.get("/openapi.json").json()["paths"]
