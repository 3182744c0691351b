"""`df.write.format("topiclake")` and `df.writeStream.format("topiclake")`: Kafka's sink, exactly once.

Takes Kafka's sink columns: `value` (string or binary, required), `key` (string or binary),
`topic` (string; the `topic` option overrides it, as in Kafka), `partition` (int) and `headers`
(array<struct<key string, value binary>>); topiclake also takes a `timestamp` column (CreateTime).
Other columns are ignored, as Kafka's sink does. Keys are partitioned with murmur2 as Kafka's
producer does; records without key or partition go, sticky, to one partition per chunk.

Tasks stage, the driver commits (Spark's own file commit protocol): each task validates and
partitions its rows and stages them as Arrow files under `<root>/_system/sink-staging/`; the job's
commit (on the driver) hands them to the topic, then deletes them:

- through a live gateway of the root (option `gateway`: `auto`, the default, finds one in the root's
  gateway membership; a URL list; or `none`), as idempotent Arrow produce requests (`apiToken`,
  `caFile` when the gateway wants them), so its group commit takes the sink's records between its
  own and it authorizes them as any producer's;
- else (no gateway, or one that does not answer) appended directly through one writer per topic,
  by the same writer rules (offsets from the `hw-<p>` transaction high watermarks, never a duplicate
  offset beside live gateways).

Measured (bench/sink_bench.py): with every task appending to the topic itself, two tasks writing
the same partitions conflicted on every commit, each retry rewriting its files, and gave up after 50
conflicts; one direct writer beside a busy gateway lost every commit the same way. Each commit is an
idempotent producer request:

- streaming: producer `spark-<query id>`, sequence = the micro-batch id, one commit (or request) per
  topic and micro-batch, so a micro-batch that Spark replays after a crash (it had not recorded it as
  done) is a duplicate and appends nothing, however its rows are split among tasks the second time.
  Kafka's sink is at-least-once here; this one is exactly once. The driver holds a micro-batch's
  records for a topic in memory: bound them with `maxOffsetsPerTrigger` (a request over the
  gateway's `server.max_request_bytes` is appended directly);
- batch: producers `spark-write-<id>-<lane>`: through a gateway, requests of about 8 MiB on 4
  connections at once; directly, commits of up to `maxRecordsPerCommit` records (default 500,000).
  Nothing is visible before every task has succeeded.

Topics must exist (create them first, as with Kafka without auto-create).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.ipc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from conf import WriterSettings
from delta_log.core.partitioner import idempotent_null_key_partition, partitioned_batch
from delta_log.core.producer import ProducerSequence
from delta_log.core.records import HEADERS_TYPE, TIMESTAMP_TYPE, producer_arrow_stream
from delta_log.core.topic_config import TopicConfig
from delta_log.errors import SinkRefusedError, SourceOptionError, TopicExistsError
from delta_log.log.catalog import Catalog
from delta_log.log.writer import TopicWriter
from delta_log.spark.options import root_and_storage_options
from delta_log.system.gateways import GatewayDirectory
from delta_log.system.schemas import SchemaStore, check_values
from delta_log.table.app_transactions import read_producer_state
from delta_log.table.storage import StorageRoot

SINK_COLUMNS = ("topic", "key", "value", "partition", "headers", "timestamp")
STAGING_DIR = "sink-staging"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
#: A batch write's requests to a gateway: about this big (its group commit's batch), this many at once.
REQUEST_BYTES = 8 * 1024 * 1024
LANES = 4  # a power of two: a partition's lane is partition & (LANES - 1)
#: A gateway whose heartbeat is older than this is not asked (the gateways' default member timeout).
_LIVE_MS = 6_000
DEFAULT_RECORDS_PER_COMMIT = 500_000
_STRINGS = (pa.string(), pa.large_string())


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkOptions:
    root: str
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    topic: str | None = None
    records_per_commit: int = DEFAULT_RECORDS_PER_COMMIT
    gateway: str = "auto"  # "auto": a live gateway of the root if any; "none": direct; else URLs
    api_token: str | None = field(default=None, repr=False)
    ca_file: str | None = None


def parse_sink_options(
    options: Mapping[str, str], *, default_root: str, default_storage_options: Mapping[str, str]
) -> SinkOptions:
    """Raises: SourceOptionError that says what to change."""
    opts = {k.lower(): v for k, v in options.items()}
    root, storage_options = root_and_storage_options(opts, default_root, default_storage_options)
    raw = opts.get("maxrecordspercommit", str(DEFAULT_RECORDS_PER_COMMIT))
    try:
        per_commit = int(raw)
    except ValueError:
        per_commit = 0
    if not 1 <= per_commit <= 10_000_000:
        raise SourceOptionError(
            "maxRecordsPerCommit must be an integer from 1 to 10000000.", option="maxRecordsPerCommit"
        )
    return SinkOptions(
        root=root,
        storage_options=storage_options,
        topic=opts.get("topic") or None,
        records_per_commit=per_commit,
        gateway=opts.get("gateway", "auto").strip() or "auto",
        api_token=opts.get("apitoken") or None,
        ca_file=opts.get("cafile") or None,
    )


def check_sink_schema(schema: StructType, topic_option: str | None) -> None:
    """Kafka's sink checks, on the driver before any task runs. Raises: SourceOptionError."""
    types = {f.name.lower(): f.dataType.simpleString() for f in schema.fields}
    if "value" not in types:
        raise SourceOptionError(
            "The sink needs a 'value' column (string or binary); select or alias one, e.g. to_json(struct(*)) AS value.",
            option="value",
        )
    if topic_option is None and "topic" not in types:
        raise SourceOptionError(
            "Say which topic to write: set .option('topic', name) or add a 'topic' column.", option="topic"
        )
    expected = {
        "value": ("string", "binary"),
        "key": ("string", "binary"),
        "topic": ("string",),
        "partition": ("int",),
        "headers": ("array<struct<key:string,value:binary>>",),
        "timestamp": ("timestamp",),
    }
    for name, allowed in expected.items():
        if name in types and types[name] not in allowed:
            raise SourceOptionError(
                f"Column {name!r} is {types[name]}; the sink takes {' or '.join(allowed)}: cast it.", option=name
            )


