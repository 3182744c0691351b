"""The web console in a real headless Chromium against a real server: what a user sees and does."""

from __future__ import annotations

import functools
import json

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

WAIT = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("console") / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def api(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def open_page(driver, url: str, hash_: str):
    """Load a console page and wait until it has drawn (the app marks the body when a route is done)."""
    driver.get(f"{url}/console/{hash_}")
    driver.execute_script("document.body.dataset.ready = ''")
    driver.refresh()
    wait_ready(driver, hash_)


def wait_ready(driver, hash_: str) -> None:
    WebDriverWait(driver, WAIT).until(lambda d: d.execute_script("return document.body.dataset.ready") == hash_)


def banner(driver) -> str:
    el = driver.find_element(By.ID, "banner")
    return el.text if el.is_displayed() else ""


def wait_banner(driver, text: str) -> str:
    WebDriverWait(driver, WAIT).until(lambda d: text in banner(d))
    return banner(driver)


def chart_points(driver, canvas_id: str) -> list:
    return driver.execute_script(
        "const c = window.Chart && Chart.getChart(document.getElementById(arguments[0]));"
        "return c ? c.data.datasets[0].data : null;",
        canvas_id,
    )


def fill(driver, element_id: str, text: str) -> None:
    el = driver.find_element(By.ID, element_id)
    el.clear()
    el.send_keys(text)


def test_the_topics_page_lists_topics_with_their_figures(server, api, browser, screenshots):
    assert (
        api.post("/topics", json={"name": "orders", "partitions": 3, "config": {"retention.ms": 3600000}}).status_code
        == 201
    )
    api.post("/topics/orders/records", json={"records": [{"key": f"k{i}", "value": {"n": i}} for i in range(5)]})
    open_page(browser, server.url, "#/topics")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-topic="orders"]')
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[:3] == ["orders", "3", "5"]
    assert cells[4:6] == ["1 h", "delete"]
    assert sum(chart_points(browser, "spark-orders")) == 5  # the sparkline: the topic's appends, from its history
    screenshots(browser, "topics")
    # server-side search: the page asks the API for matching names only
    fill(browser, "topic-search", "nomatch")
    browser.find_element(By.ID, "topic-search").submit()
    wait_ready(browser, "#/topics?search=nomatch")
    assert "No topics." in browser.find_element(By.ID, "topics").text


def test_create_produce_browse_in_the_browser(server, api, browser, screenshots):
    """Click through: create a topic, produce a test record, browse it, see the partition chart."""
    open_page(browser, server.url, "#/topics")
    fill(browser, "new-topic-name", "clicks")
    fill(browser, "new-topic-partitions", "2")
    browser.find_element(By.ID, "create-topic").submit()
    wait_ready(browser, "#/topic/clicks")
    assert "Created topic clicks." in banner(browser)
    assert api.get("/topics/clicks").json()["partitions"] == 2  # written through the API
    assert chart_points(browser, "partition-chart") == [0, 0]  # Chart.js drew one bar per partition
    owners = [
        r.find_elements(By.TAG_NAME, "td")[-1].text
        for r in browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")
    ]
    assert len(owners) == 2 and all(owners)  # each partition's owner gateway
    screenshots(browser, "topic")

    browser.find_element(By.LINK_TEXT, "Browse messages").click()
    wait_ready(browser, "#/messages/clicks")
    fill(browser, "produce-key", "user-1")
    fill(browser, "produce-value", '{"clicked": "buy", "n": 1}')
    fill(browser, "produce-headers", "source=console")
    browser.find_element(By.ID, "produce").submit()
    assert "Produced at offset 0 of partition 0." in wait_banner(browser, "Produced")

    def browsed(d):  # the topic's description may trail the ack by the reader's refresh interval
        d.find_element(By.ID, "msg-go").click()
        wait_ready(d, "#/messages/clicks?p=0&from=newest&offset=0&ts=&dir=backward&as=auto")
        return d.find_elements(By.CSS_SELECTOR, "#messages tr.record")

    (record,) = WebDriverWait(browser, WAIT).until(browsed)
    text = record.text
    assert "user-1" in text and '"clicked": "buy"' in text and "json" in text and "source=console" in text
    screenshots(browser, "messages")

    # the same record, as hex; and found / not found by the page's search
    Select(browser.find_element(By.ID, "msg-as")).select_by_value("hex")
    browser.find_element(By.ID, "msg-go").click()
    wait_ready(browser, "#/messages/clicks?p=0&from=newest&offset=0&ts=&dir=backward&as=hex")
    assert "7b 22 63 6c" in browser.find_element(By.CSS_SELECTOR, "#messages tr.record").text  # {"cl
    fill(browser, "msg-search", "no such text")
    assert browser.find_elements(By.CSS_SELECTOR, "#messages tr.record") == []


