"""TLS as users run it: `topiclake serve --ssl-certfile/--ssl-keyfile` with a certificate the test
makes, the Python clients and the CLI over https with a CA file; plain http refused on that port;
and mutual TLS, where the server verifies client certificates."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
import trustme

from tests.e2e.server import REPO, ServerProcess
from topiclake import AdminClient, Consumer, Producer


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    authority = trustme.CA()
    server_cert = authority.issue_cert("127.0.0.1", "localhost")
    server_cert.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    authority.cert_pem.write_to_path(str(d / "ca.pem"))
    client_cert = authority.issue_cert("client@example.com")
    client_cert.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    return d


@pytest.fixture(scope="module")
def tls_server(ca, tmp_path_factory):
    pem = str(ca / "server.pem")
    srv = ServerProcess(
        tmp_path_factory.mktemp("tls") / "data",
        args=["--ssl-certfile", pem, "--ssl-keyfile", pem],
        ca_file=str(ca / "ca.pem"),
    ).start()
    yield srv
    srv.stop()


def test_the_kafka_port_speaks_tls_with_the_same_certificate(tls_server, ca):
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import KafkaException
    from confluent_kafka import Producer as KafkaProducer
    from confluent_kafka.admin import AdminClient as KafkaAdmin
    from confluent_kafka.admin import NewTopic

    tls = {"bootstrap.servers": tls_server.kafka, "security.protocol": "SSL", "ssl.ca.location": str(ca / "ca.pem")}
    admin = KafkaAdmin(tls)
    admin.create_topics([NewTopic("secure-kafka", 1, 1)])["secure-kafka"].result(30)
    p = KafkaProducer(tls)
    p.produce("secure-kafka", b"over tls")
    assert p.flush(30) == 0
    # requests of megabytes (received in place, through TLS records of 16 KB), every one acked
    big = KafkaProducer({**tls, "linger.ms": 50, "batch.size": 4 << 20, "compression.type": "none"})
    failed: list[object] = []
    for i in range(4000):
        big.produce("secure-kafka", bytes([i % 256]) * 1000, on_delivery=lambda err, _: err and failed.append(err))
    assert big.flush(60) == 0 and failed == []
    c = KafkaConsumer({**tls, "group.id": "tls-kafka", "auto.offset.reset": "earliest"})
    c.subscribe(["secure-kafka"])
    msg = None
    for _ in range(60):
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            break
    c.close()
    assert msg is not None and msg.value() == b"over tls"
    plain = KafkaAdmin({"bootstrap.servers": tls_server.kafka})  # plaintext on the TLS port gets nowhere
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)


def test_clients_produce_and_fetch_over_https(tls_server, ca):
    assert tls_server.url.startswith("https://")
    cafile = str(ca / "ca.pem")
    with AdminClient(tls_server.url, ca_file=cafile) as admin:
        admin.create_topic("secure", partitions=2)
    with Producer(tls_server.url, ca_file=cafile) as p:
        metas = [p.send("secure", value={"n": i}, key=f"k{i}") for i in range(20)]
        assert [m.result(timeout=30).offset >= 0 for m in metas] == [True] * 20
    c = Consumer(tls_server.url, group_id="tls-group", auto_offset_reset="earliest", ca_file=cafile)
    c.subscribe(["secure"])
    got = []
    for _ in range(20):
        got += c.poll(timeout=1.0)
        if len(got) >= 20:
            break
    c.close()
    assert sorted(json.loads(r.value)["n"] for r in got) == list(range(20))
    out = subprocess.run(
        [sys.executable, "-m", "topiclake", "--url", tls_server.url, "--ca-file", cafile, "topics", "list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert out.returncode == 0 and "secure" in out.stdout, out.stderr


def test_plain_http_and_untrusted_clients_are_refused(tls_server):
    plain = tls_server.url.replace("https://", "http://")
    with pytest.raises(httpx.TransportError):
        httpx.get(plain + "/healthz", timeout=5)
    with pytest.raises(httpx.ConnectError):  # the system's CAs do not know the test CA
        httpx.get(tls_server.url + "/healthz", timeout=5)
    assert httpx.get(tls_server.url + "/healthz", verify=tls_server.verify, timeout=5).status_code == 200


def test_mutual_tls_requires_a_client_certificate(ca, tmp_path_factory):
    pem, cafile = str(ca / "server.pem"), str(ca / "ca.pem")
    srv = ServerProcess(
        tmp_path_factory.mktemp("mtls") / "data",
        args=["--ssl-certfile", pem, "--ssl-keyfile", pem, "--ssl-ca-certs", cafile],
        env={"TOPICLAKE_SERVER__SSL_CLIENT_AUTH": "optional"},  # so the readiness probe can connect
        ca_file=cafile,
    ).start()
    try:
        client = str(ca / "client.pem")
        with AdminClient(srv.url, ca_file=cafile, client_cert=(client, client)) as admin:
            assert admin.list_topics() == []
    finally:
        srv.stop()
    required = ServerProcess(
        tmp_path_factory.mktemp("mtls-required") / "data",
        args=["--ssl-certfile", pem, "--ssl-keyfile", pem, "--ssl-ca-certs", cafile, "--ssl-client-auth", "required"],
        ca_file=cafile,
    )
    with pytest.raises(RuntimeError):  # its health check (no client certificate) cannot connect
        required.start(timeout=8)
    required.stop()
