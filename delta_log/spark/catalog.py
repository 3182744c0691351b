"""Topics in a Spark catalog, kept in sync with the root.

What a root's catalog holds (`<db>` is `catalog.database`, default `topics`):
- `<db>.<name>`: every topic, a Delta table at its location (`-` and `.` written `_`; a second topic
  whose name collides is `<name>_2`, never silently replaced). Its Delta properties are the topic's
  configs (`topiclake.*`), so `DESCRIBE TABLE EXTENDED` shows them.
- `<db>._partitions`: topic, partition, log start offset, high watermark, segments, bytes: a snapshot
  in `<root>/_system/partitions` (through delta-rs), rewritten at each sync that finds a change, by
  `topiclake catalog sync`, and by every live session's sync thread each `partitions_refresh_s`
  when what it reads moved (Spark SQL cannot read a table's high watermark, a Delta txn, at query
  time; the refresh spends at most a tenth of the thread's time, however many topics a root has).
- `<db>._consumer_lag`: a view over the committed offsets (live) and `_partitions`.
- `<db>_typed.<name>`: for topics with a JSON Schema or Avro value schema, the Kafka columns and the
  value's fields as typed columns (delta_log.spark.typed); TBLPROPERTIES name the subject and the
  schema id.

`CatalogSync.sync()` makes the catalog match the root and reports the drift it fixed: tables
created, tables dropped (a table in `<db>` whose location is a topic folder that is gone; tables a
user put there elsewhere are left alone), typed views replaced. It is idempotent and safe to run
from several sessions at once (a table another session created meanwhile counts as there).

`CatalogSync.start()` keeps a live session in step: a daemon thread compares the root's topic list
and the registry's change number every `catalog.sync_interval_s`, and touches the catalog only when
they moved (the root is shared storage with no change events to wait on, so this is the one bounded
poll: a folder listing and a small Delta read). `get_spark` starts it for catalog sessions.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from conf import WriterSettings
from delta_log.core.lag import lag_sql
from delta_log.core.value_schemas import subject_for
from delta_log.log.catalog import CATALOG_MARKER, Catalog
from delta_log.log.reader import TopicReader
from delta_log.spark.s3a import configure_s3a
from delta_log.spark.typed import register_typed_views
from delta_log.system.offsets import OffsetStore
from delta_log.system.schemas import SchemaStore
from delta_log.table.storage import LATEST_DIR, TOPICS_DIR, StorageRoot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PARTITIONS_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("log_start_offset", pa.int64()),
        ("high_watermark", pa.int64()),
        ("segments", pa.int32()),
        ("size_bytes", pa.int64()),
    ]
)
SYSTEM_TABLES = frozenset({"_partitions", "_consumer_lag"})
SUBJECT_PROPERTY = "value.subject"  # on a typed topic's table: its registry subject
#: `_partitions` is rewritten whole every refresh: keep an hour of its history, not Delta's 30 days
_PARTITIONS_PROPERTIES = {
    "delta.logRetentionDuration": "interval 1 hours",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}
_VACUUM_EVERY = 100  # rewrites of _partitions between two vacuums of the files they replaced
_LATEST = "@latest"  # marks an upsert table among the topics a sync lists (@ is not in topic names)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_name(topic: str) -> str:
    """SQL table name of a topic: Spark's catalog allows only letters, digits and `_` ("orders-eu" -> "orders_eu")."""
    return topic.replace("-", "_").replace(".", "_")


def topic_tables(topics: Iterable[str]) -> dict[str, str]:
    """{topic: table} for sorted topics; a name taken by an earlier topic gets `_2`, `_3`, ... (pure)."""
    tables: dict[str, str] = {}
    taken: set[str] = set()
    for t in sorted(topics):
        name, n = table_name(t), 1
        while name.lower() in taken:  # the catalog's names are case-insensitive
            n += 1
            name = f"{table_name(t)}_{n}"
        tables[t] = name
        taken.add(name.lower())
    return tables


def upsert_table_names(listed: Iterable[str], tables: dict[str, str]) -> dict[str, str]:
    """{topic: `<its table>_latest`} for each `<topic>@latest` in `listed` (pure); a name that a topic's
    own table (or an earlier upsert table) holds is left out, never shared."""
    taken = {n.lower() for n in tables.values()}
    out = {}
    for t in sorted(listed):
        topic = t.removesuffix(_LATEST)
        if t.endswith(_LATEST) and topic in tables and f"{tables[topic]}_latest".lower() not in taken:
            out[topic] = f"{tables[topic]}_latest"
            taken.add(out[topic].lower())
    return out


