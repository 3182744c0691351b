"""`spark.readStream.format("topiclake")`: a Kafka-compatible source over topic tables (and, through
delta_log.spark.sink, Kafka's sink: `df.write` / `df.writeStream.format("topiclake")`).

Built on pyspark 4.2's Python data source API (DataSourceStreamReader with admission control and
Trigger.AvailableNow). It emits exactly Spark's Kafka source schema, takes the Kafka source's
options (see delta_log.spark.options), and tracks progress as per-partition offsets, so Kafka-reading
Spark code runs with the format name changed (and `root` instead of bootstrap servers):

    (spark.readStream.format("topiclake").option("root", "/data").option("subscribe", "orders")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 10000).load())

Records are read by offset with delta_log's reader (delta-rs + pyarrow) in the executors and handed
to Spark as Arrow batches; files rewritten by compaction or roll-up change nothing for it. With
`groupId`, offsets processed by each micro-batch are committed for that consumer group, so the
query shows up in lag views and `topiclake groups describe`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from conf import ReaderSettings, WriterSettings
from delta_log.errors import DataLossError, FencedMemberError, NotCoordinatorError, TopicNotFoundError
from delta_log.log.catalog import Catalog
from delta_log.log.reader import TopicReader
from delta_log.spark.options import (
    EARLIEST,
    LATEST,
    Offsets,
    SourceOptionError,
    SourceOptions,
    from_json_offsets,
    parse_options,
    plan_limited_end,
    to_json_offsets,
)
from delta_log.spark.sink import (
    SinkOptions,
    TopiclakeBatchWriter,
    TopiclakeStreamWriter,
    check_sink_schema,
    parse_sink_options,
    refuse_overwrite,
)
from delta_log.spark.typed import ValueParser, spark_ddl, value_parser
from delta_log.system.groups import GroupStore
from delta_log.system.offsets import OffsetCommit, OffsetStore
from delta_log.system.schemas import SchemaStore
from delta_log.table.storage import StorageRoot

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
HEADERS_SCHEMA = ", headers array<struct<key: string, value: binary>>"
READ_CHUNK = 100_000
#: A task reads one fixed range: its reader never needs to look for newer versions.
_TASK_READER = ReaderSettings(refresh_interval_s=3600)


class TopicPartitionRange(InputPartition):
    """One Spark task: offsets [start, end) of one topic partition."""

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        start: int,
        end: int,
        root: str,
        storage_options: Mapping[str, str],
        headers: bool,
        fail_on_data_loss: bool,
        parsed: ValueParser | None = None,
    ) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.root, self.storage_options = root, dict(storage_options)
        self.headers, self.fail_on_data_loss = headers, fail_on_data_loss
        self.parsed = parsed  # parseValues: how `value_parsed` is read


def read_range(part: TopicPartitionRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one partition's offsets [start, end), in offset order."""
    reader = TopicReader(StorageRoot(part.root, part.storage_options), part.topic, _TASK_READER)
    lso = reader.log_start_offset(part.partition)
    cur = part.start
    if cur < lso:
        if part.fail_on_data_loss:
            raise DataLossError(
                f"Offsets {cur}..{min(lso, part.end) - 1} of {part.topic}-{part.partition} are no longer "
                f"available (retention removed them; the log now starts at {lso}). Some data may have been "
                "lost. Set failOnDataLoss=false to continue from the log start offset, or restart the query "
                "with a new checkpoint."
            )
        cur = lso
    columns = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    if part.headers:
        columns.append("headers")
    while cur < part.end:
        res = reader.fetch(part.partition, cur, max_records=min(READ_CHUNK, part.end - cur), max_bytes=256 << 20)
        table = res.records
        if table.num_rows == 0:
            break
        if pc.max(table.column("offset")).as_py() >= part.end:
            table = table.filter(pc.less(table.column("offset"), part.end))
        table = table.select(columns)
        if part.parsed is not None:
            table = table.append_column("value_parsed", part.parsed.column(table.column("value")))
        yield from table.to_batches()
        cur = res.next_offset


def _value_parser(options: SourceOptions, storage: StorageRoot) -> ValueParser | None:
    """parseValues: how `value_parsed` is read (None without the option)."""
    if not options.parse_values:
        return None
    topics = options.topics(Catalog(storage, WriterSettings()).list_topics())
    return value_parser(SchemaStore.open_if_exists(storage), topics)


