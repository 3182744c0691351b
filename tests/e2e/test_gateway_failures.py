"""Crash, back-pressure and auth: each against its own real server process."""

import threading

import httpx
import pytest
from deltalake import DeltaTable

from tests.e2e.load import ProduceLoad, check_acked_once
from tests.e2e.server import ServerProcess


def test_sigkill_under_load_loses_no_acked_record(tmp_path):
    srv = ServerProcess(tmp_path / "data").start()
    httpx.post(srv.url + "/topics", json={"name": "load", "partitions": 2}).raise_for_status()
    load = ProduceLoad(srv.url, "load").start()
    load.wait_for(40)
    srv.kill9()
    load.stop()
    assert len(load.acked) >= 40

    srv2 = ServerProcess(tmp_path / "data", port=srv.port).start()
    try:
        stored = DeltaTable(str(tmp_path / "data/topics/load")).to_pyarrow_table().to_pylist()
        check_acked_once(stored, load.acked, 2)
        # the restarted server continues at the high watermark
        info = httpx.get(srv2.url + "/topics/load").json()
        r = httpx.post(srv2.url + "/topics/load/records", json={"records": [{"value": 1, "partition": 0}]})
        hw0 = info["partition_offsets"][0]["high_watermark"]
        assert r.json()["offsets"][0]["offset"] == hw0
    finally:
        srv2.stop()


def test_back_pressure_429_with_retry_after(tmp_path):
    env = {
        "TOPICLAKE_WRITER__MAX_QUEUE_BYTES": "2000",
        "TOPICLAKE_WRITER__LINGER_MS": "1000",  # the first waits; those sent with it are refused
        "TOPICLAKE_WRITER__BATCH_BYTES": "100000000",
        "TOPICLAKE_SERVER__MAX_REQUEST_BYTES": "20000",
    }
    srv = ServerProcess(tmp_path / "data", env=env).start()
    try:
        httpx.post(srv.url + "/topics", json={"name": "bp"}).raise_for_status()
        results = []
        together = threading.Barrier(8)

        def go() -> None:
            together.wait(30)
            r = httpx.post(srv.url + "/topics/bp/records", json={"records": [{"value": "x" * 500}] * 3}, timeout=30)
            results.append(r)

        threads = [threading.Thread(target=go) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        refused = [r for r in results if r.status_code == 429]
        ok = [r for r in results if r.status_code == 200]
        assert refused and ok
        assert refused[0].json()["error"]["code"] == "BACK_PRESSURE" and refused[0].headers["Retry-After"]
        info = httpx.get(srv.url + "/topics/bp").json()
        assert info["partition_offsets"][0]["high_watermark"] == 3 * len(ok)  # refused wrote nothing
        big = httpx.post(srv.url + "/topics/bp/records", json={"records": [{"value": "y" * 30_000}]}, timeout=30)
        assert big.status_code == 413 and big.json()["error"]["code"] == "REQUEST_TOO_LARGE"
        gz = httpx.post(
            srv.url + "/topics/bp/records",
            content=__import__("gzip").compress(b'{"records": [' + b'{"value": 1},' * 5000 + b'{"value": 1}]}'),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            timeout=30,
        )
        assert gz.status_code == 413  # the limit applies to the decompressed body too (no zip bombs)
        after = httpx.get(srv.url + "/topics/bp").json()["partition_offsets"][0]["high_watermark"]
        assert after == 3 * len(ok)
    finally:
        srv.stop()


@pytest.fixture
def auth_server(tmp_path):
    cfg = tmp_path / "auth.toml"
    cfg.write_text(
        '[[auth.api_keys]]\nkey = "etl-secret"\nprincipal = "etl"\nacls = { "orders-*" = ["produce", "consume"] }\n'
        '[[auth.api_keys]]\nkey = "ops-secret"\nprincipal = "ops"\nacls = { "*" = ["admin"] }\n'
    )
    srv = ServerProcess(tmp_path / "data", env={"TOPICLAKE_CONFIG": str(cfg)}).start()
    yield srv
    srv.stop()


def test_auth(auth_server):
    url = auth_server.url
    ops = {"Authorization": "Bearer ops-secret"}
    etl = {"Authorization": "Bearer etl-secret"}
    r = httpx.post(url + "/topics", json={"name": "orders-eu"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
    r = httpx.post(url + "/topics", json={"name": "orders-eu"}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    r = httpx.post(url + "/topics", json={"name": "orders-eu"}, headers=etl)
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    assert httpx.get(url + "/topics", headers=ops).json()["topics"] == []  # nothing created by refusals
    assert httpx.post(url + "/topics", json={"name": "orders-eu"}, headers=ops).status_code == 201
    assert httpx.post(url + "/topics", json={"name": "payments"}, headers=ops).status_code == 201
    body = {"records": [{"value": 1}]}
    assert httpx.post(url + "/topics/orders-eu/records", json=body, headers=etl).status_code == 200
    r = httpx.post(url + "/topics/payments/records", json=body, headers=etl)
    assert r.status_code == 403
    assert httpx.post(url + "/topics/orders-eu/records", json=body).status_code == 401
    assert httpx.get(url + "/topics", headers=etl).json()["topics"] == ["orders-eu"]
    assert httpx.delete(url + "/topics/orders-eu", headers=etl).status_code == 403
    info = httpx.get(url + "/topics/payments", headers=ops).json()
    assert info["partition_offsets"][0]["high_watermark"] == 0  # the refused produce wrote nothing
    assert httpx.get(url + "/healthz").status_code == 200