@dataclass(slots=True)
class SyncReport:
    """What a sync changed: the drift between the root and the catalog it found."""

    database: str
    topics: int = 0
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    typed_views: list[str] = field(default_factory=list)

    @property
    def drift(self) -> bool:
        return bool(self.created or self.dropped)

    def merge(self, other: SyncReport) -> SyncReport:
        """This pass and a later one, as one report."""
        return SyncReport(
            self.database,
            topics=other.topics,
            created=sorted({*self.created, *other.created}),
            dropped=sorted({*self.dropped, *other.dropped}),
            typed_views=sorted({*self.typed_views, *other.typed_views}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "topics": self.topics,
            "created": self.created,
            "dropped": self.dropped,
            "typed_views": self.typed_views,
            "drift": self.drift,
        }


def _already_exists(exc: Exception) -> bool:
    text = str(exc)
    return "AlreadyExistsException" in text or "TABLE_OR_VIEW_ALREADY_EXISTS" in text


class CatalogSync:
    """Keeps `database` (and `<database>_typed`) of `spark`'s catalog equal to `storage`'s topics."""

    def __init__(
        self,
        spark: SparkSession,
        storage: StorageRoot,
        database: str = "topics",
        *,
        before_round: Callable[[], object] | None = None,
    ) -> None:
        self.spark = spark
        self._before_round = before_round  # e.g. start the metastore again if its starter has exited
        self.storage = storage
        self.database = database
        self._topics: frozenset[str] | None = None
        self._registry_seq = -1
        self._marker = ""  # the catalog marker (delta_log.log.catalog) as of the last sync
        self._thread: threading.Thread | None = None
        self.first_report: SyncReport | None = None  # what start() found
        #: told ({topic: table}, {topic: its upsert table}) after each sync
        self.listeners: list[Callable[[dict[str, str], dict[str, str]], object]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one sync at a time (the thread and a caller)
        self._partition_rows: list[tuple[Any, ...]] | None = None  # what _partitions holds, as last written
        self._partition_writes = 0

    # --- one pass -------------------------------------------------------------------------------

    def sync(self, *, verify: bool = True) -> SyncReport:
        """Make the catalog match the root now. `verify`: also check tables the catalog already has
        (their locations; a full pass, as `topiclake catalog sync` runs it)."""
        with self._lock:
            return self._sync(self._list_topics(), verify=verify)

    def tables(self) -> dict[str, str]:
        """{topic: table} of the topics the catalog holds now."""
        return topic_tables(t for t in self._topics or () if not t.endswith(_LATEST))

    def upsert_tables(self) -> dict[str, str]:
        """{topic: table} of the topics' upsert tables the catalog holds now."""
        return upsert_table_names(self._topics or (), self.tables())

    def _list_topics(self) -> frozenset[str]:
        """The root's topics, and `<topic>@latest` for each topic's upsert table."""
        catalog = Catalog(self.storage, WriterSettings())
        topics = catalog.list_topics()
        return frozenset(topics) | {f"{t}{_LATEST}" for t in catalog.upsert_tables() if t in set(topics)}

    def _sync(self, topics: frozenset[str], *, verify: bool, marker: str | None = None) -> SyncReport:
        spark, db = self.spark, _q(self.database)
        marker = self.storage.read_marker(CATALOG_MARKER) if marker is None else marker
        configure_s3a(spark, self.storage.root, self.storage.storage_options)
        OffsetStore(self.storage)  # the offsets table exists, so the lag view always resolves
        report = SyncReport(self.database, topics=len(topics))
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {db}")
        wanted = topic_tables(t for t in topics if not t.endswith(_LATEST))
        locations = {t: self.storage.topic_uri(t) for t in wanted}
        upserts = {f"{t}{_LATEST}": n for t, n in upsert_table_names(topics, wanted).items()}
        locations |= {t: self.storage.latest_uri(t.removesuffix(_LATEST)) for t in upserts}
        present = {r[1].lower() for r in spark.sql(f"SHOW TABLES IN {db}").collect() if not r[2]}
        by_name = {name.lower(): topic for topic, name in {**wanted, **upserts}.items()}
        for name in sorted(present - by_name.keys() - SYSTEM_TABLES):
            if self._is_gone_topic(name):
                spark.sql(f"DROP TABLE IF EXISTS {db}.{_q(name)}")
                report.dropped.append(f"{self.database}.{name}")
        # a name two topics compete for ("a.b" and "a-b" are both a_b) may have moved to the other one
        bases = [table_name(t).lower() for t in wanted]
        contested = {b for b in bases if bases.count(b) > 1}
        for topic, name in sorted({**wanted, **upserts}.items()):
            known = name.lower() in present
            moved = verify or table_name(topic.removesuffix(_LATEST)).lower() in contested
            if known and moved and self._location(name) != locations[topic]:
                spark.sql(f"DROP TABLE IF EXISTS {db}.{_q(name)}")  # a collision renamed, or another root's
                report.dropped.append(f"{self.database}.{name}")
                known = False
            if not known:
                try:
                    spark.sql(f"CREATE TABLE IF NOT EXISTS {db}.{_q(name)} USING DELTA LOCATION '{locations[topic]}'")
                except Exception as exc:  # another session created it between SHOW and CREATE
                    if not _already_exists(exc):
                        raise
                report.created.append(f"{self.database}.{name}")
        if verify or report.drift or "_partitions" not in present or marker != self._marker:
            self._write_partitions(topics)  # partitions added, or a topic made or gone
        self._lag_view()
        store = SchemaStore.open_if_exists(self.storage)
        state = store.state(max_age_s=0) if store is not None else None
        seq = state.seq if state is not None else 0
        typed_db = f"{self.database}_typed"
        if verify or seq != self._typed_seq(typed_db):
            recheck = wanted  # a subject changed since the views were made: every typed view again
        else:
            recheck = {t: n for t, n in wanted.items() if f"{self.database}.{n}" in report.created}
        with_schema = {t: n for t, n in recheck.items() if state is not None and state.subject_schemas(subject_for(t))}
        if with_schema:
            report.typed_views = sorted(register_typed_views(spark, store, with_schema, self.database).values())
            self._mark_subjects(with_schema)
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {_q(typed_db)}")
        if recheck is wanted or report.dropped:
            keep = {v.split(".", 1)[1].lower() for v in report.typed_views} | (
                set() if recheck is wanted else {n.lower() for n in wanted.values()}
            )
            for r in spark.sql(f"SHOW TABLES IN {_q(typed_db)}").collect():
                if not r[2] and r[1].lower() not in keep:
                    spark.sql(f"DROP VIEW IF EXISTS {_q(typed_db)}.{_q(r[1])}")
                    report.dropped.append(f"{typed_db}.{r[1]}")
            spark.sql(f"ALTER DATABASE {_q(typed_db)} SET DBPROPERTIES ('topiclake.registry.seq' = '{seq}')")
        self._topics, self._registry_seq, self._marker = topics, seq, marker
        for listener in self.listeners:
            listener(wanted, upsert_table_names(topics, wanted))
        return report

    def _mark_subjects(self, topics: Iterable[str]) -> None:
        """Each typed topic's table carries its registry subject as the Delta property
        `value.subject`, so DESCRIBE TABLE EXTENDED shows it beside the topic's configs (not a
        `topiclake.` key: it is not a topic config). Written once, by whichever sync sees it missing."""
        catalog = Catalog(self.storage, WriterSettings())
        for topic in topics:
            try:
                if catalog.open_topic(topic).metadata().configuration.get(SUBJECT_PROPERTY) != subject_for(topic):
                    catalog.set_delta_properties(topic, {SUBJECT_PROPERTY: subject_for(topic)})
            except Exception as exc:  # deleted meanwhile, or a commit lost to a busy writer: next change
                log.debug("no subject property on %s: %s", topic, exc)

    def _typed_seq(self, typed_db: str) -> int:
        """The registry change the typed views were last made at (a property of their database)."""
        try:
            rows = self.spark.sql(f"DESCRIBE DATABASE EXTENDED {_q(typed_db)}").collect()
        except Exception:  # not there yet
            return -1
        for r in rows:
            text = str(r[1])
            if r[0] == "Properties" and "topiclake.registry.seq," in text:
                return int(text.split("topiclake.registry.seq,", 1)[1].split(")", 1)[0])
        return -1

    def _location(self, name: str) -> str | None:
        """Where the catalog says a table is, read from the metastore's entry: Delta's DESCRIBE would
        open the table, and a deleted topic's table no longer opens."""
        jvm_catalog = self.spark._jsparkSession.sessionState().catalog().externalCatalog()
        location = jvm_catalog.getTable(self.database, name).location()
        return str(location.getPath()) if str(location.getScheme()) == "file" else str(location.toString())

    def _is_gone_topic(self, name: str) -> bool:
        """A table whose location is a topic's folder (or its upsert table's) of this root that no
        longer holds a table."""
        location = self._location(name)
        folders = (f"{self.storage.root}/{TOPICS_DIR}/", f"{self.storage.root}/{LATEST_DIR}/")
        if location is None or not location.startswith(folders):
            return False
        return not self.storage.is_table(location)

    def _write_partitions(self, topics: Iterable[str], *, if_changed: bool = False) -> None:
        """Rewrite the `_partitions` snapshot (`if_changed`: only if its rows moved since the last)."""
        rows = []
        for t in sorted(t for t in topics if not t.endswith(_LATEST)):
            try:
                offsets = TopicReader(self.storage, t).partition_offsets()
            except Exception as exc:  # deleted between the listing and now
                log.debug("no partitions for %s: %s", t, exc)
                continue
            for p in offsets:
                rows.append((t, p.partition, p.log_start_offset, p.high_watermark, p.segments, p.size_bytes))
        if if_changed and rows == self._partition_rows:
            return
        uri = self.storage.system_uri("partitions")
        try:
            write_deltalake(
                uri,
                pa.Table.from_pylist(
                    [dict(zip(PARTITIONS_SCHEMA.names, r, strict=True)) for r in rows], PARTITIONS_SCHEMA
                ),
                mode="overwrite",
                schema_mode="overwrite",
                configuration=_PARTITIONS_PROPERTIES,  # a table of a few current rows: no long history
                storage_options=self.storage.options(),
            )
        except CommitFailedError:  # another session rewrote the snapshot at the same moment
            log.debug("_partitions rewritten concurrently")
        else:
            self._partition_rows = rows
            self._partition_writes += 1
            if self._partition_writes == 1 or self._partition_writes % _VACUUM_EVERY == 0:
                with contextlib.suppress(Exception):
                    dt = DeltaTable(uri, storage_options=self.storage.options())
                    held = dt.metadata().configuration
                    if any(held.get(k) != v for k, v in _PARTITIONS_PROPERTIES.items()):
                        # a table made before the property was set (delta-rs sets it only at creation)
                        dt.alter.set_table_properties(_PARTITIONS_PROPERTIES)
                    dt.vacuum(retention_hours=1, enforce_retention_duration=False, dry_run=False)  # replaced files
        db = _q(self.database)
        try:
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {db}._partitions USING DELTA LOCATION '{uri}'")
        except Exception as exc:
            if not _already_exists(exc):
                raise
        self.spark.sql(f"REFRESH TABLE {db}._partitions")

    def _lag_view(self) -> None:
        db = _q(self.database)
        offsets_uri = self.storage.system_uri("consumer_offsets")
        try:
            self._create_lag_view(db, offsets_uri)
        except Exception as exc:  # two sessions' first syncs on a new root replaced it at once
            if not _already_exists(exc):
                raise
            self._create_lag_view(db, offsets_uri)

    def _create_lag_view(self, db: str, offsets_uri: str) -> None:
        self.spark.sql(f"""
            CREATE OR REPLACE VIEW {db}._consumer_lag AS
            WITH latest AS (
                SELECT `group`, topic, partition, max_by(offset, commit_timestamp) AS committed_offset
                FROM delta.`{offsets_uri}`
                GROUP BY `group`, topic, partition
            )
            SELECT l.`group`, l.topic, l.partition, l.committed_offset, p.high_watermark, p.log_start_offset,
                   {lag_sql(committed="l.committed_offset", log_start_offset="p.log_start_offset", high_watermark="p.high_watermark")} AS lag
            FROM latest l JOIN {db}._partitions p ON l.topic = p.topic AND l.partition = p.partition
            WHERE l.committed_offset >= 0
        """)

    # --- kept in step ---------------------------------------------------------------------------

    def start(self, interval_s: float, *, partitions_refresh_s: float = 10.0) -> None:
        """Sync now, then on a daemon thread whenever the root's topics or schemas change; rewrite
        `_partitions` every `partitions_refresh_s` when its rows moved."""
        self.first_report = self.sync(verify=False)
        self._thread = threading.Thread(
            target=self._run,
            args=(interval_s, partitions_refresh_s),
            name=f"topiclake-catalog-{self.database}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, interval_s: float, partitions_refresh_s: float) -> None:
        from pyspark import SparkContext

        refresh_at = 0.0  # a fresh snapshot first, off the session's start
        while True:
            if time.monotonic() >= refresh_at:
                started = time.monotonic()
                try:
                    with self._lock:
                        self._write_partitions(self._topics or (), if_changed=True)
                except Exception as exc:
                    log.warning("could not refresh %s._partitions: %s", self.database, exc)
                took = time.monotonic() - started
                refresh_at = started + max(partitions_refresh_s, 10 * took)  # at most a tenth of the time
            if self._stop.wait(interval_s):
                return
            if SparkContext._active_spark_context is not self.spark.sparkContext:  # its session was stopped
                return
            try:
                if self._before_round is not None:
                    self._before_round()
                self.check()
            except Exception as exc:  # a transient storage or metastore error: next round
                log.warning("catalog sync of %s failed, retrying in %.0f s: %s", self.database, interval_s, exc)

    def check(self) -> SyncReport | None:
        """One round of the thread: sync if the topics or the registry moved, else nothing."""
        marker = self.storage.read_marker(CATALOG_MARKER)
        topics = self._list_topics()
        store = SchemaStore.open_if_exists(self.storage)
        seq = store.state(max_age_s=0).seq if store is not None else 0
        if topics == self._topics and seq == self._registry_seq and marker == self._marker:
            return None
        with self._lock:
            report = self._sync(topics, verify=False, marker=marker)
        if report.drift or report.typed_views:
            log.info("catalog %s: %s", self.database, report.to_dict())
        return report
