import pytest

from delta_log import Catalog, StorageRoot
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    TopicExistsError,
    TopicNotFoundError,
)


def test_create_describe_list_delete(catalog, storage):
    d = catalog.create_topic("orders", partitions=3, config={"retention.ms": 60000, "cleanup.policy": "compact"})
    assert d.partitions == 3 and d.config.retention_ms == 60000
    assert catalog.list_topics() == ["orders"]
    dt = catalog.open_topic("orders")
    assert dt.metadata().partition_columns == ["partition"]
    import pyarrow as pa

    assert pa.schema(dt.schema().to_arrow()) == TOPIC_SCHEMA
    # config is persisted with the table: a fresh catalog sees it
    fresh = Catalog(StorageRoot(storage.root), catalog.settings)
    assert fresh.describe_topic("orders").config.cleanup_policy == "compact"
    catalog.delete_topic("orders")
    assert catalog.list_topics() == []
    with pytest.raises(TopicNotFoundError):
        catalog.describe_topic("orders")


def test_create_twice_fails(catalog):
    catalog.create_topic("a")
    with pytest.raises(TopicExistsError) as e:
        catalog.create_topic("a", partitions=2)
    assert e.value.code == "TOPIC_ALREADY_EXISTS"
    assert catalog.describe_topic("a").partitions == 1


@pytest.mark.parametrize("name", ["bad name", "..", "a/b", "x" * 250])
def test_invalid_names_write_nothing(catalog, storage, name):
    with pytest.raises(InvalidTopicError):
        catalog.create_topic(name)
    assert storage.list_dirs("topics") == []


def test_invalid_config_writes_nothing(catalog, storage):
    with pytest.raises(InvalidConfigError):
        catalog.create_topic("c", config={"retention.ms": "soon"})
    assert storage.list_dirs("topics") == []


def test_alter_config_and_reset(catalog):
    catalog.create_topic("a")
    d = catalog.alter_config("a", {"retention.bytes": 1024, "max.message.bytes": 10})
    assert d.config.retention_bytes == 1024 and d.config.max_message_bytes == 10
    d = catalog.alter_config("a", {"retention.bytes": None})
    assert d.config.retention_bytes == -1
    with pytest.raises(InvalidConfigError):
        catalog.alter_config("a", {"bogus": 1})
    with pytest.raises(TopicNotFoundError):
        catalog.alter_config("missing", {"retention.ms": 1})


def test_add_partitions_only_increases(catalog):
    catalog.create_topic("a", partitions=2)
    assert catalog.add_partitions("a", 5).partitions == 5
    with pytest.raises(InvalidPartitionsError):
        catalog.add_partitions("a", 5)
    with pytest.raises(InvalidPartitionsError):
        catalog.add_partitions("a", 3)


def test_forbidden_delta_properties(catalog):
    catalog.create_topic("a")
    with pytest.raises(InvalidConfigError):
        catalog.set_delta_properties("a", {"delta.setTransactionRetentionDuration": "interval 1 days"})
    props = catalog.open_topic("a").metadata().configuration
    assert "delta.setTransactionRetentionDuration" not in props
    assert props["delta.checkpointInterval"] == "10"


def test_a_topic_keeps_its_id_through_changes_and_a_new_topic_of_its_name_gets_another(catalog, storage):
    from conf import ReaderSettings
    from delta_log.log.reader import TopicReader

    def topic_id():
        return TopicReader(storage, "ids", ReaderSettings()).topic_id

    catalog.create_topic("ids", partitions=1)
    first = topic_id()
    catalog.alter_config("ids", {"retention.ms": 1000})
    catalog.add_partitions("ids", 3)
    assert topic_id() == first
    catalog.delete_topic("ids")
    catalog.create_topic("ids", partitions=1)
    assert topic_id() != first
    with pytest.raises(TopicExistsError):  # Kafka's internal topic's name is taken
        catalog.create_topic("__consumer_offsets")
