"""Idle topics cost no thread and give back their handles (issue 13): a real registry and tables."""

import threading
import time

import pytest

from delta_log.registry import TopicRegistry
from tests.integration.conftest import make_batch


def append(registry: TopicRegistry, topic: str) -> int:
    result = registry.committer(topic).submit(_request(topic)).result(timeout=60)
    return result.ranges[0].base_offset


def _request(topic: str):
    from delta_log.log.writer import AppendRequest

    return AppendRequest(batch=make_batch(1, topic=topic))


def registry_with(settings, section: str, **updates) -> TopicRegistry:
    """A registry whose settings differ from the fixture's in one section."""
    changed = getattr(settings, section).model_copy(update=updates)
    return TopicRegistry(settings.model_copy(update={section: changed}))


def thread_names() -> list[str]:
    return [t.name for t in threading.enumerate()]


def test_many_topics_share_a_few_threads(settings):
    registry = registry_with(settings, "maintenance", rollup_every_commits=2)
    try:
        names = [f"idle{i}" for i in range(40)]
        for name in names:
            registry.catalog.create_topic(name)
        for _ in range(2):  # two commits each: every topic's maintenance pass is due
            for name in names:
                append(registry, name)
        threads = thread_names()
        assert not [t for t in threads if "idle" in t]  # no thread is any topic's own
        assert len([t for t in threads if t.startswith("flush")]) <= settings.writer.flush_threads
        deadline = time.monotonic() + 30
        while not all(registry.maintenance(n) and registry.maintenance(n).rollup_reports for n in names):
            assert time.monotonic() < deadline, "maintenance passes did not run on the shared scheduler"
            time.sleep(0.1)
    finally:
        registry.close()


def quiet(registry: TopicRegistry, topics: list[str]) -> None:
    """Wait until no maintenance pass of `topics` is due or running (a topic with one is kept)."""
    deadline = time.monotonic() + 30
    while any((m := registry.maintenance(t)) is not None and m.busy for t in topics):
        assert time.monotonic() < deadline, "maintenance passes did not settle"
        time.sleep(0.05)


def test_idle_topics_give_back_their_handles_and_reopen(settings):
    registry = registry_with(settings, "maintenance", interval_s=0.05)
    try:
        for i in range(6):
            registry.catalog.create_topic(f"r{i}")
            assert append(registry, f"r{i}") == 0
        quiet(registry, [f"r{i}" for i in range(6)])
        vacuumed = registry.maintenance("r0").clock().last_run["vacuum"]
        # the least recently used beyond 4 open topics go first
        assert registry.release_idle(idle_s=3600, max_open=4) == ["r0", "r1"]
        assert set(registry.committers()) == {"r2", "r3", "r4", "r5"}
        # idle for long enough: all go
        assert sorted(registry.release_idle(idle_s=0, max_open=1000)) == ["r2", "r3", "r4", "r5"]
        assert registry.committers() == {}
        # used again: opened again, offsets continue, and its maintenance clock with it (a topic
        # released between bursts still reaches its vacuum)
        assert append(registry, "r0") == 1
        assert registry.reader("r0").high_watermark(0) == 2
        assert registry.maintenance("r0").clock().last_run["vacuum"] == vacuumed
    finally:
        registry.close()


def test_a_topic_with_waiting_requests_is_kept(settings):
    registry = registry_with(settings, "writer", linger_ms=500)
    try:
        registry.catalog.create_topic("busy")
        future = registry.committer("busy").submit(_request("busy"))  # lingering for 0.5 s
        assert registry.release_idle(idle_s=0, max_open=1000) == []
        assert future.result(timeout=30).ranges[0].base_offset == 0
    finally:
        registry.close()


def test_a_cancelled_request_does_not_stop_the_answers_to_its_flush(settings):
    registry = registry_with(settings, "writer", linger_ms=300)
    try:
        registry.catalog.create_topic("c")
        committer = registry.committer("c")
        first, second = committer.submit(_request("c")), committer.submit(_request("c"))
        assert first.cancel()  # its caller went away while the flush lingered
        assert second.result(timeout=30).ranges[0].count == 1
    finally:
        registry.close()


def test_a_closed_registry_refuses_new_writers(settings):
    from delta_log.errors import WriterClosedError

    registry = TopicRegistry(settings)
    registry.catalog.create_topic("z")
    registry.close()
    with pytest.raises(WriterClosedError):
        registry.committer("z")