def test_bad_input_shows_the_apis_message_and_writes_nothing(server, api, browser):
    open_page(browser, server.url, "#/topics")
    fill(browser, "new-topic-name", "bad name!")
    browser.find_element(By.ID, "create-topic").submit()
    assert "illegal characters" in wait_banner(browser, "(INVALID_TOPIC)")
    fill(browser, "new-topic-name", "negative")
    fill(browser, "new-topic-partitions", "-1")
    browser.find_element(By.ID, "create-topic").submit()
    assert "Partition count must be between 1" in wait_banner(browser, "(INVALID_PARTITIONS)")
    fill(browser, "new-topic-name", "badschema")
    fill(browser, "new-topic-partitions", "1")
    Select(browser.find_element(By.ID, "new-topic-schema-type")).select_by_value("AVRO")
    fill(browser, "new-topic-schema", '{"type": "record", "name": "x", "fields": [{"name": "a", "type": "nope"}]}')
    browser.find_element(By.ID, "create-topic").submit()
    assert "Invalid Avro schema" in wait_banner(browser, "(INVALID_VALUE_SCHEMA)")
    names = api.get("/topics").json()["topics"]
    assert not {"bad name!", "negative", "badschema"} & set(names)

    api.post("/topics", json={"name": "strict", "partitions": 1})
    open_page(browser, server.url, "#/messages/strict")
    fill(browser, "produce-value", '{"oops": ')
    browser.find_element(By.ID, "produce").submit()
    assert "not valid JSON" in wait_banner(browser, "JSON")
    offsets = api.get("/topics/strict").json()["partition_offsets"]
    assert offsets[0]["high_watermark"] == 0  # nothing written


def test_the_cluster_page_charts_the_servers_own_metrics(server, api, browser, screenshots):
    api.post("/topics", json={"name": "rates"})
    open_page(browser, server.url, "#/cluster")
    assert api.post("/topics/rates/records", json={"records": [{"value": i} for i in range(100)]}).status_code == 200
    assert len(api.get("/topics/rates/partitions/0/records", params={"offset": 0}).json()["records"]) == 100
    WebDriverWait(browser, WAIT).until(lambda d: len(chart_points(d, "produce-rate-chart") or []) >= 2)
    assert max(chart_points(browser, "produce-rate-chart")) > 0  # the produce above, as a rate
    assert max(chart_points(browser, "fetch-rate-chart")) > 0  # and the fetch
    gateways = browser.find_element(By.ID, "gateways").text
    assert "this gateway" in gateways and "live, heartbeat" in gateways and server.url in gateways
    # each gateway's own TLS and auth settings, as it published them (not guessed by the page)
    assert browser.find_element(By.CSS_SELECTOR, "#gateways td.tls").text == "no TLS"
    assert browser.find_element(By.CSS_SELECTOR, "#gateways td.auth").text == "no keys"
    # the partitions each gateway leads, a page of topics at a time (server-side search)
    leaders = browser.find_element(By.CSS_SELECTOR, '#leaders tr[data-topic="rates"]')
    assert [td.text for td in leaders.find_elements(By.TAG_NAME, "td")] == ["rates", "1", "1"]
    fill(browser, "leader-search", "rat")
    browser.find_element(By.ID, "leader-search").submit()
    wait_ready(browser, "#/cluster?search=rat")
    assert [
        r.get_attribute("data-topic") for r in browser.find_elements(By.CSS_SELECTOR, "#leaders tr[data-topic]")
    ] == ["rates"]
    screenshots(browser, "cluster")


