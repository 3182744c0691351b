"""The consumer API as users meet it: a real `topiclake serve` process."""

import json
import threading
import time

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from tests.e2e.server import ServerProcess

ARROW = "application/vnd.apache.arrow.stream"


def produce(http, topic, n, partition=0, start=0):
    r = http.post(
        f"/topics/{topic}/records",
        json={"records": [{"value": {"n": i}, "partition": partition} for i in range(start, start + n)]},
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_fetch_json_and_arrow(http, topic):
    produce(http, topic, 10)
    r = http.get(
        f"/topics/{topic}/partitions/0/records", params={"offset": 3, "max_records": 4, "value_format": "json"}
    )
    body = r.json()
    assert [x["offset"] for x in body["records"]] == [3, 4, 5, 6]
    assert [x["value"] for x in body["records"]] == [{"n": i} for i in range(3, 7)]
    assert body["next_offset"] == 7 and body["high_watermark"] == 10 and body["log_start_offset"] == 0
    r = http.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0}, headers={"Accept": ARROW})
    table = ipc.open_stream(pa.BufferReader(r.content)).read_all()
    assert table.column("offset").to_pylist() == list(range(10))
    assert table.schema.names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert r.headers["X-Next-Offset"] == "10"


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"offset": 11}, 416, "OFFSET_OUT_OF_RANGE"),
        ({"offset": -1}, 400, "INVALID_OFFSET"),
        ({"offset": "abc"}, 422, "INVALID_REQUEST"),
        ({}, 422, "INVALID_REQUEST"),
        ({"offset": 0, "max_records": 0}, 400, "INVALID_OFFSET"),
        ({"offset": 0, "max_records": 10**9}, 400, "INVALID_OFFSET"),
        ({"offset": 0, "max_wait_ms": -5}, 400, "INVALID_OFFSET"),
        ({"offset": 0, "value_format": "xml"}, 400, "MALFORMED_REQUEST"),
    ],
)
def test_bad_fetches(http, topic, params, status, code):
    produce(http, topic, 10)
    r = http.get(f"/topics/{topic}/partitions/0/records", params=params)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    if code == "OFFSET_OUT_OF_RANGE":
        assert r.json()["error"]["details"]["high_watermark"] == 10
        assert r.json()["error"]["details"]["log_start_offset"] == 0


def test_unknown_topic_and_partition(http, topic):
    assert (
        http.get("/topics/nope/partitions/0/records", params={"offset": 0}).json()["error"]["code"] == "UNKNOWN_TOPIC"
    )
    r = http.get(f"/topics/{topic}/partitions/9/records", params={"offset": 0})
    assert r.status_code == 404 and r.json()["error"]["code"] == "UNKNOWN_PARTITION"


def test_long_poll_wakes_on_commit(http, server, topic):
    produce(http, topic, 2)
    timer = threading.Timer(0.3, lambda: produce(httpx.Client(base_url=server.url), topic, 1, start=2))
    t0 = time.monotonic()
    timer.start()
    r = http.get(f"/topics/{topic}/partitions/0/records", params={"offset": 2, "max_wait_ms": 10_000})
    elapsed = time.monotonic() - t0
    assert [x["offset"] for x in r.json()["records"]] == [2]
    assert 0.25 < elapsed < 3.0  # woke by the commit, long before max_wait
    t0 = time.monotonic()
    r = http.get(f"/topics/{topic}/partitions/0/records", params={"offset": 3, "max_wait_ms": 300})
    assert r.json()["records"] == [] and time.monotonic() - t0 >= 0.29


def test_waiting_fetches_and_streams_wake_on_another_process_commits(server, topic, tmp_path):
    """A second gateway on the same root writes; this one's long-poll and SSE stream, asleep on
    its commit notifier, are woken by its per-topic watcher of the Delta log."""
    other = ServerProcess(server.root, env={"TOPICLAKE_SERVER__GROUPS_SYNC_INTERVAL_S": "1"}).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http, httpx.Client(base_url=other.url, timeout=30) as w:
            start = http.get(f"/topics/{topic}/offsets", params={"at": "latest"}).json()["partitions"][0]["offset"]
            threading.Timer(0.5, lambda: produce(w, topic, 1, start=100)).start()
            t0 = time.monotonic()
            r = http.get(f"/topics/{topic}/partitions/0/records", params={"offset": start, "max_wait_ms": 20_000})
            assert [x["offset"] for x in r.json()["records"]] == [start]
            assert time.monotonic() - t0 < 5.0  # the watcher's interval, not max_wait_ms
            with httpx.stream(
                "GET",
                f"{server.url}/topics/{topic}/partitions/0/stream",
                params={"offset": start + 1, "value_format": "json"},
                timeout=20,
            ) as resp:
                threading.Timer(0.5, lambda: produce(w, topic, 1, start=101)).start()
                for line in resp.iter_lines():
                    if line.startswith("data: ") and "value" in line:
                        assert json.loads(line[6:])["value"] == {"n": 101}
                        break
    finally:
        other.stop()


