"""Idle topics cost no thread and give back their handles (issue 13), and a deleted topic's
handles let nothing write into it: a real registry and tables."""

import threading
import time
from pathlib import Path

import pytest

from delta_log.errors import TopicNotFoundError, WriterClosedError
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


def _append_until(registry: TopicRegistry, topic: str, stop: threading.Event, outcomes: list[str]) -> None:
    """Append to `topic` until `stop`, noting each outcome: "appended", or "gone" (not found)."""
    while not stop.is_set():
        try:
            append(registry, topic)
            outcomes.append("appended")
        except WriterClosedError:  # its writer closed by the deletion: asked for again, as produce does
            continue
        except TopicNotFoundError:
            outcomes.append("gone")
            time.sleep(0.01)


def test_a_topic_deleted_while_appends_keep_coming_is_gone_whole(settings):
    """Appends racing a deletion (a committed transaction landing, a producer that has not stopped)
    never fail it, never bring the topic back, and are refused as for a deleted topic; nor does a
    checkpoint of the topic's last commits write into the deleted table (either failed the deletion
    with "Directory not empty", or left a `_delta_log` behind)."""
    registry = registry_with(settings, "writer", checkpoint_interval=1, checkpoint_min_interval_s=0)
    try:
        for round_ in range(5):
            topic = f"doomed{round_}"
            registry.catalog.create_topic(topic, partitions=4)
            stop = threading.Event()
            outcomes: list[str] = []
            threads = [threading.Thread(target=_append_until, args=(registry, topic, stop, outcomes)) for _ in range(3)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60
            while outcomes.count("appended") < 20:
                assert time.monotonic() < deadline and all(t.is_alive() for t in threads), outcomes[-5:]
                time.sleep(0.01)
            registry.delete_topic(topic)
            time.sleep(0.3)  # appends go on being refused
            stop.set()
            for t in threads:
                t.join()
            assert outcomes[-1] == "gone"
            assert not (Path(settings.root) / "topics" / topic).exists()
            with pytest.raises(TopicNotFoundError):
                registry.describe_topic(topic)
    finally:
        registry.close()