def test_console_answers_carry_anti_framing_headers_and_no_data(server, api):
    r = api.get("/console/")
    assert r.status_code == 200 and "topiclake console" in r.text
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    assert api.get("/console", follow_redirects=False).headers["location"] == "/console/"
    assert api.get("/console/vendor/chart.umd.min.js").status_code == 200  # built by make setup, served here
    assert api.post("/console/").status_code in (404, 405)  # files only


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("console-keys")
    (root / "auth.toml").write_text(
        '[[auth.api_keys]]\nkey = "admin-key-0123456789"\nprincipal = "admin"\nacls = { "*" = ["admin"] }\n'
        'groups = { "*" = ["admin"] }\n'
        '[[auth.api_keys]]\nkey = "team-admin-0123456789"\nprincipal = "team-admin"\n'
        'acls = { "orders-*" = ["admin"] }\ngroups = { "orders-*" = ["admin"] }\n'
        '[[auth.api_keys]]\nkey = "orders-key-0123456789"\nprincipal = "orders-team"\n'
        'acls = { "orders-*" = ["describe", "consume", "produce"] }\n'
    )
    srv = ServerProcess(root / "data", env={"TOPICLAKE_CONFIG": str(root / "auth.toml")}).start()
    admin = {"Authorization": "Bearer admin-key-0123456789"}
    with httpx.Client(base_url=srv.url, timeout=60, headers=admin) as client:
        for name in ("orders-1", "secret"):
            assert client.post("/topics", json={"name": name, "partitions": 1}).status_code == 201
    try:
        yield srv
    finally:
        srv.stop()


def test_with_keys_the_console_shows_only_what_the_key_may_see(secured, browser, screenshots):
    open_page(browser, secured.url, "#/topics")
    assert browser.find_element(By.ID, "api-key").is_displayed()  # the API said 401: log in
    screenshots(browser, "login")
    assert browser.find_elements(By.ID, "topics") == []
    fill(browser, "api-key", "wrong-key")
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, WAIT).until(lambda d: "Unknown API key" in banner(d))
    assert browser.find_elements(By.ID, "topics") == []  # the wrong key sees nothing
    assert browser.execute_script("return sessionStorage.getItem('topiclake.key')") is None

    fill(browser, "api-key", "orders-key-0123456789")
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, WAIT).until(EC.presence_of_element_located((By.ID, "topics")))
    listed = [r.get_attribute("data-topic") for r in browser.find_elements(By.CSS_SELECTOR, "#topics tr[data-topic]")]
    assert listed == ["orders-1"]  # not "secret"
    # a topic the key may not describe cannot be browsed either: the API refuses, the page says so
    browser.get(f"{secured.url}/console/#/messages/secret")
    WebDriverWait(browser, WAIT).until(lambda d: "may not" in banner(d))
    assert browser.find_elements(By.ID, "messages") == []
    browser.find_element(By.ID, "logout").click()
    assert browser.execute_script("return sessionStorage.getItem('topiclake.key')") is None


def test_only_a_key_that_administers_everything_sees_and_runs_the_jobs(secured):
    """The jobs act on every topic and group, and their reports name them: admin on some topics
    is not enough (Kafka: ALTER on the cluster)."""
    with httpx.Client(base_url=secured.url, timeout=60) as client:

        def as_key(key: str, method: str, path: str) -> int:
            headers = {"Authorization": f"Bearer {key}"}
            return client.request(method, path, headers=headers, json={} if method == "POST" else None).status_code

        assert as_key("team-admin-0123456789", "GET", "/jobs") == 403
        assert as_key("team-admin-0123456789", "POST", "/jobs/retention/runs") == 403
        assert as_key("orders-key-0123456789", "GET", "/jobs") == 403
        assert as_key("admin-key-0123456789", "GET", "/jobs") == 200
        assert client.get("/jobs").status_code == 401


