"""The broker's produce and fetch services (broker.produce.ProduceService, broker.fetch.FetchService),
called as every face calls them, on a real registry, real Delta tables and the commit notifier."""

from __future__ import annotations

import asyncio
import time

import pyarrow as pa
import pytest

from broker.fetch import FetchPart, FetchService
from broker.notifier import CommitNotifier
from broker.produce import Decoded, Produce, ProduceService
from delta_log.core.acl import ANONYMOUS, principal_of
from delta_log.errors import AuthorizationError, PartitionNotFoundError
from delta_log.registry import TopicRegistry

WRITER = principal_of("writer", {"open": ["produce", "consume"]}, None)


@pytest.fixture
def registry(settings):
    reg = TopicRegistry(settings)
    for name in ("open", "closed"):
        reg.catalog.create_topic(name, partitions=2)
    yield reg
    reg.close()


def _records(*values: bytes, partition: int | None = None) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "partition": pa.array([partition] * n, pa.int64()),
        }
    )


def _unit(topic: str, table: pa.Table, decoded: list[str], **kw) -> Produce:
    def decode() -> Decoded:
        decoded.append(topic)
        return Decoded(table)

    return Produce(topic=topic, decode=decode, size=table.nbytes, **kw)


def test_produce_checks_the_acl_and_the_named_partition_before_decoding(registry):
    async def main() -> None:
        service = ProduceService(registry)
        decoded: list[str] = []
        units = [
            _unit("open", _records(b"a", partition=0), decoded, partition=0),
            _unit("closed", _records(b"b", partition=0), decoded, partition=0),
            _unit("open", _records(b"c", partition=5), decoded, partition=5),
        ]
        await service.produce(WRITER, units)
        assert decoded == ["open"]  # the refused units' records were never decoded
        assert isinstance(units[1].error, AuthorizationError)
        assert isinstance(units[2].error, PartitionNotFoundError)
        acked = await service.acked(units[0])
        assert acked.base_offset == 0 and not acked.duplicate
        with pytest.raises(AuthorizationError):
            await service.acked(units[1])

    asyncio.run(main())
    assert registry.reader("open").high_watermark(0) == 1
    assert registry.reader("closed").high_watermark(0) == 0


def test_one_request_lands_in_one_commit_per_topic(settings):
    """The service hands every unit of a request to the writer before it waits for any: they land in
    the flush the first one opens (its linger, 50 ms here, so that a thread switch on a busy machine,
    5 ms, cannot let the flush go before the second unit is queued)."""
    from deltalake import DeltaTable

    registry = TopicRegistry(
        settings.model_copy(update={"writer": settings.writer.model_copy(update={"linger_ms": 50.0})})
    )
    registry.catalog.create_topic("open", partitions=2)

    async def main() -> list:
        service = ProduceService(registry)
        units = [_unit("open", _records(b"x%d" % p, partition=p), [], partition=p) for p in (0, 1)]
        await service.produce(ANONYMOUS, units)
        return [await service.acked(u) for u in units]

    uri = registry.storage.topic_uri("open")
    before = DeltaTable(uri).version()
    try:
        acked = asyncio.run(main())
    finally:
        registry.close()
    assert [a.base_offset for a in acked] == [0, 0]
    assert DeltaTable(uri).version() == before + 1  # both partitions' records, one flush


def test_a_long_poll_sleeps_until_a_commit_and_refuses_a_topic_at_once(registry):
    async def main() -> tuple[float, float, list[FetchPart]]:
        loop = asyncio.get_running_loop()
        notifier = CommitNotifier(loop, reader=registry.reader)
        registry.add_commit_listener(notifier.on_commit)
        fetch, produce = FetchService(registry, notifier), ProduceService(registry)

        started = time.monotonic()
        refused = [FetchPart("closed", 0, 0, 1 << 20), FetchPart("open", 0, 0, 1 << 20)]
        await fetch.fetch(WRITER, refused, max_bytes=1 << 20, max_records=100, max_wait_s=5.0)
        refused_after = time.monotonic() - started  # an error is news: no waiting

        waiting = [FetchPart("open", 1, 0, 1 << 20)]
        started = time.monotonic()
        poll = asyncio.create_task(fetch.fetch(WRITER, waiting, max_bytes=1 << 20, max_records=100, max_wait_s=20.0))
        await asyncio.sleep(0.3)
        assert not poll.done()  # asleep: nothing to read yet
        unit = _unit("open", _records(b"late", partition=1), [], partition=1)
        await produce.produce(WRITER, [unit])
        await produce.acked(unit)
        await asyncio.wait_for(poll, 10)
        woken_after = time.monotonic() - started
        await notifier.close()
        return refused_after, woken_after, refused + waiting

    refused_after, woken_after, (closed, empty, woken) = asyncio.run(main())
    assert isinstance(closed.error, AuthorizationError) and empty.error is None
    assert refused_after < 2.0
    assert woken.error is None and woken.result is not None
    assert woken.result.records.column("value").to_pylist() == [b"late"]
    assert woken_after < 10.0  # woken by the commit, long before the 20 s deadline