def _binary(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    return pc.cast(column, pa.binary()) if column.type in _STRINGS else column


def _records(batch: pa.Table) -> pa.Table:
    """The producer's columns of one topic's rows, as normalize_batch takes them."""
    cols: dict[str, pa.ChunkedArray | pa.Array] = {"value": _binary(batch.column("value"))}
    if "key" in batch.column_names:
        cols["key"] = _binary(batch.column("key"))
    if "partition" in batch.column_names:
        cols["partition"] = batch.column("partition")
    if "headers" in batch.column_names:
        cols["headers"] = pc.cast(batch.column("headers"), HEADERS_TYPE)
    if "timestamp" in batch.column_names:
        cols["timestamp"] = pc.cast(batch.column("timestamp"), TIMESTAMP_TYPE)
    return pa.table(cols)


@dataclass(frozen=True, slots=True)
class SinkCommit(WriterCommitMessage):
    """What one task staged: (topic, file path inside the root's filesystem, records) per file, and
    the streaming query's id (tasks know it; the driver-side commit does not)."""

    files: list[tuple[str, str, int]]
    query_id: str | None = None


def _staging(storage: StorageRoot, write_id: str) -> str:
    """Where a write's (or a streaming query's) tasks stage their rows, inside the root's filesystem."""
    return f"{storage.fs_path(storage.system_uri(STAGING_DIR))}/{write_id}"


class _Stager:
    """A task's side: validate and partition its rows per topic, stage them as Arrow IPC files."""

    def __init__(self, options: SinkOptions, directory: str) -> None:
        self.options = options
        self.storage = StorageRoot(options.root, options.storage_options)
        self.fs, _ = self.storage.filesystem()
        self.catalog = Catalog(self.storage, WriterSettings())
        self.directory = directory
        self.configs: dict[str, TopicConfig] = {}
        self.files: list[tuple[str, str, int]] = []
        self.schemas = SchemaStore.open_if_exists(self.storage)

    def config(self, topic: str) -> TopicConfig:
        if topic not in self.configs:
            self.configs[topic] = self.catalog.describe_topic(topic).config  # TopicNotFoundError with advice
        return self.configs[topic]

    def stage(self, rows: pa.Table) -> None:
        rows = rows.rename_columns([c.lower() for c in rows.column_names])  # Spark's names are case-insensitive
        for topic, part in self._by_topic(rows).items():
            config = self.config(topic)
            records = _records(part)
            # the topic's value schema, as at HTTP produce: a bad value fails the task (and the
            # write, nothing committed), or, with errors.tolerance=all, goes to the dead-letter topic
            split = check_values(self.schemas, topic, records, config) if self.schemas is not None else None
            if split is not None:
                dlq = config.dead_letter_topic(topic)
                assert dlq is not None, "only a topic with errors.tolerance=all splits its rows"
                with contextlib.suppress(TopicExistsError):  # another task, the driver or a gateway did
                    if not self.storage.is_table(self.storage.topic_uri(dlq)):
                        self.catalog.create_topic(dlq, partitions=config.partitions, config=config.dead_letter_config())
                self._stage_one(dlq, split.dead, self.config(dlq))
                records = split.valid
            if records.num_rows:
                self._stage_one(topic, records, config)

    def _stage_one(self, topic: str, records: pa.Table, config: TopicConfig) -> None:
        # records without key or partition: one partition per staged file (Kafka's sticky batches)
        sticky = idempotent_null_key_partition(self.directory, len(self.files), config.partitions)
        batch = partitioned_batch(
            records, config, topic=topic, null_key_partition=sticky, now_us=int(time.time() * 1e6)
        ).batch
        path = f"{self.directory}/{len(self.files):05d}-{uuid.uuid4().hex[:8]}.arrow"
        self.fs.create_dir(self.directory, recursive=True)
        with self.fs.open_output_stream(path) as f, pa.ipc.new_file(f, batch.schema) as ipc:
            ipc.write_table(batch)
        self.files.append((topic, path, batch.num_rows))

    def _by_topic(self, rows: pa.Table) -> dict[str, pa.Table]:
        if self.options.topic is not None:
            return {self.options.topic: rows}
        topic = rows.column("topic")
        if topic.null_count:
            idx = pc.index(pc.is_null(topic), True).as_py()
            raise SourceOptionError(
                f"Row {idx} of the task has a null topic; set .option('topic', name) or fill the column.",
                option="topic",
            )
        return {t: rows.filter(pc.equal(topic, t)) for t in pc.unique(topic).to_pylist()}

    def run(self, batches: Iterator[pa.RecordBatch], query_id: str | None = None) -> SinkCommit:
        pending: list[pa.RecordBatch] = []
        size = 0
        for rb in batches:
            pending.append(rb)
            size += rb.num_rows
            if size >= self.options.records_per_commit:
                self.stage(pa.Table.from_batches(pending))
                pending, size = [], 0
        if size:
            self.stage(pa.Table.from_batches(pending))
        return SinkCommit(files=self.files, query_id=query_id)


def _commit_staged(
    options: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    producer_id: str,
    first_sequence: int,
    *,
    atomic: bool,
) -> dict[str, int]:
    """The driver's side: append every staged file, topic by topic, through one writer per topic
    (the tasks never race each other for the topic's log), in commits of up to `maxRecordsPerCommit`
    records, each an idempotent producer request. Returns records appended (or already there) per topic.
    """
    storage = StorageRoot(options.root, options.storage_options)
    fs, _ = storage.filesystem()
    by_topic: dict[str, list[tuple[str, int]]] = {}
    for m in messages:
        if isinstance(m, SinkCommit):
            for topic, path, n in m.files:
                by_topic.setdefault(topic, []).append((path, n))
    out: dict[str, int] = {}
    route = _GatewayRoute.find(options, storage)
    try:
        for topic in sorted(by_topic):
            out[topic] = _commit_topic(
                options, storage, fs, route, topic, by_topic[topic], producer_id, first_sequence, atomic
            )
    finally:
        if route is not None:
            route.close()
    return out


def _already_written(storage: StorageRoot, topic: str, producer_id: str, sequence: int) -> bool:
    """Whether `producer_id` committed `sequence` (or later) on any partition of `topic`: a replayed
    micro-batch, found topic-wide, since its records may land on other partitions the second time
    (records without a key go to one partition per staged file)."""
    writer = TopicWriter(storage, topic, WriterSettings())
    for p in range(Catalog(storage, WriterSettings()).describe_topic(topic, writer.table).partitions):
        st = read_producer_state(writer.table, producer_id, p)
        if st is not None and st.last_sequence >= sequence:
            return True
    return False


def _commit_topic(
    options: SinkOptions,
    storage: StorageRoot,
    fs: pafs.FileSystem,
    route: _GatewayRoute | None,
    topic: str,
    files: list[tuple[str, int]],
    producer_id: str,
    first_sequence: int,
    atomic: bool,
) -> int:
    if atomic and _already_written(storage, topic, producer_id, first_sequence):
        return sum(n for _, n in files)
    writer: TopicWriter | None = None
    written = 0
    for i, paths in enumerate(_chunks(sorted(files), options.records_per_commit)):
        tables = []
        for path in paths:
            with fs.open_input_file(path) as f:
                tables.append(pa.ipc.open_file(f).read_all())
        batch = pa.concat_tables(tables)
        batch = batch.take(pc.sort_indices(batch, [("partition", "ascending")]))  # a stable sort
        sequence = first_sequence + i
        if route is not None and not atomic:
            route.send_in_lanes(topic, batch, producer_id, sequence, storage)
        else:
            producer = ProducerSequence(producer_id=producer_id, sequence=sequence)
            if route is None or not route.send(topic, batch, producer):
                writer = writer or TopicWriter(storage, topic, WriterSettings())
                writer.append(batch, producer)
        written += batch.num_rows
    return written


class _GatewayRoute:
    """The driver's commit through a live gateway: its group commit takes the sink's records between
    its own, where a direct append would keep losing the topic's log to the gateway's frequent
    commits (measured: 50 conflicts in a row, bench/sink_bench.py). Each request is idempotent, so
    one that is lost is sent again, or appended directly, without a duplicate."""

    def __init__(self, urls: list[str], options: SinkOptions) -> None:
        import httpx

        self.urls = urls
        headers = {"Authorization": f"Bearer {options.api_token}"} if options.api_token else {}
        self.http = httpx.Client(headers=headers, timeout=120, verify=options.ca_file or True)

    @classmethod
    def find(cls, options: SinkOptions, storage: StorageRoot) -> _GatewayRoute | None:
        if options.gateway.lower() == "none":
            return None
        if options.gateway.lower() != "auto":
            return cls([u.strip().rstrip("/") for u in options.gateway.split(",") if u.strip()], options)
        now_ms = int(time.time() * 1000)
        live = [g.url for g in GatewayDirectory(storage).read_all() if g.live(now_ms, _LIVE_MS)]
        return cls(live, options) if live else None

    def close(self) -> None:
        self.http.close()

    def send_in_lanes(self, topic: str, batch: pa.Table, producer_id: str, sequence: int, storage: StorageRoot) -> None:
        """A batch write's commit: `batch` in requests of about REQUEST_BYTES over LANES connections
        at once (the gateway group-commits them together), each lane its own idempotent producer
        sending in order; a request no gateway takes is appended directly."""
        per = max(1, int(REQUEST_BYTES * batch.num_rows / max(batch.nbytes, 1)))
        lane_of = pc.bit_wise_and(batch.column("partition"), LANES - 1)  # a partition keeps to one lane: in order

        def lane(n: int) -> None:
            rows = batch.filter(pc.equal(lane_of, n))
            writer: TopicWriter | None = None
            for k, start in enumerate(range(0, rows.num_rows, per)):
                part = rows.slice(start, per)
                producer = ProducerSequence(producer_id=f"{producer_id}-{n}", sequence=sequence * 100_000 + k)
                if not self.send(topic, part, producer):
                    writer = writer or TopicWriter(storage, topic, WriterSettings())
                    writer.append(part, producer)

        with ThreadPoolExecutor(LANES, thread_name_prefix="topiclake-sink") as pool:
            for f in [pool.submit(lane, n) for n in range(LANES)]:
                f.result()

    def send(self, topic: str, batch: pa.Table, producer: ProducerSequence) -> bool:
        """True once a gateway appended `batch` (or had); False: append it directly (no gateway
        answered, or the request is over a gateway's size limit). Raises: SinkRefusedError for a
        gateway's refusal (bad records, no access)."""
        import httpx

        body = producer_arrow_stream(batch)
        headers = {
            "Content-Type": ARROW_STREAM,
            "Producer-Id": producer.producer_id,
            "Producer-Sequence": str(producer.sequence),
        }
        for url in self.urls:
            try:
                resp = self.http.post(f"{url}/topics/{topic}/records", content=body, headers=headers)
            except httpx.HTTPError:
                continue  # that gateway is gone: the next, else a direct append
            if resp.status_code < 300:
                return True
            if resp.status_code == 413:
                return False
            if resp.status_code >= 500 or resp.status_code == 429:
                continue
            raise SinkRefusedError(f"Gateway {url} refused the sink's records for topic {topic!r}: {resp.text[:2000]}")
        return False


def _chunks(files: list[tuple[str, int]], limit: int) -> list[list[str]]:
    """Staged files, in order, grouped into commits of at most `limit` records (a bigger file alone)."""
    out: list[list[str]] = []
    size = 0
    for path, n in files:
        if not out or (size and size + n > limit):
            out.append([])
            size = 0
        out[-1].append(path)
        size += n
    return out


def _remove_staging(options: SinkOptions, directory: str) -> None:
    storage = StorageRoot(options.root, options.storage_options)
    fs, _ = storage.filesystem()
    with contextlib.suppress(OSError):
        fs.delete_dir(directory)


class TopiclakeBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # on the driver: shared by every task and the commit
        self.directory = _staging(StorageRoot(options.root, options.storage_options), f"write-{self.write_id}")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return _Stager(self.options, f"{self.directory}/task-{_task_attempt()}").run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            _commit_staged(self.options, messages, f"spark-write-{self.write_id}", 0, atomic=False)
        finally:
            _remove_staging(self.options, self.directory)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _remove_staging(self.options, self.directory)


class TopiclakeStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if not query_id or batch_id is None:
            raise RuntimeError("The topiclake stream sink runs only inside a streaming query's micro-batch.")
        storage = StorageRoot(self.options.root, self.options.storage_options)
        directory = f"{_staging(storage, f'query-{query_id}')}/{batch_id}/task-{_task_attempt()}"
        return _Stager(self.options, directory).run(iterator, query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """One micro-batch: its records appended by one idempotent producer per query, sequences from
        the batch id, so a replayed batch (Spark re-runs a batch it had not recorded as done)
        appends nothing twice, however its rows were split among tasks."""
        query_id = next((m.query_id for m in messages if isinstance(m, SinkCommit) and m.query_id), None)
        if query_id is None:
            return  # no task saw a row
        storage = StorageRoot(self.options.root, self.options.storage_options)
        query_dir = _staging(storage, f"query-{query_id}")
        # one commit (or gateway request) per topic: a replay is all duplicate, whatever its chunks
        whole = dataclasses.replace(self.options, records_per_commit=sys.maxsize)
        _commit_staged(whole, messages, f"spark-{query_id}", batchId, atomic=True)
        _remove_staging(self.options, query_dir)  # this batch's files and any a crashed attempt left

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing was appended; the staged files go when the batch is committed (or replayed)."""


def _task_attempt() -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return f"{ctx.partitionId()}-{ctx.attemptNumber()}" if ctx is not None else "0-0"


def refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise SourceOptionError(
            "A topic is an append-only log: write with .mode('append') (or outputMode('append')).", option="mode"
        )


__all__ = [
    "SINK_COLUMNS",
    "SinkCommit",
    "SinkOptions",
    "TopiclakeBatchWriter",
    "TopiclakeStreamWriter",
    "check_sink_schema",
    "parse_sink_options",
    "refuse_overwrite",
]