def test_offset_lookup(http, topic):
    produce(http, topic, 3)
    time.sleep(0.02)
    mid = int(time.time() * 1000)
    time.sleep(0.02)
    produce(http, topic, 2, start=3)

    def offs(at):
        return {
            p["partition"]: p["offset"]
            for p in http.get(f"/topics/{topic}/offsets", params={"at": at}).json()["partitions"]
        }

    assert offs("earliest")[0] == 0 and offs("latest")[0] == 5 and offs(str(mid))[0] == 3
    assert offs(str(mid + 10**8))[0] == 5  # after every record: the high watermark
    assert http.get(f"/topics/{topic}/offsets", params={"at": "soon"}).status_code == 400


def test_sse_push_and_resume(http, server, topic):
    produce(http, topic, 3)
    got = []
    with httpx.stream(
        "GET",
        f"{server.url}/topics/{topic}/partitions/0/stream",
        params={"offset": 1, "value_format": "json"},
        timeout=10,
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        threading.Timer(0.3, lambda: produce(httpx.Client(base_url=server.url), topic, 2, start=3)).start()
        event_id = None
        lines = resp.iter_lines()
        assert next(lines) == "event: position" and json.loads(next(lines)[6:]) == {"offset": 1, "high_watermark": 3}
        for line in lines:
            if line.startswith("id: "):
                event_id = int(line[4:])
            if line.startswith("data: "):
                rec = json.loads(line[6:])
                assert rec["offset"] == event_id
                got.append(rec["value"]["n"])
                if len(got) == 4:
                    break
    assert got == [1, 2, 3, 4]
    with httpx.stream(
        "GET", f"{server.url}/topics/{topic}/partitions/0/stream", headers={"Last-Event-ID": "3"}, timeout=10
    ) as resp:
        for line in resp.iter_lines():
            if line.startswith("id: "):
                assert int(line[4:]) == 4  # resumes after the last event seen
                break


def join(http, group, topics, **kw):
    r = http.post(f"/groups/{group}/members", json={"topics": topics, "session_timeout_ms": 3000, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_group_fencing_zombie_commit_refused(http, topic):
    a = join(http, "fence", [topic])
    assert a["assignment"] == {topic: [0, 1, 2]} and a["generation"] == 1
    ok = http.post(
        "/groups/fence/offsets",
        json={"member_id": a["member_id"], "generation": 1, "offsets": [{"topic": topic, "partition": 0, "offset": 5}]},
    )
    assert ok.status_code == 200
    # a second member joins: a rebalance; a's heartbeat says so, a rejoins
    result = {}
    t = threading.Thread(
        target=lambda: result.setdefault("b", join(httpx.Client(base_url=str(http.base_url)), "fence", [topic]))
    )
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        hb = http.post(f"/groups/fence/members/{a['member_id']}/heartbeat", json={"generation": 1}).json()
        if hb["rebalance"]:
            break
        time.sleep(0.05)
    a2 = join(http, "fence", [topic], member_id=a["member_id"])
    t.join()
    b = result["b"]
    assert a2["generation"] == b["generation"] == 2
    owned = sorted(a2["assignment"].get(topic, []) + b["assignment"].get(topic, []))
    assert owned == [0, 1, 2] and not set(a2["assignment"].get(topic, [])) & set(b["assignment"].get(topic, []))
    # the zombie: generation 1 is fenced, and so is a commit for a partition a no longer owns
    z = http.post(
        "/groups/fence/offsets",
        json={
            "member_id": a["member_id"],
            "generation": 1,
            "offsets": [{"topic": topic, "partition": 0, "offset": 99}],
        },
    )
    assert z.status_code == 409 and z.json()["error"]["code"] == "FENCED_MEMBER"
    not_mine = next(p for p in range(3) if p not in a2["assignment"].get(topic, []))
    z = http.post(
        "/groups/fence/offsets",
        json={
            "member_id": a["member_id"],
            "generation": 2,
            "offsets": [{"topic": topic, "partition": not_mine, "offset": 99}],
        },
    )
    assert z.status_code == 409
    committed = {(o["topic"], o["partition"]): o["offset"] for o in http.get("/groups/fence/offsets").json()["offsets"]}
    assert committed == {(topic, 0): 5}  # unchanged by the zombie
    # standalone commits are refused while the group has members
    assert (
        http.post(
            "/groups/fence/offsets", json={"offsets": [{"topic": topic, "partition": 0, "offset": 1}]}
        ).status_code
        == 409
    )
    # reset is refused while members are active
    r = http.post("/groups/fence/offsets/reset", json={"topic": topic, "to": "earliest"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "GROUP_NOT_EMPTY"
    assert http.delete(f"/groups/fence/members/{a['member_id']}").status_code == 204


def test_group_bad_input(http, topic):
    assert (
        http.post("/groups/g1/members", json={"topics": [topic], "assignor": "magic"}).json()["error"]["code"]
        == "UNKNOWN_ASSIGNOR"
    )
    assert http.post("/groups/g1/members", json={"topics": ["no-such-topic"]}).status_code == 404
    assert http.post("/groups/g1/members", json={"topics": [topic], "session_timeout_ms": 10}).status_code == 400
    assert http.post("/groups/g1/members", json={"topics": []}).status_code == 400
    r = http.post("/groups/nope/members/m1/heartbeat", json={"generation": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "UNKNOWN_GROUP"
    join(http, "g2", [topic])
    r = http.post("/groups/g2/members/ghost/heartbeat", json={"generation": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "UNKNOWN_MEMBER"
    r = http.post(
        "/groups/g2/offsets",
        json={"member_id": "ghost", "generation": 1, "offsets": [{"topic": topic, "partition": 0, "offset": 1}]},
    )
    assert r.json()["error"]["code"] == "UNKNOWN_MEMBER"
    r = http.post("/groups/g3/offsets", json={"offsets": [{"topic": topic, "partition": 0, "offset": -1}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_OFFSET"
    assert http.get("/groups/never-seen").status_code == 404


def test_reset_and_describe_lag(http, topic):
    produce(http, topic, 8)
    r = http.post("/groups/rst/offsets/reset", json={"topic": topic, "to": "offset", "offset": 3, "partitions": [0]})
    assert r.status_code == 200
    d = http.get("/groups/rst").json()
    lag0 = next(x for x in d["lag"] if x["partition"] == 0)
    assert lag0 == {
        "topic": topic,
        "partition": 0,
        "committed_offset": 3,
        "high_watermark": 8,
        "log_start_offset": 0,
        "lag": 5,
    }
    http.post("/groups/rst/offsets/reset", json={"topic": topic, "to": "latest"})
    assert all(x["lag"] == 0 for x in http.get("/groups/rst").json()["lag"])
    r = http.post("/groups/rst/offsets/reset", json={"topic": topic, "to": "offset", "offset": 99, "partitions": [0]})
    assert r.status_code == 400
    assert "rst" in [g["group"] for g in http.get("/groups").json()["groups"]]


def test_groups_and_offsets_survive_restart(tmp_path):
    srv = ServerProcess(tmp_path / "data").start()
    try:
        c = httpx.Client(base_url=srv.url)
        c.post("/topics", json={"name": "r", "partitions": 2}).raise_for_status()
        a = c.post(
            "/groups/keep/members", json={"topics": ["r"], "session_timeout_ms": 30000, "instance_id": "worker-1"}
        ).json()
        c.post(
            "/groups/keep/offsets",
            json={
                "member_id": a["member_id"],
                "generation": a["generation"],
                "offsets": [{"topic": "r", "partition": 1, "offset": 4}],
            },
        ).raise_for_status()
    finally:
        srv.kill9()
    srv2 = ServerProcess(tmp_path / "data", port=srv.port).start()
    try:
        c = httpx.Client(base_url=srv2.url)
        d = c.get("/groups/keep").json()
        assert d["generation"] == a["generation"] and d["members"][0]["member_id"] == a["member_id"]
        assert c.get("/groups/keep/offsets").json()["offsets"] == [
            {"topic": "r", "partition": 1, "offset": 4, "metadata": ""}
        ]
        # the restarted static member takes its instance over within its session: same generation
        # and partitions, under a new member id (Kafka's KIP-345); the old id is fenced
        again = c.post(
            "/groups/keep/members", json={"topics": ["r"], "session_timeout_ms": 30000, "instance_id": "worker-1"}
        ).json()
        assert again["member_id"] != a["member_id"] and again["generation"] == a["generation"]
        assert again["assignment"] == a["assignment"]
        stale = {
            "member_id": a["member_id"],
            "generation": a["generation"],
            "offsets": [{"topic": "r", "partition": 1, "offset": 5}],
        }
        assert c.post("/groups/keep/offsets", json=stale).status_code == 404
        fresh = {**stale, "member_id": again["member_id"]}
        assert c.post("/groups/keep/offsets", json=fresh).status_code == 200
    finally:
        srv2.stop()


def test_lag_history_travels_the_offsets_table_and_the_topic(http):
    """GET /groups/{g}/lag-history: the lag at past moments, from Delta time travel of the offsets
    table (what the group had committed then) and of the topic (its high watermark then)."""
    assert http.post("/topics", json={"name": "lag-history", "partitions": 1}).status_code == 201

    def produce(n):
        r = http.post("/topics/lag-history/records", json={"records": [{"value": i} for i in range(n)]})
        assert r.status_code == 200

    def now_ms():
        time.sleep(0.05)  # commits a few ms apart: each moment falls between two versions
        stamp = int(time.time() * 1000)
        time.sleep(0.05)
        return stamp

    m = join(http, "lagging", ["lag-history"])

    def commit(offset):
        body = {
            "member_id": m["member_id"],
            "generation": m["generation"],
            "offsets": [{"topic": "lag-history", "partition": 0, "offset": offset}],
        }
        assert http.post("/groups/lagging/offsets", json=body).status_code == 200

    produce(10)
    commit(2)
    first = now_ms()  # committed 2 of 10
    produce(10)
    commit(15)
    second = now_ms()  # committed 15 of 20
    r = http.get("/groups/lagging/lag-history", params={"since_ms": first, "until_ms": second, "points": 2})
    assert r.status_code == 200, r.text
    points = r.json()["points"]
    assert [p["at_ms"] for p in points] == [first, second]
    assert [
        (p["lag"], p["partitions"][0]["committed_offset"], p["partitions"][0]["high_watermark"]) for p in points
    ] == [
        (8, 2, 10),
        (5, 15, 20),
    ]
    # before the group committed anything: no partitions, and no lag (not 0: there was no group to lag)
    early = http.get("/groups/lagging/lag-history", params={"since_ms": 1, "until_ms": 2, "points": 1}).json()
    assert early["points"] == [{"at_ms": 2, "lag": None, "partitions": []}]
    bad = http.get("/groups/lagging/lag-history", params={"since_ms": second, "until_ms": first})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_OFFSET"
    assert http.get("/groups/no-such-group/lag-history").status_code == 404
    http.delete(f"/groups/lagging/members/{m['member_id']}")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/groups/strict/offsets/reset", {"to": "earliest", "partitions": [False]}),
        ("/groups/strict/offsets/reset", {"to": "offset", "offset": True}),
        ("/groups/strict/offsets/reset", {"to": "timestamp", "timestamp": "5"}),
        ("/groups/strict/members", {"session_timeout_ms": True}),
        ("/topics", {"name": "strict-bool", "partitions": True}),
    ],
)
def test_a_boolean_or_a_string_where_the_schema_says_integer_is_refused(http, topic, path, body):
    """JSON's true/false and "5" are not integers (pydantic's lax mode took them for 1/0/5): 422
    INVALID_REQUEST, and nothing is changed (found by schemathesis: a reset with partitions
    [false] reset partition 0)."""
    body = {"topic": topic, **body} if "offsets/reset" in path else body
    body = {"topics": [topic], **body} if path.endswith("/members") else body
    r = http.post(path, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "INVALID_REQUEST"
    assert http.get("/topics/strict-bool").status_code == 404