def test_dead_letters_show_with_their_error_headers(server, api, browser):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    created = api.post(
        "/topics",
        json={
            "name": "typed",
            "config": {"errors.tolerance": "all"},
            "value_schema": {"schemaType": "JSON", "schema": json.dumps(schema)},
        },
    )
    assert created.status_code == 201, created.text
    r = api.post("/topics/typed/records", json={"records": [{"value": {"n": 1}}, {"value": {"n": "not a number"}}]})
    assert r.status_code == 200, r.text
    open_page(browser, server.url, "#/topic/typed")
    browser.find_element(By.ID, "dead-letters").click()

    def browsed(d):
        wait_ready(d, "#/messages/typed.dlq")
        rows = d.find_elements(By.CSS_SELECTOR, "#messages tr.record")
        if not rows:
            d.refresh()
        return rows

    (record,) = WebDriverWait(browser, WAIT).until(browsed)
    assert "not a number" in record.text
    assert "__connect.errors.exception.message=" in record.text and "topiclake.errors.record.index=1" in record.text


def test_a_group_reads_then_its_lag_chart_and_offset_reset(server, api, browser, screenshots):
    """Click through the groups pages: a group that read part of a topic shows its lag per partition
    and a lag-over-time chart with points; resetting its offsets is refused while it has a member
    (the API's message), then done once it is empty."""
    assert api.post("/topics", json={"name": "readme", "partitions": 1}).status_code == 201
    api.post("/topics/readme/records", json={"records": [{"value": i} for i in range(10)]})
    m = api.post(
        "/groups/readers/members", json={"topics": ["readme"], "session_timeout_ms": 30000, "client_id": "reader-app"}
    ).json()
    body = {
        "member_id": m["member_id"],
        "generation": m["generation"],
        "offsets": [{"topic": "readme", "partition": 0, "offset": 4}],
    }
    assert api.post("/groups/readers/offsets", json=body).status_code == 200

    open_page(browser, server.url, "#/groups")
    screenshots(browser, "groups")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-group="readers"]')
    assert row.text.split()[:3] == ["readers", "Stable", "1"]
    row.find_element(By.TAG_NAME, "a").click()
    wait_ready(browser, "#/group/readers")
    assert browser.find_element(By.ID, "lag").text.split("\n")[1].split() == ["readme", "0", "4", "10", "6"]
    assert "readme: 0" in browser.find_element(By.ID, "members").text
    assert browser.find_element(By.CSS_SELECTOR, "#members td.client").text == "reader-app @ /127.0.0.1"
    points = chart_points(browser, "lag-chart")
    assert len(points) == 30 and points[-1] == 6  # the lag now, from the offsets table's history
    screenshots(browser, "group")

    Select(browser.find_element(By.ID, "reset-to")).select_by_value("earliest")
    browser.find_element(By.ID, "reset").submit()
    assert "(" in wait_banner(browser, "members")  # refused while the group has a member
    assert api.get("/groups/readers/offsets").json()["offsets"][0]["offset"] == 4
    api.delete(f"/groups/readers/members/{m['member_id']}")
    browser.find_element(By.ID, "reset").submit()
    assert "Reset 1 partition(s) of readme." in wait_banner(browser, "Reset 1")
    assert api.get("/groups/readers/offsets").json()["offsets"][0]["offset"] == 0


