import itertools

import httpx
import pytest

from tests.e2e.server import ServerProcess

_ids = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("srv") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
def topic(http):
    """A fresh topic with 3 partitions; returns its name."""
    name = f"e2e-{next(_ids)}"
    assert http.post("/topics", json={"name": name, "partitions": 3}).status_code == 201
    return name


def hw(http, topic):
    info = http.get(f"/topics/{topic}").json()
    return {p["partition"]: p["high_watermark"] for p in info["partition_offsets"]}
