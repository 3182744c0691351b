"""Several gateways on one root, started as users start them (`topiclake serve`, each its own
process on 127.0.0.1): membership in the root, one coordinator per group with forwarding, auth
kept across the hop, and a coordinator killed with kill -9 under a live group."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import signal
import threading
import time

import httpx
import pytest

from tests.e2e.server import ServerProcess
from topiclake import AdminClient, Consumer, Producer

pytestmark = pytest.mark.slow

# Fast, with room for a loaded 2-core machine: a gateway busy for a second (CI under load once
# dropped one out with 2 s) stays a member.
FAST_MEMBERSHIP = {
    "TOPICLAKE_CLUSTER__HEARTBEAT_INTERVAL_S": "0.5",
    "TOPICLAKE_CLUSTER__MEMBER_TIMEOUT_S": "5",
    "TOPICLAKE_SERVER__GROUPS_SYNC_INTERVAL_S": "0.5",
}
ADMIN = {"Authorization": "Bearer k-admin"}
KEYS = (
    '[[auth.api_keys]]\nkey = "k-admin"\nprincipal = "ops"\nacls = { "*" = ["admin"] }\ngroups = { "*" = ["admin"] }\n'
    '[[auth.api_keys]]\nkey = "k-app"\nprincipal = "app"\nacls = { "orders" = ["consume", "produce"] }\n'
    'groups = { "app-*" = ["read"] }\n'
)


def cluster_view(url: str) -> dict:
    return httpx.get(url + "/cluster", headers=ADMIN, timeout=10).json()


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    (root / "auth.toml").write_text(KEYS)
    env = {**FAST_MEMBERSHIP, "TOPICLAKE_CONFIG": str(root / "auth.toml")}
    servers = [ServerProcess(root / "data", env=env).start() for _ in range(3)]
    wait_for(lambda: all(len(cluster_view(s.url)["gateways"]) == 3 for s in servers), what="3 live gateways")
    with httpx.Client(base_url=servers[0].url, headers=ADMIN, timeout=30) as c:
        assert c.post("/topics", json={"name": "orders", "partitions": 6}).status_code == 201
    yield servers
    for s in servers:
        s.stop()


class Members:
    """Consumers of one group, each polling in its own thread (as separate applications do: a
    rebalance waits for every member to rejoin from its own poll loop)."""

    def __init__(self, consumers: list[Consumer], topic: str) -> None:
        self.consumers = consumers
        self.seen: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(c, topic), daemon=True) for c in consumers]
        for t in self._threads:
            t.start()

    def _run(self, c: Consumer, topic: str) -> None:
        c.subscribe([topic])
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.seen.extend(r.offset for r in c.poll(0.2))

    def stable(self, partitions: int) -> bool:
        gens = {c.generation for c in self.consumers}
        parts = [p for c in self.consumers for _, p in c.assignment()]
        return len(gens) == 1 and sorted(parts) == list(range(partitions))

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        for c in self.consumers:
            with contextlib.suppress(Exception):
                c.close()


def owner_of(servers: list[ServerProcess], group: str) -> ServerProcess:
    """The gateway /cluster says coordinates `group` (asked through any gateway)."""
    view = httpx.get(servers[0].url + "/cluster", params={"group": group}, headers=ADMIN, timeout=10).json()
    url = next(g["url"] for g in view["gateways"] if g["gateway_id"] == view["coordinator"])
    return next(s for s in servers if s.url == url)


def test_membership_is_seen_by_every_gateway(gateways):
    views = [cluster_view(s.url) for s in gateways]
    ids = {v["self"] for v in views}
    assert len(ids) == 3
    for v in views:
        assert {g["gateway_id"] for g in v["gateways"]} == ids
        assert all(g["live"] and g["heartbeat_age_ms"] < 2000 for g in v["gateways"])
    assert {g["url"] for g in views[0]["gateways"]} == {s.url for s in gateways}


def test_members_joining_through_different_gateways_share_the_partitions(gateways):
    members = Members(
        [
            Consumer(
                s.url, group_id="app-spread", api_key="k-app", session_timeout_ms=6000, auto_offset_reset="earliest"
            )
            for s in gateways
        ],
        "orders",
    )
    try:
        wait_for(lambda: members.stable(6), 40, "one generation over three gateways")
        owned = [{p for _, p in c.assignment()} for c in members.consumers]
        assert all(owned) and set.union(*owned) == set(range(6)) and sum(map(len, owned)) == 6  # disjoint
        described = httpx.get(f"{gateways[1].url}/groups/app-spread", headers=ADMIN, timeout=30).json()
        assert len(described["members"]) == 3 and described["state"] == "Stable"
    finally:
        members.close()


def test_forwarded_requests_keep_auth(gateways):
    owner = owner_of(gateways, "app-auth")
    other = next(s for s in gateways if s is not owner)
    with httpx.Client(base_url=other.url, timeout=30) as c:
        body = {"topics": ["orders"], "session_timeout_ms": 6000}
        assert c.post("/groups/app-auth/members", json=body).status_code == 401  # the first gateway's gate
        assert (
            c.post("/groups/app-auth/members", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        )
        # the app key may not read group other-*: refused by the owner, through the other gateway
        r = c.post("/groups/other-x/members", json=body, headers={"Authorization": "Bearer k-app"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", r.text
        joined = c.post("/groups/app-auth/members", json=body, headers={"Authorization": "Bearer k-app"})
        assert joined.status_code == 200, joined.text
        member, gen = joined.json()["member_id"], joined.json()["generation"]
        # another principal cannot heartbeat it through any gateway
        for s in gateways:
            hb = httpx.post(
                f"{s.url}/groups/app-auth/members/{member}/heartbeat",
                json={"generation": gen},
                headers=ADMIN,
                timeout=30,
            )
            assert hb.status_code == 403, hb.text
        assert (
            c.delete(f"/groups/app-auth/members/{member}", headers={"Authorization": "Bearer k-app"}).status_code == 204
        )


def test_a_browsers_group_writes_reach_a_coordinator_on_another_gateway(gateways):
    """The console calls its own gateway (same origin); a group another gateway coordinates gets
    the request forwarded, and the owner must not take it for another site's (its Host differs)."""
    owner = owner_of(gateways, "console-group")
    first = next(s for s in gateways if s is not owner)
    browser = {**ADMIN, "origin": first.url, "sec-fetch-site": "same-origin"}
    commit = {"offsets": [{"topic": "orders", "partition": 0, "offset": 1}]}
    for headers in (browser, {**ADMIN, "origin": first.url}):  # with Fetch Metadata, and an older browser's
        r = httpx.post(f"{first.url}/groups/console-group/offsets", json=commit, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
    r = httpx.post(
        f"{first.url}/groups/console-group/offsets/reset", json={"topic": "orders", "to": "earliest"}, headers=browser
    )
    assert r.status_code == 200, r.text
    # another site's page is still refused, at the first gateway
    evil = {**ADMIN, "origin": "http://evil.example", "sec-fetch-site": "cross-site"}
    r = httpx.post(f"{first.url}/groups/console-group/offsets", json=commit, headers=evil, timeout=30)
    assert r.status_code == 403 and r.json()["error"]["code"] == "CROSS_SITE_REQUEST"


def test_kill_9_the_coordinator_another_takes_over(gateways):
    """Members heartbeat and commit through the surviving gateways; the group's coordinator dies.
    Another gateway takes the group over; offsets never move backwards; a stale member's commit
    is refused; the killed gateway comes back."""
    with Producer(gateways[0].url, api_key="k-admin") as p:
        for i in range(60):
            p.send("orders", value={"n": i}, key=f"k{i}")
    victim = owner_of(gateways, "app-failover")
    survivors = [s for s in gateways if s is not victim]
    members = Members(
        [
            Consumer(
                s.url, group_id="app-failover", api_key="k-app", session_timeout_ms=6000, auto_offset_reset="earliest"
            )
            for s in survivors
        ],
        "orders",
    )
    consumers = members.consumers
    try:
        wait_for(lambda: members.stable(6), 40, "a stable group before the kill")
        for c in consumers:
            c.commit()
        before = httpx.get(f"{survivors[0].url}/groups/app-failover/offsets", headers=ADMIN, timeout=30).json()
        old_generation = consumers[0].generation
        old_member = consumers[0].member_id

        t0 = time.monotonic()
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(10)

        def stable_again() -> bool:
            r = httpx.get(f"{survivors[0].url}/groups/app-failover", headers=ADMIN, timeout=30)
            return r.status_code == 200 and r.json()["state"] == "Stable" and len(r.json()["members"]) == 2

        wait_for(stable_again, 30, "the group stable under a new coordinator")
        took = time.monotonic() - t0
        assert took < 6 + 10, took  # session timeout plus a few seconds
        view = cluster_view(survivors[0].url)
        assert len(view["gateways"]) == 2 and "app-failover" in {g for gw in view["gateways"] for g in gw["groups"]}
        after = httpx.get(f"{survivors[1].url}/groups/app-failover/offsets", headers=ADMIN, timeout=30).json()
        prev = {(o["topic"], o["partition"]): o["offset"] for o in before["offsets"]}
        for o in after["offsets"]:
            assert o["offset"] >= prev.get((o["topic"], o["partition"]), 0)  # never backwards
        # a member's commit from an older generation is fenced by the new coordinator too
        zombie = {
            "member_id": old_member,
            "generation": old_generation - 1,
            "offsets": [{"topic": "orders", "partition": 0, "offset": 0}],
        }
        r = httpx.post(
            f"{survivors[1].url}/groups/app-failover/offsets",
            json=zombie,
            headers={"Authorization": "Bearer k-app"},
            timeout=30,
        )
        assert r.status_code in (404, 409), r.text  # FENCED_MEMBER, or UNKNOWN_MEMBER after a rebalance
        # the killed gateway comes back and joins the membership again
        victim.start()
        wait_for(lambda: len(cluster_view(victim.url)["gateways"]) == 3, 20, "the restarted gateway back")
    finally:
        members.close()


def test_a_producer_moves_to_another_gateway_when_one_dies(gateways):
    """Idempotent batches survive the move: every acked record exactly once."""
    with httpx.Client(base_url=gateways[1].url, headers=ADMIN, timeout=30) as c:
        assert c.post("/topics", json={"name": "moves", "partitions": 4}).status_code == 201
    first = gateways[2]
    urls = [first.url] + [s.url for s in gateways if s is not first]
    acked: list[int] = []
    with Producer(urls, api_key="k-admin", linger_ms=5, retries=50) as p:
        futures = [p.send("moves", value={"n": i}, key=f"k{i}") for i in range(200)]
        for f in futures[:50]:
            f.result(timeout=30)
        os.kill(first.proc.pid, signal.SIGKILL)  # the gateway this producer talks to
        first.proc.wait(10)
        more = [p.send("moves", value={"n": i}, key=f"k{i}") for i in range(200, 400)]
        for i, f in enumerate(futures + more):
            f.result(timeout=60)
            acked.append(i)
    first.start()
    admin = AdminClient([s.url for s in gateways], api_key="k-admin")

    def read_all() -> list[int]:
        seen: list[int] = []
        for part in admin.describe_topic("moves")["partition_offsets"]:
            r = httpx.get(
                f"{gateways[0].url}/topics/moves/partitions/{part['partition']}/records",
                params={"offset": 0, "max_records": 10_000, "value_format": "json"},
                headers=ADMIN,
                timeout=30,
            )
            seen += [rec["value"]["n"] for rec in r.json()["records"]]
        return seen

    seen = read_all()
    deadline = time.monotonic() + 10  # the reading gateway's snapshot may lag the others' last commits
    while len(seen) < 400 and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = read_all()
    assert sorted(seen) == sorted(acked) == list(range(400))  # none lost, none twice


def _commits(url: str, topic: str) -> float:
    text = httpx.get(url + "/metrics", headers=ADMIN, timeout=10).text
    prefix = f'topiclake_commits_total{{topic="{topic}"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def test_produce_is_appended_by_each_partitions_owner(gateways):
    ids = wait_for(  # after the kill tests: until every gateway sees the same three
        lambda: (
            len({tuple(sorted(g["gateway_id"] for g in cluster_view(s.url)["gateways"])) for s in gateways}) == 1
            and len(cluster_view(gateways[0].url)["gateways"]) == 3
        ),
        what="one view of three gateways",
    )
    assert ids
    with httpx.Client(base_url=gateways[0].url, headers=ADMIN, timeout=30) as c:
        # 24 partitions: with rendezvous hashing, 6 fell to one gateway in 2 runs of 64 (seen in CI)
        assert c.post("/topics", json={"name": "owned", "partitions": 24}).status_code == 201
    view = httpx.get(gateways[0].url + "/cluster", params={"topic": "owned"}, headers=ADMIN, timeout=10).json()
    url_of = {g["gateway_id"]: g["url"] for g in view["gateways"]}
    owner = {row["partition"]: url_of[row["owner"]] for row in view["partitions"]}
    assert len(owner) == 24 and set(owner.values()) <= {s.url for s in gateways}
    # every gateway computes the same owners
    for s in gateways[1:]:
        again = httpx.get(s.url + "/cluster", params={"topic": "owned"}, headers=ADMIN, timeout=10).json()
        assert again["partitions"] == view["partitions"]

    # records without a key or partition stay on the gateway they reach: its own partitions
    for s in gateways:
        mine = {p for p, u in owner.items() if u == s.url}
        for _ in range(4):
            r = httpx.post(f"{s.url}/topics/owned/records", json={"records": [{"value": 1}]}, headers=ADMIN, timeout=30)
            assert r.status_code == 200, r.text
            if mine:
                assert r.json()["offsets"][0]["partition"] in mine

    # a partition another gateway owns: appended by that gateway, with the client's own key
    p, b_url = next((p, u) for p, u in owner.items() if u != gateways[0].url)
    a = gateways[0]
    before_a, before_b = _commits(a.url, "owned"), _commits(b_url, "owned")
    body = {
        "records": [
            {"value": {"n": 1}, "partition": p, "timestamp": 1_700_000_000_000, "headers": {"h": "v"}},
            {"value": {"n": 2}, "partition": p},
        ]
    }
    r = httpx.post(f"{a.url}/topics/owned/records", json=body, headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    offsets = [o["offset"] for o in r.json()["offsets"]]
    assert offsets[1] == offsets[0] + 1 and {o["partition"] for o in r.json()["offsets"]} == {p}
    assert _commits(a.url, "owned") == before_a and _commits(b_url, "owned") == before_b + 1
    metrics = httpx.get(a.url + "/metrics", headers=ADMIN, timeout=10).text
    assert 'topiclake_produce_forwarded_total{topic="owned",appended="owner"} ' in metrics
    fetched = httpx.get(
        f"{a.url}/topics/owned/partitions/{p}/records",
        params={"offset": offsets[0], "max_records": 2, "value_format": "json"},
        headers=ADMIN,
        timeout=30,
    ).json()["records"]
    assert [rec["value"] for rec in fetched] == [{"n": 1}, {"n": 2}]
    assert fetched[0]["timestamp"] == 1_700_000_000_000 and fetched[0]["timestamp_type"] == 0
    assert fetched[0]["headers"] == {"h": "v"} and fetched[1]["timestamp_type"] == 1  # the owner's append time

    # an idempotent batch retried through a third gateway is not written twice
    idem = {**ADMIN, "Producer-Id": "owned-p", "Producer-Sequence": "0"}
    first = httpx.post(f"{a.url}/topics/owned/records", json={"records": [{"value": 3, "partition": p}]}, headers=idem)
    third = next(s for s in gateways if s.url not in (a.url, b_url))
    retry = httpx.post(
        f"{third.url}/topics/owned/records", json={"records": [{"value": 3, "partition": p}]}, headers=idem
    )
    assert first.status_code == retry.status_code == 200, (first.text, retry.text)
    assert retry.json()["duplicate"] is True and retry.json()["offsets"] == first.json()["offsets"]

    # the owner authorizes the client's own key again (without it the owner would answer 401)
    app = {"Authorization": "Bearer k-app"}
    r = httpx.post(f"{a.url}/topics/owned/records", json={"records": [{"value": 1, "partition": p}]}, headers=app)
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", r.text
    orders = httpx.get(a.url + "/cluster", params={"topic": "orders"}, headers=ADMIN, timeout=10).json()
    foreign = next(row["partition"] for row in orders["partitions"] if url_of[row["owner"]] != a.url)
    r = httpx.post(
        f"{a.url}/topics/orders/records", json={"records": [{"value": 1, "partition": foreign}]}, headers=app
    )
    assert r.status_code == 200, r.text
    forged = {"X-Topiclake-Forwarded-By": "someone"}
    r = httpx.post(f"{b_url}/topics/owned/records", json={"records": [{"value": 1, "partition": p}]}, headers=forged)
    assert r.status_code == 401, r.text
    r = httpx.post(f"{a.url}/topics/owned/records", json={"records": [{"value": 1, "partition": 99}]}, headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "UNKNOWN_PARTITION", r.text


def test_serve_workers_are_cluster_members_behind_one_port(tmp_path):
    """`serve --workers 2`: two gateway processes on one port, the same mechanism as two hosts."""
    srv = ServerProcess(tmp_path / "data", args=["--workers", "2"], env=FAST_MEMBERSHIP).start()
    try:
        view = wait_for(
            lambda: (v := httpx.get(srv.url + "/cluster", timeout=10).json()) and len(v["gateways"]) == 2 and v,
            30,
            "two workers in the cluster",
        )
        urls = {g["url"] for g in view["gateways"]}
        assert len(urls) == 2 and srv.url not in urls  # each advertises its own private port
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.post("/topics", json={"name": "w", "partitions": 4}).status_code == 201
            for i in range(20):  # new connections land on both workers
                with httpx.Client(base_url=srv.url, timeout=30) as fresh:
                    assert fresh.post("/topics/w/records", json={"records": [{"value": i}]}).status_code == 200
            seen = {httpx.get(srv.url + "/cluster", timeout=10).json()["self"] for _ in range(30)}
            assert len(seen) == 2  # both workers answer on the shared port
            total = sum(p["high_watermark"] for p in c.get("/topics/w").json()["partition_offsets"])
            assert total == 20
        members = Members(
            [
                Consumer(srv.url, group_id="w-group", session_timeout_ms=6000, auto_offset_reset="earliest")
                for _ in range(2)
            ],
            "w",
        )
        try:
            wait_for(lambda: members.stable(4), 40, "a group across the workers")
        finally:
            members.close()
    finally:
        srv.stop()


def test_kill_9_twice_under_load_keeps_every_invariant(gateways):
    """3 gateways; an idempotent producer and a group of 3 members spread over them; the group's
    coordinator killed with kill -9 twice under load, restarted in between. Afterwards: every acked
    record exactly once with contiguous offsets; no partition consumed by two members in one
    generation; committed offsets never went backwards."""
    with httpx.Client(base_url=gateways[0].url, headers=ADMIN, timeout=30) as c:
        assert c.post("/topics", json={"name": "load", "partitions": 6}).status_code == 201
    urls = [s.url for s in gateways]
    acked: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        with Producer(urls, api_key="k-admin", linger_ms=5, retries=100) as p:
            n = 0
            while not stop.is_set():
                futures = [(i, p.send("load", value={"n": i}, key=f"k{i}")) for i in range(n, n + 20)]
                n += 20
                for i, f in futures:
                    with contextlib.suppress(Exception):
                        f.result(timeout=60)
                        acked.append(i)
                time.sleep(0.05)

    # who received which partition in which generation: (generation, partition) -> member ids
    owners: dict[tuple[int, int], set[str]] = {}
    lock = threading.Lock()

    class Tracking(Consumer):
        def poll(self, timeout: float = 1.0):  # type: ignore[override]
            records = super().poll(timeout)
            with lock:
                for r in records:
                    owners.setdefault((self.generation, r.partition), set()).add(self.member_id or "")
            return records

    members = Members(
        [
            Tracking(
                [s.url, *[o.url for o in gateways if o is not s]],
                group_id="app-load",
                api_key="k-admin",
                session_timeout_ms=6000,
                auto_offset_reset="earliest",
                auto_commit_interval_ms=500,
            )
            for s in gateways
        ],
        "load",
    )
    committed_history: list[dict[tuple[str, int], int]] = []

    def sample_commits() -> None:
        for s in gateways:
            with contextlib.suppress(Exception):
                r = httpx.get(f"{s.url}/groups/app-load/offsets", headers=ADMIN, timeout=5)
                if r.status_code == 200:
                    committed_history.append({(o["topic"], o["partition"]): o["offset"] for o in r.json()["offsets"]})
                    return

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        wait_for(lambda: members.stable(6), 60, "a stable group of three")
        for _round in range(2):
            victim = owner_of(gateways, "app-load")
            for _ in range(10):
                sample_commits()
                time.sleep(0.2)
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait(10)
            for _ in range(40):
                sample_commits()
                time.sleep(0.25)
            victim.start()
            wait_for(lambda v=victim: len(cluster_view(v.url)["gateways"]) == 3, 30, "the gateway back")
        wait_for(lambda: members.stable(6), 60, "a stable group after the kills")
        for _ in range(8):
            sample_commits()
            time.sleep(0.25)
    finally:
        stop.set()
        producer.join(120)
        members.close()

    # every acked record exactly once, offsets contiguous per partition (read until the reading
    # gateway's snapshot, at most `reader.refresh_interval_s` old, has the last commits of the others)
    def read_all() -> list[int]:
        seen: list[int] = []
        for part in range(6):
            r = httpx.get(
                f"{gateways[0].url}/topics/load/partitions/{part}/records",
                params={"offset": 0, "max_records": 100_000, "value_format": "json"},
                headers=ADMIN,
                timeout=60,
            ).json()
            offsets = [rec["offset"] for rec in r["records"]]
            assert offsets == list(range(len(offsets))), part
            seen += [rec["value"]["n"] for rec in r["records"]]
        return seen

    seen = read_all()
    deadline = time.monotonic() + 10
    while not set(acked) <= set(seen) and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = read_all()
    assert len(seen) == len(set(seen)) and set(acked) <= set(seen) and len(acked) > 100
    # one member per partition per generation
    assert all(len(ids) == 1 for ids in owners.values()), {k: v for k, v in owners.items() if len(v) > 1}
    # committed offsets never went backwards
    for earlier, later in itertools.pairwise(committed_history):
        for key, offset in earlier.items():
            assert later.get(key, offset) >= offset, (key, offset, later.get(key))


def test_a_schema_registered_through_one_gateway_guards_produce_on_every_gateway(gateways):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with httpx.Client(base_url=gateways[0].url, headers=ADMIN, timeout=30) as c:
        assert c.post("/topics", json={"name": "typed-cluster", "partitions": 2}).status_code == 201
    r = httpx.post(
        gateways[1].url + "/registry/subjects/typed-cluster-value/versions",
        json={"schema": json.dumps(schema), "schemaType": "JSON"},
        headers=ADMIN,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    first_id = r.json()["id"]

    def refused_everywhere() -> bool:  # each gateway reads the registry within server.schema_refresh_s
        answers = [
            httpx.post(
                s.url + "/topics/typed-cluster/records",
                json={"records": [{"value": {"n": "x"}, "partition": 0}]},
                headers=ADMIN,
                timeout=30,
            )
            for s in gateways
        ]
        return all(a.status_code == 422 for a in answers)

    wait_for(refused_everywhere, timeout=5, what="every gateway to refuse a record the schema refuses")
    # a new version registered on one gateway: a value framed with its id is taken at once elsewhere
    widened = {**schema, "properties": {"n": {"type": "number"}}}
    r = httpx.post(
        gateways[1].url + "/registry/subjects/typed-cluster-value/versions",
        json={"schema": json.dumps(widened), "schemaType": "JSON"},
        headers=ADMIN,
        timeout=30,
    )
    second_id = r.json()["id"]
    assert second_id != first_id
    framed = b"\0" + second_id.to_bytes(4, "big") + b'{"n": 1.5}'
    r = httpx.post(
        gateways[2].url + "/topics/typed-cluster/records?value_format=binary",
        json={"records": [{"value": base64.b64encode(framed).decode()}]},
        headers=ADMIN,
        timeout=30,
    )
    assert r.status_code == 200, r.text


def test_an_owner_that_knows_a_newer_schema_makes_the_first_gateway_check_again(tmp_path):
    env = {**FAST_MEMBERSHIP, "TOPICLAKE_SERVER__SCHEMA_REFRESH_S": "600"}  # stale registry snapshots
    a, b = (ServerProcess(tmp_path / "data", env=env).start() for _ in range(2))
    try:
        wait_for(lambda: all(len(cluster_view(s.url)["gateways"]) == 2 for s in (a, b)), what="2 gateways")
        # 24 partitions, so b owns some (6 all fell to a in one CI run: rendezvous hashing, 2 in 64)
        assert httpx.post(a.url + "/topics", json={"name": "fw", "partitions": 24}, timeout=30).status_code == 201
        view = httpx.get(a.url + "/cluster", params={"topic": "fw"}, timeout=10).json()
        b_id = next(g["gateway_id"] for g in view["gateways"] if g["url"] == b.url)
        b_parts = sorted(row["partition"] for row in view["partitions"] if row["owner"] == b_id)
        assert b_parts, view
        schema = {"schemaType": "JSON", "schema": json.dumps({"type": "object", "required": ["n"]})}
        # registered through b: b's snapshot is fresh, a's (read at start) has no schema for fw
        assert httpx.post(b.url + "/registry/subjects/fw-value/versions", json=schema, timeout=30).status_code == 200
        # b's partitions in descending order: the batch forwarded to b is sorted by partition
        parts = [b_parts[-1], b_parts[0]]
        records = [{"value": {"n": 1}, "partition": parts[0]}, {"value": {"x": 1}, "partition": parts[1]}]
        r = httpx.post(a.url + "/topics/fw/records", json={"records": records}, timeout=30)
        assert r.status_code == 422, r.text
        assert [rec["index"] for rec in r.json()["error"]["details"]["records"]] == [1]  # the client's order
        r = httpx.post(a.url + "/topics/fw/records", json={"records": records[:1]}, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        a.stop()
        b.stop()