def test_schemas_list_their_versions_and_diff_them_side_by_side(server, api, browser, screenshots):
    v1 = {"type": "record", "name": "Person", "fields": [{"name": "name", "type": "string"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "email", "type": ["null", "string"], "default": None}]}
    created = api.post("/topics", json={"name": "people", "value_schema": {"schema": json.dumps(v1)}})
    assert created.status_code == 201, created.text
    r = api.post("/registry/subjects/people-value/versions", json={"schema": json.dumps(v2)})
    assert r.status_code == 200, r.text

    open_page(browser, server.url, "#/topics")  # the topic list names its value schema's subject
    assert "people-value" in browser.find_element(By.CSS_SELECTOR, 'tr[data-topic="people"]').text
    browser.find_element(By.LINK_TEXT, "Schemas").click()
    wait_ready(browser, "#/schemas")
    screenshots(browser, "subjects")
    cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, 'tr[data-subject="people-value"] td')]
    assert cells[:2] == ["people-value", "2"] and cells[2] == "AVRO" and cells[4] == "BACKWARD" and cells[5] == "people"
    browser.find_element(By.LINK_TEXT, "people-value").click()
    wait_ready(browser, "#/schema/people-value")
    added = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#schema-diff tr.added")]
    assert any('"email"' in line for line in added)  # version 2's new field, on the right only
    assert not browser.find_elements(By.CSS_SELECTOR, "#schema-diff tr.removed")
    screenshots(browser, "schemas")

    # an incompatible version (a new field without a default breaks BACKWARD): the registry's no
    v3 = {**v2, "fields": [*v2["fields"], {"name": "age", "type": "int"}]}
    fill(browser, "new-version", json.dumps(v3))
    browser.find_element(By.ID, "register").submit()
    refused = wait_banner(browser, "(INCOMPATIBLE_SCHEMA)")
    assert "field age is not in the writer's schema and has no default" in refused
    assert api.get("/registry/subjects/people-value/versions").json() == [1, 2]  # nothing registered
    # a compatible one (with a default) is kept
    v3["fields"][-1]["default"] = 0
    fill(browser, "new-version", json.dumps(v3))
    browser.find_element(By.ID, "register").submit()
    assert "Registered schema id" in wait_banner(browser, "Registered")
    assert api.get("/registry/subjects/people-value/versions").json() == [1, 2, 3]


def test_jobs_show_their_runs_and_run_now(server, api, browser, screenshots):
    """The Jobs page lists the jobs with their last runs (from _system/job_runs); "Run now" runs one
    in the gateway and the run, with what it did, appears."""
    api.post("/topics", json={"name": "expiring", "config": {"retention.ms": 1}})
    api.post("/topics/expiring/records", json={"records": [{"value": i} for i in range(5)]})
    open_page(browser, server.url, "#/jobs")
    panel = browser.find_element(By.CSS_SELECTOR, '[data-job="retention"]')
    assert "No runs yet." in panel.text
    browser.find_element(By.ID, "run-retention").click()
    assert "retention ran in" in wait_banner(browser, "retention ran")
    wait_ready(browser, "#/jobs")
    runs = browser.find_elements(By.CSS_SELECTOR, '[data-job="retention"] tr.ok')
    assert len(runs) == 1 and "request" in runs[0].text and "records_removed: 5" in runs[0].text
    assert api.get("/topics/expiring").json()["partition_offsets"][0]["log_start_offset"] == 5  # it did run
    (run,) = next(j for j in api.get("/jobs").json()["jobs"] if j["job"] == "retention")["runs"]
    assert run["ok"] and run["trigger"] == "request" and run["report"]["records_removed"] == 5
    assert api.post("/jobs/nope/runs", json={}).json()["error"]["code"] == "UNKNOWN_JOB"
    assert api.post("/jobs/retention/runs", content="x", headers={"content-type": "text/plain"}).status_code == 422
    screenshots(browser, "jobs")


