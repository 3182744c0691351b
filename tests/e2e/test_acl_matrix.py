"""Kafka's ACL model, walked whole against a real server: every operation x resource for no key, a
wrong key and each kind of key. The expected cells are written out here (the matrix of
docs/OPERATIONS.md), not derived from the server's own rules."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.server import ServerProcess

KEYS = {
    # kind: (key, topic ACLs, group ACLs or None for a key file without a `groups` table)
    "admin": ("k-admin", '{ "*" = ["admin"] }', '{ "*" = ["admin"] }'),
    "producer": ("k-producer", '{ "orders-*" = ["produce"] }', None),
    "consumer": ("k-consumer", '{ "orders-*" = ["consume"] }', '{ "orders-app" = ["read"] }'),
    "legacy": ("k-legacy", '{ "orders-*" = ["consume"] }', None),
    "monitor": ("k-monitor", '{ "orders-*" = ["describe"] }', '{ "*" = ["describe"] }'),
}
ALL = set(KEYS)

# (operation, method, path, json body, the kinds of key allowed). Topics: orders-1 (inside the
# keys' patterns) and audit (outside); groups: orders-app (the consumer's) and other-app.
TOPIC, OTHER = "orders-1", "audit"
MATRIX: list[tuple[str, str, str, object, set[str]]] = [
    ("list topics", "GET", "/topics", None, ALL),
    ("create topic", "POST", "/topics", {"name": "orders-new"}, {"admin"}),
    ("describe topic", "GET", f"/topics/{TOPIC}", None, ALL),
    ("describe other topic", "GET", f"/topics/{OTHER}", None, {"admin"}),
    ("alter topic config", "PATCH", f"/topics/{TOPIC}/config", {"config": {"retention.ms": "86400000"}}, {"admin"}),
    ("add partitions", "POST", f"/topics/{TOPIC}/partitions", {"count": 2}, {"admin"}),
    ("delete topic", "DELETE", f"/topics/{OTHER}-gone", None, {"admin"}),
    ("produce", "POST", f"/topics/{TOPIC}/records", {"records": [{"value": "x"}]}, {"admin", "producer"}),
    ("produce other topic", "POST", f"/topics/{OTHER}/records", {"records": [{"value": "x"}]}, {"admin"}),
    ("fetch", "GET", f"/topics/{TOPIC}/partitions/0/records?offset=0", None, {"admin", "consumer", "legacy"}),
    ("fetch other topic", "GET", f"/topics/{OTHER}/partitions/0/records?offset=0", None, {"admin"}),
    ("offset lookup", "GET", f"/topics/{TOPIC}/offsets?at=earliest", None, {"admin", "consumer", "legacy"}),
    ("list groups", "GET", "/groups", None, ALL),
    ("describe group", "GET", "/groups/orders-app", None, {"admin", "consumer", "legacy", "monitor"}),
    ("describe other group", "GET", "/groups/other-app", None, {"admin", "legacy", "monitor"}),
    ("fetch group offsets", "GET", "/groups/orders-app/offsets", None, {"admin", "consumer", "legacy", "monitor"}),
    ("fetch other group offsets", "GET", "/groups/other-app/offsets", None, {"admin", "legacy", "monitor"}),
    (
        "commit offsets",
        "POST",
        "/groups/orders-app/offsets",
        {"offsets": [{"topic": TOPIC, "partition": 0, "offset": 0}]},
        {"admin", "consumer", "legacy"},
    ),
    (
        "commit offsets of other topic",
        "POST",
        "/groups/orders-app/offsets",
        {"offsets": [{"topic": OTHER, "partition": 0, "offset": 0}]},
        {"admin"},
    ),
    (
        "commit offsets of other group",
        "POST",
        "/groups/other-app/offsets",
        {"offsets": [{"topic": TOPIC, "partition": 0, "offset": 0}]},
        {"admin", "legacy"},
    ),
    ("reset offsets", "POST", "/groups/orders-app/offsets/reset", {"topic": TOPIC, "to": "earliest"}, {"admin"}),
    ("join group", "POST", "/groups/orders-app/members", {"topics": [TOPIC]}, {"admin", "consumer", "legacy"}),
    ("join other group", "POST", "/groups/other-app/members", {"topics": [TOPIC]}, {"admin", "legacy"}),
    ("join with other topic", "POST", "/groups/orders-app/members", {"topics": [OTHER]}, {"admin"}),
    # the schema registry: subjects are authorized as their topic (<topic>-value, <topic>-key)
    (
        "register schema",
        "POST",
        f"/registry/subjects/{TOPIC}-value/versions",
        {"schema": '"string"'},
        {"admin", "producer"},
    ),
    ("register other schema", "POST", f"/registry/subjects/{OTHER}-value/versions", {"schema": '"string"'}, {"admin"}),
    ("schema versions", "GET", f"/registry/subjects/{TOPIC}-value/versions", None, ALL),
    ("other schema versions", "GET", f"/registry/subjects/{OTHER}-value/versions", None, {"admin"}),
    (
        "check compatibility",
        "POST",
        f"/registry/compatibility/subjects/{TOPIC}-value/versions",
        {"schema": '"string"'},
        ALL,
    ),
    ("set subject level", "PUT", f"/registry/config/{TOPIC}-value", {"compatibility": "FULL"}, {"admin"}),
    ("delete subject", "DELETE", f"/registry/subjects/{TOPIC}-key", None, {"admin"}),
    ("global level", "GET", "/registry/config", None, ALL),
    ("set global level", "PUT", "/registry/config", {"compatibility": "BACKWARD"}, {"admin"}),
    ("list subjects", "GET", "/registry/subjects", None, ALL),
    # transactional ids: keys without a `transactional_ids` table write every id if they may
    # produce to some topic (the admin and the producer here), and nobody else may see them
    ("init transaction", "POST", "/transactions/orders-tx/init", {"timeout_ms": 60000}, {"admin", "producer"}),
    ("describe transaction", "GET", "/transactions/orders-tx", None, {"admin", "producer"}),
    (
        "commit transaction",
        "POST",
        "/transactions/orders-tx/commit",
        {"producer_id": 1, "producer_epoch": 0},
        {"admin", "producer"},
    ),
    (
        "add to transaction",
        "POST",
        "/transactions/orders-tx/partitions",
        {"producer_id": 1, "producer_epoch": 0, "partitions": [{"topic": TOPIC, "partition": 0}]},
        {"admin", "producer"},
    ),
    (
        "add other topic to transaction",
        "POST",
        "/transactions/orders-tx/partitions",
        {"producer_id": 1, "producer_epoch": 0, "partitions": [{"topic": OTHER, "partition": 0}]},
        {"admin"},
    ),
    ("list transactions", "GET", "/transactions", None, ALL),
    ("metrics", "GET", "/metrics", None, ALL),
    ("openapi", "GET", "/openapi.json", None, ALL),
]


def bearer(kind: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[kind][0]}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("acl")
    lines = []
    for kind, (key, acls, groups) in KEYS.items():
        lines.append(f'[[auth.api_keys]]\nkey = "{key}"\nprincipal = "{kind}"\nacls = {acls}\n')
        if groups is not None:
            lines.append(f"groups = {groups}\n")
    (root / "auth.toml").write_text("".join(lines))
    srv = ServerProcess(root / "data", env={"TOPICLAKE_CONFIG": str(root / "auth.toml")}).start()
    with httpx.Client(base_url=srv.url, timeout=60, headers=bearer("admin")) as admin:
        for name in (TOPIC, OTHER):
            assert admin.post("/topics", json={"name": name, "partitions": 1}).status_code == 201
            assert admin.post(f"/topics/{name}/records", json={"records": [{"value": "seed"}]}).status_code == 200
        for group in ("orders-app", "other-app"):
            for name in (TOPIC, OTHER):
                body = {"offsets": [{"topic": name, "partition": 0, "offset": 1}]}
                assert admin.post(f"/groups/{group}/offsets", json=body).status_code == 200
    yield srv
    srv.stop()


def call(srv: ServerProcess, method: str, path: str, body: object, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        return c.request(method, path, json=body, headers=headers)


def refused(r: httpx.Response, status: int, code: str) -> bool:
    return r.status_code == status and r.json()["error"]["code"] == code and bool(r.json()["error"]["message"])


@pytest.mark.parametrize(("operation", "method", "path", "body", "allowed"), MATRIX, ids=[m[0] for m in MATRIX])
def test_the_whole_matrix(server, operation, method, path, body, allowed):
    for headers in ({}, {"Authorization": "Bearer not-a-key"}, {"Authorization": "k-admin"}):
        assert refused(call(server, method, path, body, headers), 401, "UNAUTHENTICATED"), (operation, headers)
    for kind in KEYS:
        r = call(server, method, path, body, bearer(kind))
        if kind in allowed:
            assert r.status_code not in (401, 403) and r.status_code < 500, (operation, kind, r.text)
            if r.request.url.path.endswith("/members") and r.status_code == 200:
                member = r.json()["member_id"]
                group = path.split("/")[2]
                assert (
                    call(server, "DELETE", f"/groups/{group}/members/{member}", None, bearer(kind)).status_code == 204
                )
        else:
            assert refused(r, 403, "FORBIDDEN"), (operation, kind, r.status_code, r.text)


def test_listings_and_metrics_show_only_what_the_key_may_describe(server):
    def get(kind: str, path: str) -> httpx.Response:
        r = call(server, "GET", path, None, bearer(kind))
        assert r.status_code == 200, r.text
        return r

    assert set(get("admin", "/topics").json()["topics"]) >= {TOPIC, OTHER}
    for kind in ("producer", "consumer", "legacy", "monitor"):
        assert OTHER not in get(kind, "/topics").json()["topics"]
        assert TOPIC in get(kind, "/topics").json()["topics"]
    assert {g["group"] for g in get("consumer", "/groups").json()["groups"]} == {"orders-app"}
    assert get("producer", "/groups").json()["groups"] == []
    assert {g["group"] for g in get("monitor", "/groups").json()["groups"]} >= {"orders-app", "other-app"}
    # a group's offsets and lag: only the topics the key may describe
    for path in ("/groups/orders-app/offsets", "/groups/orders-app"):
        seen = {
            o["topic"] for o in get("consumer", path).json().get("offsets", get("consumer", path).json().get("lag", []))
        }
        assert seen == {TOPIC}, path
        seen = {o["topic"] for o in get("admin", path).json().get("offsets", get("admin", path).json().get("lag", []))}
        assert seen == {TOPIC, OTHER}, path
    producer_metrics = get("producer", "/metrics").text
    assert f'topic="{TOPIC}"' in producer_metrics and f'topic="{OTHER}"' not in producer_metrics
    assert f'topic="{OTHER}"' in get("admin", "/metrics").text


def test_a_member_belongs_to_the_key_that_joined_it(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post(
            "/groups/orders-app/members", json={"topics": [TOPIC], "instance_id": "svc-1"}, headers=bearer("consumer")
        )
        assert r.status_code == 200, r.text
        member, generation = r.json()["member_id"], r.json()["generation"]
        # the legacy key has READ on the group and consume on the topic, but did not join this member
        thief = bearer("legacy")
        hb = c.post(f"/groups/orders-app/members/{member}/heartbeat", json={"generation": generation}, headers=thief)
        assert refused(hb, 403, "FORBIDDEN")
        assert refused(c.delete(f"/groups/orders-app/members/{member}", headers=thief), 403, "FORBIDDEN")
        commit = {
            "member_id": member,
            "generation": generation,
            "offsets": [{"topic": TOPIC, "partition": 0, "offset": 1}],
        }
        assert refused(c.post("/groups/orders-app/offsets", json=commit, headers=thief), 403, "FORBIDDEN")
        rejoin = {"topics": [TOPIC], "member_id": member}
        assert refused(c.post("/groups/orders-app/members", json=rejoin, headers=thief), 403, "FORBIDDEN")
        static = {"topics": [TOPIC], "instance_id": "svc-1"}
        assert refused(c.post("/groups/orders-app/members", json=static, headers=thief), 403, "FORBIDDEN")
        # nothing changed: the member is still there, in its generation, and its owner goes on
        owner = bearer("consumer")
        hb = c.post(f"/groups/orders-app/members/{member}/heartbeat", json={"generation": generation}, headers=owner)
        assert hb.status_code == 200 and hb.json()["rebalance"] is False, hb.text
        assert c.post("/groups/orders-app/offsets", json=commit, headers=owner).status_code == 200
        assert c.delete(f"/groups/orders-app/members/{member}", headers=owner).status_code == 204


def test_confluents_registry_client_authenticates_with_basic_auth(server):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    def client(user_info: str) -> SchemaRegistryClient:
        return SchemaRegistryClient({"url": server.url + "/registry", "basic.auth.user.info": user_info})

    producer = client("svc:k-producer")
    schema_id = producer.register_schema(f"{TOPIC}-value", Schema('"string"', "AVRO"))
    assert producer.get_schema(schema_id).schema_str == '"string"'
    assert OTHER + "-value" not in producer.get_subjects()
    with pytest.raises(SchemaRegistryError) as no_key:
        client("svc:not-a-key").get_subjects()
    assert no_key.value.http_status_code == 401 and no_key.value.error_code == 40101
    with pytest.raises(SchemaRegistryError) as forbidden:
        producer.register_schema(f"{OTHER}-value", Schema('"string"', "AVRO"))
    assert forbidden.value.http_status_code == 403 and forbidden.value.error_code == 40301
    with pytest.raises(SchemaRegistryError):
        client("svc:k-monitor").delete_subject(f"{TOPIC}-value")
    assert f"{TOPIC}-value" in client("svc:k-monitor").get_subjects()


def test_dead_letters_need_produce_on_the_dead_letter_topic(server):
    import json

    admin = bearer("admin")
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/topics", json={"name": "orders-typed", "partitions": 1}, headers=admin).status_code == 201
        schema = {"schemaType": "JSON", "schema": json.dumps({"required": ["n"]})}
        assert c.post("/registry/subjects/orders-typed-value/versions", json=schema, headers=admin).status_code == 200
        config = {"errors.tolerance": "all", "errors.deadletterqueue.topic.name": OTHER}  # outside the producer's ACL
        assert c.patch("/topics/orders-typed/config", json={"config": config}, headers=admin).status_code == 200
        body = {"records": [{"value": {"n": 1}}, {"value": {"x": 1}}]}
        r = c.post("/topics/orders-typed/records", json=body, headers=bearer("producer"))
        assert refused(r, 403, "FORBIDDEN") and OTHER in r.json()["error"]["message"], r.text
        assert c.post("/topics/orders-typed/records", json=body, headers=admin).status_code == 200