class _Planner:
    """Driver-side offset resolution shared by the batch and the stream reader."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.storage = StorageRoot(options.root, options.storage_options)
        self._readers: dict[str, TopicReader] = {}
        self.value_parser = _value_parser(options, self.storage)

    def topics(self) -> list[str]:
        existing = Catalog(self.storage, WriterSettings()).list_topics()
        topics = self.options.topics(existing)
        missing = [t for t in topics if t not in existing]
        if missing and not self.options.subscribe_pattern:
            raise SourceOptionError(
                f"Topic {missing[0]!r} does not exist under {self.storage.root}. Create it, or check the root option.",
                topic=missing[0],
            )
        return [t for t in topics if t in existing]

    def reader(self, topic: str) -> TopicReader:
        r = self._readers.get(topic)
        if r is None:
            try:
                r = self._readers[topic] = TopicReader(self.storage, topic)
            except TopicNotFoundError as exc:
                raise SourceOptionError(f"Topic {topic!r} does not exist.", topic=topic) from exc
        else:
            r.refresh()
        return r

    def bounds(self) -> dict[str, dict[int, tuple[int, int]]]:
        """(log start offset, high watermark) per subscribed partition, now."""
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for t in self.topics():
            parts = {p.partition: (p.log_start_offset, p.high_watermark) for p in self.reader(t).partition_offsets()}
            if self.options.assign:
                parts = {p: b for p, b in parts.items() if p in self.options.assign.get(t, ())}
            out[t] = parts
        return out

    def latest(self) -> Offsets:
        return {t: {p: hw for p, (_, hw) in ps.items()} for t, ps in self.bounds().items()}

    def resolve(self, spec: str | Offsets, default: int) -> Offsets:
        bounds = self.bounds()
        out: Offsets = {}
        for t, parts in bounds.items():
            out[t] = {}
            for p, (lso, hw) in parts.items():
                if spec == "earliest":
                    want = EARLIEST
                elif spec == "latest":
                    want = LATEST
                else:
                    assert isinstance(spec, dict)
                    want = spec.get(t, {}).get(p, default)
                out[t][p] = lso if want == EARLIEST else hw if want == LATEST else want
        return out

    def starting(self) -> Offsets:
        o = self.options
        if o.starting_by_timestamp or o.starting_timestamp is not None:
            out: Offsets = {}
            for t, parts in self.bounds().items():
                out[t] = {}
                for p, (_, hw) in parts.items():
                    ts = (o.starting_by_timestamp or {}).get(t, {}).get(p, o.starting_timestamp)
                    found = self.reader(t).offset_for_timestamp(p, ts) if ts is not None else None
                    out[t][p] = hw if found is None else found
            return out
        return self.resolve(o.starting, LATEST)

    def ranges(self, start: Offsets, end: Offsets) -> list[TopicPartitionRange]:
        """Tasks for offsets start..end; partitions new since `start` begin at their log start."""
        bounds = self.bounds()
        out = []
        for t, parts in sorted(end.items()):
            for p, e in sorted(parts.items()):
                s = start.get(t, {}).get(p)
                if s is None:
                    s = bounds.get(t, {}).get(p, (0, 0))[0]
                if e > s:
                    out.append(
                        TopicPartitionRange(
                            topic=t,
                            partition=p,
                            start=s,
                            end=e,
                            root=self.options.root,
                            storage_options=self.options.storage_options,
                            headers=self.options.include_headers,
                            fail_on_data_loss=self.options.fail_on_data_loss,
                            parsed=self.value_parser,
                        )
                    )
        return out

    def commit_group(self, end: Offsets) -> None:
        """Commit processed offsets for `groupId`, under the group's coordinator epoch: refused
        while the group has HTTP members, and fenced by Delta if a gateway takes the group over
        (commits `coord-<group>` epoch + 1) between that check and the commit. Not fenced: a member
        joining, between the check and the commit, through the gateway that already holds the
        epoch (no new claim); its first fetch then starts from this commit."""
        group = self.options.group_id
        if not group:
            return
        store = OffsetStore(self.storage)
        epoch = store.coordinator_epoch(group)
        state = GroupStore(self.storage).load().get(group)
        if state is not None and state.members:
            raise _group_in_use(group)
        now_us = int(time.time() * 1e6)
        try:
            store.commit(
                [
                    OffsetCommit(
                        group=group, topic=t, partition=p, offset=o, metadata="spark", commit_timestamp_us=now_us
                    )
                    for t, ps in end.items()
                    for p, o in ps.items()
                ],
                fence=(group, epoch),
            )
        except NotCoordinatorError as exc:
            raise _group_in_use(group) from exc


def _group_in_use(group: str) -> FencedMemberError:
    return FencedMemberError(
        f"Consumer group {group!r} has active HTTP members; a Spark query cannot commit for it. "
        "Use a groupId of its own.",
        group=group,
    )


class TopiclakeDataSource(DataSource):
    """Register with `spark.dataSource.register(bind_source(root, storage_options))` (get_spark() does,
    from settings); a query's `root` and `storage.<key>` options override those defaults."""

    default_root: ClassVar[str] = "data"
    default_storage_options: ClassVar[dict[str, str]] = {}

    @classmethod
    def name(cls) -> str:
        return "topiclake"

    def _options(self, streaming: bool) -> SourceOptions:
        return parse_options(
            dict(self.options),
            default_root=self.default_root,
            default_storage_options=self.default_storage_options,
            streaming=streaming,
        )

    def schema(self) -> str:
        given = {k.lower(): str(v).lower() for k, v in dict(self.options).items()}
        headers = HEADERS_SCHEMA if given.get("includeheaders") == "true" else ""
        if given.get("parsevalues") != "true":  # the Kafka schema (writes never get further)
            return KAFKA_SCHEMA + headers
        options = self._options(streaming=False)
        parser = _value_parser(options, StorageRoot(options.root, options.storage_options))
        assert parser is not None, "parseValues is set"
        return f"{KAFKA_SCHEMA}{headers}, value_parsed {spark_ddl(parser.arrow)}"

    def _sink_options(self, schema: StructType, overwrite: bool) -> SinkOptions:
        refuse_overwrite(overwrite)
        options = parse_sink_options(
            dict(self.options), default_root=self.default_root, default_storage_options=self.default_storage_options
        )
        check_sink_schema(schema, options.topic)
        return options

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return TopiclakeBatchWriter(self._sink_options(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return TopiclakeStreamWriter(self._sink_options(schema, overwrite))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TopiclakeBatchReader(self._options(streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TopiclakeStreamReader(self._options(streaming=True))


def _read(partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
    """A planned range's records. With no range to read (an empty topic) Spark still runs one task
    with a partition of its own: it reads nothing."""
    if isinstance(partition, TopicPartitionRange):
        yield from read_range(partition)


class TopiclakeBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        planner = _Planner(self.options)
        return planner.ranges(
            planner.starting()
            if self.options.starting != "earliest"
            or self.options.starting_timestamp
            or self.options.starting_by_timestamp
            else planner.resolve("earliest", EARLIEST),
            planner.resolve(self.options.ending, LATEST),
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition)


class TopiclakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.planner = _Planner(options)
        self._target: Offsets | None = None
        self._group_committed: dict | None = None

    def initialOffset(self) -> dict:
        return to_json_offsets(self.planner.starting())

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.planner.latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # Spark asks for the next batch only after the previous one (ending at `start`) completed;
        # commit() alone would miss the last batch of an availableNow run.
        self._commit_group(start)
        bounds = self.planner.bounds()
        latest = {t: {p: hw for p, (_, hw) in ps.items()} for t, ps in bounds.items()}
        if self._target is not None:  # availableNow: never past what existed when the query began
            latest = {
                t: {p: min(hw, self._target.get(t, {}).get(p, hw)) for p, hw in ps.items()}
                for t, ps in latest.items()
                if t in self._target
            }
        begun = from_json_offsets(start)
        filled = {t: {p: begun.get(t, {}).get(p, bounds[t][p][0]) for p in ps} for t, ps in latest.items()}
        end = plan_limited_end(filled, latest, limit.max_rows) if isinstance(limit, ReadMaxRows) else latest
        # a partition never moves backwards (e.g. an offset a query committed beyond a restored root)
        end = {t: {p: max(o, filled[t][p]) for p, o in ps.items()} for t, ps in end.items()}
        for t, ps in begun.items():  # keep partitions of topics no longer matched
            end.setdefault(t, dict(ps))
        return to_json_offsets(end)

    def reportLatestOffset(self) -> dict | None:
        return to_json_offsets(self.planner.latest())

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.planner.ranges(from_json_offsets(start), from_json_offsets(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition)

    def commit(self, end: dict) -> None:
        self._commit_group(end)

    def _commit_group(self, offsets: dict) -> None:
        if self.options.group_id and offsets and offsets != self._group_committed:
            self.planner.commit_group(from_json_offsets(offsets))
            self._group_committed = offsets


def bind_source(root: str, storage_options: Mapping[str, str]) -> type[TopiclakeDataSource]:
    """The data source with `root` and `storage_options` as defaults (resolved by the entry point,
    `get_spark`, from settings: delta_log reads no environment)."""
    return type(
        "TopiclakeDataSource",
        (TopiclakeDataSource,),
        {"default_root": root, "default_storage_options": dict(storage_options)},
    )