def test_avro_values_are_decoded_through_the_registry_and_live_records_follow(server, api, browser):
    """A value in Confluent's framing is decoded with its schema from the registry (by the id in
    its first bytes); with "Follow live" on, records produced meanwhile appear as they commit."""
    import base64
    import io

    import fastavro

    schema = {
        "type": "record",
        "name": "Click",
        "namespace": "shop",
        "fields": [
            {"name": "user", "type": "string"},
            {"name": "n", "type": "long"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "ref", "type": ["null", "string"], "default": None},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["VIEW", "BUY"]}},
            {"name": "price", "type": "double"},
        ],
    }
    created = api.post("/topics", json={"name": "avro-clicks", "value_schema": {"schema": json.dumps(schema)}})
    assert created.status_code == 201, created.text
    schema_id = created.json()["value_schema"]["id"]

    def framed(value: dict) -> str:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
        return base64.b64encode(b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()).decode()

    first = {"user": "ann", "n": -3_000_000_000, "tags": ["a", "b"], "ref": None, "kind": "BUY", "price": 9.5}
    body = {"value_format": "binary", "records": [{"value": framed(first)}]}
    assert api.post("/topics/avro-clicks/records", json=body).status_code == 200

    def browsed(d):
        open_page(d, server.url, "#/messages/avro-clicks?from=earliest")
        return d.find_elements(By.CSS_SELECTOR, "#messages tr.record")

    (record,) = WebDriverWait(browser, WAIT).until(browsed)
    text = record.text
    assert f"avro (schema id {schema_id})" in text
    shown = json.loads(text[text.index("{") : text.rindex("}") + 1])
    assert shown == first  # every type, as fastavro wrote it

    browser.find_element(By.ID, "msg-follow").click()
    WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.ID, "msg-follow").text == "Stop following")
    second = {**first, "user": "bob", "n": 7, "tags": [], "ref": "r-1", "kind": "VIEW"}
    body = {"value_format": "binary", "records": [{"value": framed(second)}]}
    assert api.post("/topics/avro-clicks/records", json=body).status_code == 200
    WebDriverWait(browser, WAIT).until(lambda d: '"user": "bob"' in d.find_element(By.ID, "messages").text)
    browser.find_element(By.ID, "msg-follow").click()  # stop


def test_messages_page_through_a_partition_both_ways(server, api, browser):
    """Newest first by default; Older and Newer step a page at a time, whichever way the page reads."""
    assert api.post("/topics", json={"name": "pages"}).status_code == 201
    for i in range(0, 120, 40):
        api.post("/topics/pages/records", json={"records": [{"value": n} for n in range(i, i + 40)]})

    def offsets(d) -> list[int]:
        return [int(r.get_attribute("data-offset")) for r in d.find_elements(By.CSS_SELECTOR, "#messages tr.record")]

    def newest(d):
        open_page(d, server.url, "#/messages/pages")
        return offsets(d) if len(offsets(d)) == 50 and offsets(d)[0] == 119 else None

    assert WebDriverWait(browser, WAIT).until(newest) == list(range(119, 69, -1))  # the newest, newest first
    assert browser.find_element(By.ID, "msg-newer").get_attribute("disabled") is not None
    browser.find_element(By.ID, "msg-older").click()
    wait_ready(browser, "#/messages/pages?from=offset&offset=70&dir=backward")
    assert offsets(browser) == list(range(69, 19, -1))
    browser.find_element(By.ID, "msg-older").click()
    wait_ready(browser, "#/messages/pages?from=offset&offset=20&dir=backward")
    assert offsets(browser) == list(range(19, -1, -1))
    assert browser.find_element(By.ID, "msg-older").get_attribute("disabled") is not None  # the log start
    browser.find_element(By.ID, "msg-newer").click()
    wait_ready(browser, "#/messages/pages?from=offset&offset=20&dir=forward")
    assert offsets(browser) == list(range(20, 70))  # forward: oldest first
    # an offset left empty is the page's to refuse, not a silent 0
    open_page(browser, server.url, "#/messages/pages?from=offset&offset=")
    assert "Enter an offset" in banner(browser)


