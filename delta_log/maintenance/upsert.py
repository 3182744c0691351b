"""Upsert tables: `<root>/latest/<topic>`, one row per key with its latest value (Confluent
Tableflow's UPSERT mode, Fluss's primary-key tables), for topics with `topiclake.table.mode=upsert`.

Each row: the Kafka columns of the key's latest record (key, value, partition, offset, timestamp,
timestampType, headers) and, for a topic with a value schema, the value's fields as typed columns
(the job hands a parser: delta_log.spark.typed's, the typed views' types). A tombstone (null value)
deletes its key's row; a record without a key has no row to keep and is counted, not kept.

`upsert_topic` merges the records after the last ones merged, in offset order, exactly once:
- which offsets are merged is kept in the upsert table itself, as Delta app transactions
  `upsert-<partition>` (version = the next offset to merge), committed by the same MERGE that applies
  the records, as the sink keeps its producer sequences. A MERGE that did not commit (killed, a
  conflict) left nothing; the next run starts where the last commit ended. Two runs at once: delta-rs
  refuses the second commit (its transactions changed), and it starts again from the first's end;
- within a partition the higher offset wins (one MERGE source row per key: the last); a key that
  moved partitions (partitions were added) keeps the newer timestamp;
- Change data feed is on (`delta.enableChangeDataFeed`): readers stream inserts, updates and deletes
  with `readChangeFeed`.
The processed offsets are also committed for the group `topiclake-upsert` in the offsets table, so
the job's lag shows in `topics._consumer_lag`, on /metrics and in the console.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Schema, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from conf import ReaderSettings
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.log.reader import TopicReader
from delta_log.system.offsets import OffsetCommit, OffsetStore
from delta_log.table.storage import StorageRoot

log = logging.getLogger(__name__)

UPSERT_GROUP = "topiclake-upsert"
KAFKA_COLUMNS = ("key", "value", "partition", "offset", "timestamp", "timestampType", "headers")
#: A row of the upsert table: the topic table's columns but `topic` (typed columns come after)
LATEST_SCHEMA = pa.schema([TOPIC_SCHEMA.field(name) for name in KAFKA_COLUMNS])
TABLE_PROPERTIES = {"delta.enableChangeDataFeed": "true"}
#: Parses a batch's values into a struct column (None: the topic has no value schema).
ValueParse = Callable[[pa.ChunkedArray], pa.Array]


def latest_uri(storage: StorageRoot, topic: str) -> str:
    return storage.latest_uri(topic)


def txn_id(partition: int) -> str:
    return f"upsert-{partition}"


@dataclass(slots=True)
class UpsertReport:
    topic: str
    merged: int = 0  # records read and merged (tombstones included)
    upserted_keys: int = 0  # distinct keys written or deleted
    deleted: int = 0  # keys whose latest record is a tombstone
    without_key: int = 0
    skipped_by_retention: int = 0  # records retention removed before they were merged
    lag: int = 0  # records not merged yet, after this run
    conflict: str = ""  # a lost race: nothing written, the counts above are 0 and `lag` is the next run's

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def lost_race(self, why: str) -> UpsertReport:
        """This run's MERGE did not commit because another run's came first: nothing it read counts
        as merged; the next run starts where the other ended."""
        self.merged = self.upserted_keys = self.deleted = self.without_key = 0
        message = f"another upsert run committed first; nothing written, the next run merges these records ({why})"
        self.conflict = message[:300]
        return self


def latest_per_key(records: pa.Table) -> pa.Table:
    """One row per key from records in offset order per partition: the last of its partition; across
    partitions, the newest timestamp (pure)."""
    if records.num_rows == 0:
        return records
    indexed = records.append_column("__i", pa.array(range(records.num_rows), pa.int64()))
    # last index per (key, partition): records come partition by partition, ascending offsets
    last = indexed.group_by(["key", "partition"], use_threads=False).aggregate([("__i", "max")])
    rows = indexed.take(last["__i_max"])
    if pc.count_distinct(rows["key"]).as_py() < rows.num_rows:  # a key in several partitions
        order = pc.sort_indices(rows, [("key", "ascending"), ("timestamp", "ascending"), ("__i", "ascending")])
        rows = rows.take(order)
        keys = rows["key"]
        nxt = pa.concat_arrays([keys.combine_chunks().slice(1), pa.nulls(1, pa.binary())])
        is_last = pc.invert(pc.fill_null(pc.equal(keys.combine_chunks(), nxt), False))
        rows = rows.filter(is_last)
    return rows.drop_columns(["__i"])


def _typed(batch: pa.Table, parse: ValueParse | None) -> pa.Table:
    """The batch with the value's fields as columns beside the Kafka ones (a field named like one
    of them is `value_<name>`)."""
    if parse is None:
        return batch
    parsed = parse(batch["value"])
    if not pa.types.is_struct(parsed.type):
        return batch.append_column("value_typed", parsed)
    taken = {c.lower() for c in KAFKA_COLUMNS}
    for i, f in enumerate(parsed.type):
        name = f"value_{f.name}" if f.name.lower() in taken else f.name
        while name.lower() in taken:
            name += "_"
        taken.add(name.lower())
        batch = batch.append_column(name, pc.struct_field(parsed, i))
    return batch


def _ensure_table(storage: StorageRoot, topic: str, schema: pa.Schema) -> DeltaTable:
    uri = latest_uri(storage, topic)
    try:
        return DeltaTable(uri, storage_options=storage.options())
    except TableNotFoundError:
        try:
            write_deltalake(
                uri,
                schema.empty_table(),
                mode="append",
                configuration=TABLE_PROPERTIES,
                storage_options=storage.options(),
            )
        except Exception as exc:  # another run created it first
            log.debug("upsert table of %s created concurrently: %s", topic, exc)
        return DeltaTable(uri, storage_options=storage.options())


def _aligned(target: DeltaTable, source: pa.Table) -> pa.Table:
    """`source` in the upsert table's columns: a new schema version's fields are added to the table
    first (ALTER TABLE ADD COLUMNS; delta-rs's MERGE with schema evolution gives the table a new id,
    which stops every Spark stream reading its change feed), and columns the latest version dropped
    are null in the source."""
    have = pa.schema(target.schema().to_arrow())
    new = [f for f in source.schema if f.name not in have.names]
    if new:
        target.alter.add_columns(list(Schema.from_arrow(pa.schema(new)).fields))
        have = pa.schema(target.schema().to_arrow())
    columns = [source[f.name] if f.name in source.column_names else pa.nulls(source.num_rows, f.type) for f in have]
    return pa.table(columns, names=have.names)


def upsert_topic(
    storage: StorageRoot,
    topic: str,
    *,
    parse: ValueParse | None = None,
    max_records: int = 1_000_000,
    offsets: OffsetStore | None = None,
    reader_settings: ReaderSettings | None = None,
) -> UpsertReport:
    """Merge `topic`'s records after the last merged ones (at most `max_records`) into its upsert
    table, in one commit with the new merged offsets. Returns what it did; a lost race is reported
    in `conflict` (nothing written, the next run does it)."""
    report = UpsertReport(topic)
    reader = TopicReader(storage, topic, reader_settings)  # first: raises if the topic is gone
    partitions = reader.partition_offsets()
    # one snapshot for both the offsets merged so far and the MERGE: a run that commits in between
    # changes the transactions, and delta-rs refuses this commit
    target = _ensure_table(storage, topic, _typed(LATEST_SCHEMA.empty_table(), parse).schema)
    start = {p.partition: int(target.transaction_version(txn_id(p.partition)) or 0) for p in partitions}
    batches: list[pa.Table] = []
    new_offsets: dict[int, int] = {}
    budget = max_records
    for p in partitions:
        offset = start.get(p.partition, 0)
        if offset < p.log_start_offset:
            report.skipped_by_retention += p.log_start_offset - offset
            offset = p.log_start_offset
        while offset < p.high_watermark and budget > 0:
            limit = min(budget, reader.settings.max_fetch_records)
            got = reader.fetch(p.partition, offset, max_records=limit, max_bytes=reader.settings.max_fetch_bytes)
            if got.records.num_rows:
                batches.append(got.records.select(list(KAFKA_COLUMNS)))
                budget -= got.records.num_rows
            if got.next_offset <= offset:
                break
            offset = got.next_offset
        if offset != start.get(p.partition, 0):
            new_offsets[p.partition] = offset
        report.lag += max(0, p.high_watermark - offset)
    if not new_offsets:
        return report
    records = pa.concat_tables(batches) if batches else LATEST_SCHEMA.empty_table()
    report.merged = records.num_rows
    keyed = records.filter(pc.is_valid(records["key"]))
    report.without_key = records.num_rows - keyed.num_rows
    try:
        source = _aligned(target, _typed(latest_per_key(keyed.cast(LATEST_SCHEMA)), parse))
    except CommitFailedError as exc:  # another run's MERGE came between: the next run adds them
        return report.lost_race(f"delta-rs: {exc}")
    if any(int(target.transaction_version(txn_id(p)) or 0) != o for p, o in start.items()):
        # adding columns refreshed the table past a MERGE another run committed since `start` was
        # read: this run's records are older than the table's, so it writes nothing
        return report.lost_race("its MERGE is in the table this run read")
    report.upserted_keys = source.num_rows
    report.deleted = (
        source.num_rows - pc.sum(pc.is_valid(source["value"]).cast(pa.int64())).as_py() if source.num_rows else 0
    )
    commit = CommitProperties(
        app_transactions=[Transaction(txn_id(p), o) for p, o in sorted(new_offsets.items())],
        custom_metadata={"topiclake.upsert.records": str(report.merged)},
        max_commit_retries=0,  # a concurrent commit changed the txns: start again from its end
    )
    # a record replaces a key's row if it is later in the key's partition (by offset: a replayed
    # record changes nothing), or, from another partition (a key that moved), not older
    newer = (
        "((s.`partition` = t.`partition` AND s.`offset` > t.`offset`)"
        " OR (s.`partition` <> t.`partition` AND s.`timestamp` >= t.`timestamp`))"
    )
    try:
        (
            target.merge(
                source,
                predicate="t.key = s.key",
                source_alias="s",
                target_alias="t",
                commit_properties=commit,
            )
            .when_matched_delete(predicate=f"s.value IS NULL AND {newer}")
            .when_matched_update_all(predicate=f"s.value IS NOT NULL AND {newer}")
            .when_not_matched_insert_all(predicate="s.value IS NOT NULL")
            .execute()
        )
    except CommitFailedError as exc:
        return report.lost_race(f"delta-rs: {exc}")
    if offsets is not None:
        offsets.commit(
            [OffsetCommit(group=UPSERT_GROUP, topic=topic, partition=p, offset=o) for p, o in new_offsets.items()]
        )
    return report
