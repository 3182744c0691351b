"""Cross-engine: delta-rs writes, Spark reads and rewrites (dataChange=false), delta-rs reads and appends."""

import json
import os

import pyarrow as pa
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import types as T

from conf import ReaderSettings, load_settings
from delta_log import Catalog, StorageRoot, TopicReader, TopicWriter
from tests.integration.conftest import make_batch

KAFKA_SOURCE_SCHEMA = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
        T.StructField(
            "headers",
            T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])),
        ),
    ]
)

COLS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def setup_topic(tmp_path, name="interop", partitions=2, commits=6):
    settings = load_settings(root=str(tmp_path / "root"))
    storage = StorageRoot(settings.root)
    Catalog(storage, settings.writer).create_topic(name, partitions=partitions)
    w = TopicWriter(storage, name, settings.writer)
    for _ in range(commits):
        w.append(make_batch(10, partitions=partitions, value_size=30, topic=name))
    return settings, storage, w


def test_spark_reads_kafka_schema(spark, tmp_path):
    _, storage, _ = setup_topic(tmp_path)
    df = spark.read.format("delta").load(storage.topic_uri("interop")).select(*COLS)
    assert df.schema == KAFKA_SOURCE_SCHEMA  # same names, types and nullability as Spark's Kafka source
    assert df.count() == 60
    expected = TopicReader(storage, "interop").fetch(0, 0, max_records=1000).records.to_pandas()
    got = df.where("partition = 0").orderBy("offset")
    exp_df = spark.createDataFrame(expected.astype(object).where(expected.notna(), None), KAFKA_SOURCE_SCHEMA)
    assert_df_equality(got, exp_df, ignore_nullable=False)


def test_spark_rewrite_with_datachange_false_then_delta_rs_continues(spark, tmp_path):
    _settings, storage, w = setup_topic(tmp_path)
    uri = storage.topic_uri("interop")
    before = TopicReader(storage, "interop").fetch(0, 0, max_records=1000).records
    (
        spark.read.format("delta")
        .load(uri)
        .where("partition = 0")
        .repartition(1)
        .sortWithinPartitions("offset")
        .write.format("delta")
        .mode("overwrite")
        .option("dataChange", "false")
        .option("replaceWhere", "partition = 0")
        .save(uri)
    )
    history = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").orderBy("version", ascending=False).first()
    assert history["operation"] == "WRITE"
    segments = next(s for s in TopicReader(storage, "interop").partition_offsets() if s.partition == 0).segments
    assert segments == 1  # six segments merged into one
    after = TopicReader(storage, "interop").fetch(0, 0, max_records=1000).records
    assert after.select(COLS).equals(before.select(COLS))  # same records at the same offsets
    proto = DeltaTable(uri).protocol()
    assert proto.min_writer_version <= 2 and not proto.writer_features
    # the same writer object (stale snapshot) keeps appending at the right offsets
    r = w.append(make_batch(4, partitions=2, topic="interop"))
    assert [x.base_offset for x in r.ranges] == [30, 30]
    final = (
        DeltaTable(uri)
        .to_pyarrow_table(columns=["partition", "offset"])
        .filter(pa.compute.equal(pa.compute.field("partition"), 0))
    )
    assert sorted(final.column("offset").to_pylist()) == list(range(32))


def test_spark_optimize_is_transparent(spark, tmp_path):
    from delta.tables import DeltaTable as SparkDeltaTable

    _, storage, w = setup_topic(tmp_path, commits=8)
    uri = storage.topic_uri("interop")
    reader = TopicReader(storage, "interop", ReaderSettings(refresh_interval_s=0))
    before = reader.fetch(1, 0, max_records=1000).records
    SparkDeltaTable.forPath(spark, uri).optimize().where("partition = 1").executeCompaction()
    after = reader.fetch(1, 0, max_records=1000).records
    diff = [c for c in COLS if not after.column(c).equals(before.column(c))]
    assert not diff, (diff, after.column("offset").to_pylist()[:12], after.schema)
    assert reader.partition_offsets()[1].segments == 1
    assert w.append(make_batch(2, partitions=2, topic="interop")).ranges[1].base_offset == 40


def test_spark_reads_a_system_table_through_the_checkpoint_its_store_wrote(spark, tmp_path):
    """The transactions store writes its table's checkpoints itself (delta_log.table.table_state):
    Spark reads the table through one, the version it names and the rows it holds."""
    from delta_log.core.transactions import Txn
    from delta_log.system.transactions import TABLE, TransactionStore

    storage = StorageRoot(str(tmp_path / "root"))
    store = TransactionStore(storage)
    epoch = store.claim("app")
    for i in range(1, 513):  # two rewrites, the second checkpointed by the store
        store.save(Txn(transactional_id="app", producer_id=i, producer_epoch=0, timeout_ms=60_000), epoch)
        if i % 256 == 0:
            assert store.compact(min_rows=256)
    dt = DeltaTable(storage.system_uri(TABLE))
    path = dt.table_uri.removeprefix("file://")
    assert f"{dt.version():020d}.checkpoint.parquet" in os.listdir(os.path.join(path, "_delta_log"))
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    assert detail.numFiles == 1
    rows = spark.read.format("delta").load(path).collect()
    assert [(r.transactional_id, json.loads(r.snapshot)["producer_id"]) for r in rows] == [("app", 512)]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").agg({"version": "max"}).first()[0]
    assert history == dt.version()