def test_a_page_of_another_site_cannot_write_through_the_browser(server, api, browser, tmp_path):
    """Without keys, a page the user opens elsewhere could post to the gateway (a no-cors fetch needs
    no CORS permission): the gateway refuses writes a browser marks as cross-origin."""
    import http.server
    import threading

    from tests.e2e.server import free_port

    assert api.post("/topics", json={"name": "csrf-target"}).status_code == 201
    (tmp_path / "evil.html").write_text("<html><body>another site</body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    other = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{other.server_address[1]}/evil.html")
        status = browser.execute_async_script(
            """const done = arguments[arguments.length - 1];
            const body = new Blob([JSON.stringify({records: [{value: "from another site"}]})]);
            Promise.all([
              fetch(arguments[0] + "/topics/csrf-target/records", {method: "POST", mode: "no-cors", body}),
              fetch(arguments[0] + "/topics", {method: "POST", mode: "no-cors", body: new Blob(['{"name": "csrf-made"}'])}),
            ]).then(() => done("sent"), (e) => done(String(e)));""",
            server.url,
        )
        assert status == "sent"
    finally:
        other.shutdown()
        other.server_close()
    assert api.get("/topics/csrf-target").json()["partition_offsets"][0]["high_watermark"] == 0  # nothing written
    assert "csrf-made" not in api.get("/topics").json()["topics"]  # nor created
    # the console itself (same origin) still writes
    open_page(browser, server.url, "#/messages/csrf-target")
    fill(browser, "produce-value", '"from the console"')
    browser.find_element(By.ID, "produce").submit()
    assert "Produced at offset 0" in wait_banner(browser, "Produced")


def test_what_a_limited_admin_key_sees_of_the_cluster_and_the_registry(secured):
    """A key with admin on orders-* topics and groups: the cluster's group lists, the partition
    leaders and the schema pages show only its own; a schema id only others use is not found."""
    admin = {"Authorization": "Bearer admin-key-0123456789"}
    team = {"Authorization": "Bearer team-admin-0123456789"}
    with httpx.Client(base_url=secured.url, timeout=60) as client:
        for group in ("orders-readers", "secret-readers"):
            r = client.post(
                "/groups/" + group + "/offsets",
                headers=admin,
                json={
                    "offsets": [
                        {"topic": "orders-1" if group.startswith("orders") else "secret", "partition": 0, "offset": 0}
                    ]
                },
            )
            assert r.status_code == 200, r.text
        ids = {}
        for topic in ("orders-1", "secret"):
            schema = {"type": "record", "name": topic.replace("-", "_"), "fields": [{"name": "a", "type": "string"}]}
            r = client.post(
                f"/registry/subjects/{topic}-value/versions", headers=admin, json={"schema": json.dumps(schema)}
            )
            assert r.status_code == 200, r.text
            ids[topic] = r.json()["id"]

        everything = client.get("/cluster", headers=admin).json()
        assert {"orders-readers", "secret-readers"} <= {g for gw in everything["gateways"] for g in gw["groups"]}
        seen = client.get("/cluster", headers=team).json()
        (gateway,) = seen["gateways"]
        assert gateway["groups"] == ["orders-readers"] and gateway["groups_total"] == 1
        assert gateway["tls"] is False and gateway["auth"] is True
        leaders = client.get("/cluster/partitions", headers=team).json()
        assert [t["topic"] for t in leaders["topics"]] == ["orders-1"] and leaders["next"] is None
        assert sum(leaders["gateways"].values()) == 1

        subjects = client.get("/schemas", headers=team).json()
        assert [s["subject"] for s in subjects["subjects"]] == ["orders-1-value"]
        assert subjects["subjects"][0]["topic"] == "orders-1" and subjects["subjects"][0]["compatibility"] == "BACKWARD"
        assert client.get(f"/registry/schemas/ids/{ids['orders-1']}", headers=team).status_code == 200
        hidden = client.get(f"/registry/schemas/ids/{ids['secret']}", headers=team)
        assert hidden.status_code == 404 and "secret" not in hidden.text
        assert client.get("/schemas").status_code == 401
