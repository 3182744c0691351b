"""An S3 root on a real MinIO server (tests/s3/minio.py) for every test under tests/s3.

Without a MinIO binary (no Go to build it) the tests are skipped, with the reason; CI sets
TOPICLAKE_REQUIRE_S3=1, which turns that skip into a failure.
"""

from __future__ import annotations

import os
import uuid

import pytest

from conf import load_settings
from delta_log import StorageRoot
from tests.integration.conftest import catalog, topic_factory  # on this folder's `storage`
from tests.s3.minio import MinioServer, unavailable_reason

__all__ = ["catalog", "topic_factory"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/s3/" in str(item.fspath):
            item.add_marker(pytest.mark.s3)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def minio():
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("TOPICLAKE_REQUIRE_S3"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = MinioServer().start()
    # the standard AWS variables, as a user sets them: every process a test starts inherits them
    saved = {k: os.environ.get(k) for k in server.storage_options()}
    os.environ.update(server.storage_options())
    yield server
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture
def settings(minio):
    return load_settings(root=minio.root(f"t-{uuid.uuid4().hex[:8]}"))


@pytest.fixture
def storage(settings):
    return StorageRoot(settings.root, settings.storage_options)
