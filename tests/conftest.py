"""Markers by directory (unit, integration, spark, e2e; a test using `spark` is marked spark too),
and the one SparkSession a test run shares."""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from conf import load_settings

# Property tests check what is true, not how fast: the default 200 ms deadline per example fails
# them on a loaded 2-core machine (and Hypothesis then reports the test as flaky).
hypothesis_settings.register_profile("topiclake", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("topiclake")

# Every server a test starts (apps in-process, `topiclake serve` processes) serves Kafka on a free
# port: the default 9092 would collide between servers (tests that speak Kafka ask for the port).
os.environ.setdefault("TOPICLAKE_KAFKA__PORT", "0")
# The shared session (and the processes tests start) keep Spark's in-memory catalog; the catalog's
# own tests (tests/e2e/test_catalog.py, test_sql_endpoint.py) start sessions on a root's metastore in processes of their own.
os.environ.setdefault("TOPICLAKE_CATALOG__ENABLED", "false")
# The JVMs tests start in processes of their own (Spark sessions of jobs, notebooks' kernels and
# workers, the metastore, Kafka's tools, Streams, Connect, Java clients) live for seconds to minutes:
# JIT-compile with C1 only and skip G1's concurrent threads. On 2 cores a Spark session starts in
# ~20-25 s rather than ~30-40 s; what the JVMs compute is the same. The shared session (below) lives
# for the whole run, where C2's code pays off: it starts without them.
SHORT_JVMS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("JDK_JAVA_OPTIONS", SHORT_JVMS)

_MARKS = {"integration": "integration", "spark": "spark", "e2e": "e2e"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for folder, mark in _MARKS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, mark))
        if _uses_spark(item):
            item.add_marker(pytest.mark.spark)
    if getattr(config.option, "numprocesses", None):
        _distribute(items)


def _distribute(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs a worker a core, `--dist loadgroup`): the tests of the
    shared SparkSession run on one worker, so a run still starts one session; every other module's
    tests on one worker, so its module-scoped servers start once. The workers take these groups in
    the order left here: the Spark tests first (the longest group), then the modules that start
    servers and JVMs, the in-process ones last to even out the end."""
    order = {"e2e": 1, "s3": 1, "console": 1, "integration": 2, "unit": 3}

    def rank(item: pytest.Item) -> int:
        if _uses_spark(item):
            return 0
        parts = pathlib.Path(str(item.fspath)).parts
        return next((v for k, v in order.items() if k in parts), 1)

    for item in items:
        item.add_marker(pytest.mark.xdist_group("spark" if _uses_spark(item) else item.nodeid.split("::")[0]))
    items.sort(key=rank)


def _uses_spark(item: pytest.Item) -> bool:
    """Whether the test uses the shared SparkSession (the `spark` fixture, directly or not)."""
    return "spark" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One SparkSession with delta-spark (and s3a, for tests/s3) for the whole test run."""
    from delta_log.spark import get_spark

    warehouse = tmp_path_factory.mktemp("warehouse")
    settings = load_settings(
        spark={"master": "local[2]", "s3a": True, "conf": {"spark.sql.warehouse.dir": str(warehouse)}}
    )
    short = os.environ.get("JDK_JAVA_OPTIONS") == SHORT_JVMS
    if short:
        del os.environ["JDK_JAVA_OPTIONS"]
    try:
        session = get_spark(settings, app_name="topiclake-tests")
    finally:
        if short:
            os.environ["JDK_JAVA_OPTIONS"] = SHORT_JVMS
    yield session
    session.stop()
