"""pydantic-settings models for topiclake.

Precedence (highest first): explicit keyword arguments, environment variables
(`TOPICLAKE_` prefix, `__` for nesting, e.g. `TOPICLAKE_WRITER__LINGER_MS=2`), the TOML file
named by `TOPICLAKE_CONFIG` (if set), then the packaged defaults in `conf/topiclake.toml`.

The composition root (the CLI, topiclake.gateway) builds settings once and passes them down; no module
keeps a global instance.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

DEFAULTS_TOML = Path(__file__).with_name("topiclake.toml")
SPARK_DEFAULTS = Path(__file__).with_name("spark-defaults.conf")
LOGGING_JSON = Path(__file__).with_name("logging.json")

_FROZEN = ConfigDict(frozen=True, extra="forbid")

#: The standard AWS environment variables an S3 root takes for what its storage options leave out.
AWS_ENVIRONMENT = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ALLOW_HTTP",
)
_AWS_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def object_store_options(root: str | None, options: dict[str, str]) -> dict[str, str]:
    """`options` for `root`, completed from the AWS environment when `root` is on S3 (settings win;
    keys are upper-cased, as both delta-rs and the S3 filesystem accept them). Credentials come as a
    whole: key, secret and session token from the environment only when settings give none of
    them, so a static key in settings is never signed with a token of another identity. Every
    component (the gateway, jobs, Spark) gets the same options, so none reads the environment."""
    if not root or not root.startswith(("s3://", "s3a://")):
        return options
    given = {k.upper(): v for k, v in options.items()}
    wanted = [k for k in AWS_ENVIRONMENT if k not in _AWS_CREDENTIALS or not given.keys() & set(_AWS_CREDENTIALS)]
    from_env = {k: os.environ[k] for k in wanted if os.environ.get(k) and k not in given}
    return from_env | given


class WriterSettings(BaseModel):
    """Group commit and the Delta properties of new topic tables (the produce path)."""

    model_config = _FROZEN

    linger_ms: float = Field(2.0, ge=0, description="How long a flush waits for more requests.")
    max_flush_gap_ms: float = Field(
        20.0,
        ge=0,
        le=1000,
        description="`table` topics under load: a topic's next flush waits, after its previous one ended, three times "
        "as long as that one took, at most this, while less than 4 MiB waits: fewer commits and up to a third less CPU "
        "at a steady rate, for at most this much more ack latency. 0: flush as soon as `linger_ms` allows.",
    )
    batch_bytes: int = Field(8 * 1024 * 1024, gt=0, description="A flush starts once this many bytes wait.")
    max_queue_bytes: int = Field(256 * 1024 * 1024, gt=0, description="Back-pressure above this.")
    max_commit_attempts: int = Field(50, ge=1, description="Conflict retries before giving up.")
    reopen_every_commits: int = Field(2000, ge=1, description="Re-open the table to keep memory flat.")
    flush_threads: int = Field(
        8, ge=1, le=256, description="Threads that flush every topic's group commits (idle topics hold none)."
    )
    checkpoint_interval: int = Field(
        10,
        ge=1,
        description="delta.checkpointInterval of new topics: delta-rs replays the log since the last checkpoint on every commit and refresh.",
    )
    own_log_entries: bool = Field(
        True,
        description="On local disk, appends write their Delta log entry themselves (a tenth of delta-rs's commit "
        "time, and no table re-read after it); false: every commit through delta-rs.",
    )
    checkpoint_min_interval_s: float = Field(
        2.0,
        ge=0,
        description="A writer that commits its own log entries (local disk) checkpoints a topic at most this often: "
        "a checkpoint re-reads the table (tens of ms with hundreds of files), and at a hundred commits a second "
        "every 10th commit would take most of a core.",
    )
    log_retention: str = Field("interval 7 days", description="delta.logRetentionDuration of new topics")
    deleted_file_retention: str = Field("interval 1 hours", description="delta.deletedFileRetentionDuration")
    max_row_group_rows: int = Field(8192, gt=0, description="Parquet row group size; a fetch reads only these.")
    compression: Literal["SNAPPY", "ZSTD", "LZ4_RAW", "UNCOMPRESSED"] = "SNAPPY"
    wal_segment_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="`log` topics: a write-ahead segment file rolls at this size (on an object store every write is one object).",
    )
    wal_flush_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="`log` topics: a table flush starts once this many acked bytes wait (else at half the lag). Larger "
        "than `batch_bytes`: the files of a flush this size need no roll-up (measured: 7.1-8.6 vs 8.5-10.3 ms of CPU "
        "per MB at 8 MiB, ProducerPerformance 1 KB); memory holds them until flushed either way (`max_queue_bytes`).",
    )
    wal_linger_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="`log` topics: how long a write-ahead write waits to gather more requests. 0 on local disk (the "
        "writes that arrive during one fsync form the next); on an object store each write is a PUT, and 25-100 ms "
        "bounds their count (and bill) at the cost of that much ack latency.",
    )
    wal_lease_ms: int = Field(
        6_000,
        ge=1000,
        description="`log` topics: a gateway acks a partition's records while it holds its lease (renewed by every table "
        "flush); when it dies, another takes the partition over this long after its last renewal.",
    )
    wal_lease_margin_ms: int = Field(
        1_500,
        ge=100,
        description="Acks stop this long before the lease ends: more than any write takes, and more than the gateways' "
        "clocks may differ.",
    )

    @model_validator(mode="after")
    def _margin_inside_lease(self) -> WriterSettings:
        if self.wal_lease_margin_ms * 2 > self.wal_lease_ms:
            raise ValueError("writer.wal_lease_margin_ms must be at most half of writer.wal_lease_ms")
        return self


class ReaderSettings(BaseModel):
    """Topic readers: how fresh their index is, what they cache, how much one fetch may ask."""

    model_config = _FROZEN

    refresh_interval_s: float = Field(0.5, ge=0, description="Re-read the Delta log when the index is older.")
    end_refresh_interval_s: float = Field(
        0.05, ge=0, description="A fetch at the high watermark re-reads the log when the index is older."
    )
    full_refresh_interval_s: float = Field(
        60.0,
        ge=0,
        description="On local disk a refresh applies the new commit entries to the index; the table itself "
        "is read again when the index is older than this (0: every refresh reads the table).",
    )
    tail_cache_bytes: int = Field(32 * 1024 * 1024, ge=0, description="Recent records kept per partition.")
    footer_cache_entries: int = Field(4096, ge=1, description="Parquet footers kept per topic.")
    row_group_cache_bytes: int = Field(
        32 * 1024 * 1024,
        ge=0,
        description="Decoded row groups kept per topic: consumers reading on from where they stopped "
        "(inside a row group) are served without decoding it again.",
    )
    read_ahead_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="After a fetch from stored segments, the consumer's next fetch (same limits) is read while "
        "it handles this one; at most this many bytes of such reads are held per process (0: off).",
    )
    read_ahead_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="Threads that read ahead, per process. One measured best on 2 cores (ConsumerPerformance: "
        "12% less CPU per MB than two, which fought the event loop for the GIL); a read still queued when its "
        "fetch comes is dropped and the fetch reads it itself.",
    )
    open_files: int = Field(
        256,
        ge=1,
        description="Segment files the process keeps open for fetches (memory-mapped on local disk), all topics "
        "together; the least recently read close first.",
    )
    max_fetch_records: int = Field(1_000_000, ge=1, description="The most records one fetch may ask for.")
    max_fetch_bytes: int = Field(
        50 * 1024 * 1024, gt=0, description="Kafka's fetch.max.bytes: one fetch returns at most this (record boundary)."
    )
    watch_interval_s: float = Field(
        0.05,
        gt=0,
        description="Waiting fetches see commits by other processes (other gateways, jobs) within this; one "
        "watcher per topic with waiters. On an object store, 0.25 keeps the request rate down.",
    )


class MaintenanceSettings(BaseModel):
    """The server's per-topic maintenance: segment roll-up, log cleanup, retention, vacuum."""

    model_config = _FROZEN

    interval_s: float = Field(5.0, gt=0, description="Maintenance check of a topic when commits are few.")
    threads: int = Field(2, ge=1, le=64, description="Threads that run every topic's maintenance passes.")
    rollup_every_commits: int = Field(32, ge=1, description="Wake the segment roll-up after this many commits.")
    rollup_fanout: int = Field(
        8,
        ge=2,
        description="Adjacent same-tier segments merged at once: at least this many, at most 4x as many "
        "(a tier per factor of it below the base).",
    )
    rollup_base_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Only segments below this are rolled up.")
    rollup_max_bytes: int = Field(64 * 1024 * 1024, gt=0, description="The roll-up never writes larger files.")
    cleanup_every_commits: int = Field(100, ge=1, description="Delta log cleanup, off the hot path.")
    log_keep_versions: int = Field(1000, ge=10, description="Log versions kept by topiclake's cleanup.")
    log_min_age_s: float = Field(10.0, ge=0, description="Log files younger than this are never cleaned.")
    retention_interval_s: float = Field(
        60.0, gt=0, description="How often retention runs: in the server per topic, and as the scheduled job."
    )
    vacuum_interval_s: float = Field(600.0, gt=0, description="Vacuum of replaced files (older than retention).")


#: Keys that moved out of [writer] (and [jobs]) into [maintenance]; old config files keep working.
_MOVED_TO_MAINTENANCE = {
    ("writer", "maintenance_interval_s"): "interval_s",
    ("writer", "rollup_every_commits"): "rollup_every_commits",
    ("writer", "rollup_fanout"): "rollup_fanout",
    ("writer", "rollup_base_bytes"): "rollup_base_bytes",
    ("writer", "rollup_max_bytes"): "rollup_max_bytes",
    ("writer", "cleanup_every_commits"): "cleanup_every_commits",
    ("writer", "log_keep_versions"): "log_keep_versions",
    ("writer", "log_min_age_s"): "log_min_age_s",
    ("writer", "retention_check_interval_s"): "retention_interval_s",
    ("writer", "vacuum_interval_s"): "vacuum_interval_s",
    ("jobs", "retention_interval_s"): "retention_interval_s",
}


class ApiKeySettings(BaseModel):
    """One API key (bearer token) and what it may do (Kafka's ACL model; see delta_log.core.acl).

    `acls` maps a topic name or glob (`*`, `orders-*`) to operations among produce, consume,
    describe, admin; `groups` maps a group name or glob to read, describe, admin. A key without
    `groups` (key files older than group ACLs) gets read on every group if it may consume or
    administer a topic. `transactional_ids` maps a transactional id or glob to write, describe.
    """

    model_config = _FROZEN

    key: SecretStr
    principal: str
    acls: dict[str, list[Literal["produce", "consume", "describe", "admin"]]] = Field(default_factory=dict)
    groups: dict[str, list[Literal["read", "describe", "admin"]]] | None = None
    #: Kafka's TransactionalId resource: a transactional id or glob -> write (use it: begin,
    #: produce, commit, abort) and describe. Absent: a key that may produce to some topic may
    #: write every transactional id.
    transactional_ids: dict[str, list[Literal["write", "describe"]]] | None = None


class AuthSettings(BaseModel):
    model_config = _FROZEN

    api_keys: list[ApiKeySettings] = Field(default_factory=list)
    open_docs: bool = Field(False, description="Serve /openapi.json, /docs and /redoc without a key.")
    open_metrics: bool = Field(False, description="Serve /metrics without a key (e.g. for a Prometheus scraper).")

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys)


class ServerSettings(BaseModel):
    model_config = _FROZEN

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_request_bytes: int = Field(64 * 1024 * 1024, gt=0)
    default_partitions: int = Field(1, ge=1)
    topic_idle_s: float = Field(
        60.0, gt=0, description="A topic unused this long gives back its writer, reader and caches (reopened on use)."
    )
    max_open_topics: int = Field(
        1000, ge=1, description="Beyond this many open topics, the least recently used give theirs back."
    )
    schema_refresh_s: float = Field(
        1.0,
        ge=0,
        description="Produce checks values against the schema registry as read at most this long ago "
        "(a version registered through another gateway applies after it).",
    )
    retry_after_seconds: int = Field(1, ge=1)
    max_body_bytes: int = Field(
        1024 * 1024, gt=0, description="Body limit of every route but produce (which has max_request_bytes)."
    )
    max_connections: int = Field(4096, ge=1, description="Open client connections (also capped by open files).")
    max_connections_per_client: int = Field(1024, ge=1, description="Open connections per client address.")
    header_timeout_s: float = Field(10.0, gt=0, description="A request's headers must arrive within this.")
    keep_alive_timeout_s: int = Field(15, ge=1, description="Idle kept-alive connections are closed after this.")
    ssl_certfile: str | None = Field(None, description="TLS: the server's certificate chain (PEM).")
    ssl_keyfile: str | None = Field(None, description="TLS: the certificate's private key (PEM).")
    ssl_ca_certs: str | None = Field(None, description="TLS: CA bundle to verify client certificates with.")
    ssl_client_auth: Literal["none", "optional", "required"] = Field(
        "required", description="With ssl_ca_certs: whether clients must present a certificate."
    )
    groups_sync_interval_s: float = Field(
        1.0, gt=0, description="How often the server looks for generations written by the rebalance job."
    )
    heartbeat_persist_interval_s: float = Field(
        5.0, gt=0, description="How often live groups' heartbeats are persisted to _system/consumer_groups."
    )
    group_max_size: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="The most members a classic group (Kafka's classic protocol, HTTP members) may have; a "
        "new member beyond it is refused GROUP_MAX_SIZE_REACHED (Kafka's group.max.size).",
    )
    consumer_group_max_size: int = Field(
        200,
        ge=1,
        le=100_000,
        description="The most members a consumer-protocol group (KIP-848) may have (Kafka's group.consumer.max.size).",
    )
    consumer_group_session_timeout_ms: int = Field(
        45_000,
        ge=1_000,
        le=3_600_000,
        description="Consumer-protocol groups (KIP-848): a member silent this long is removed "
        "(Kafka's group.consumer.session.timeout.ms).",
    )
    consumer_group_heartbeat_interval_ms: int = Field(
        5_000,
        ge=100,
        le=600_000,
        description="Consumer-protocol groups: how often members heartbeat, told to them in every answer "
        "(Kafka's group.consumer.heartbeat.interval.ms).",
    )
    consumer_group_min_session_timeout_ms: int = Field(
        45_000,
        ge=1_000,
        le=3_600_000,
        description="The least consumer.session.timeout.ms a group config may set (Kafka's "
        "group.consumer.min.session.timeout.ms); the bounds always include the default above.",
    )
    consumer_group_max_session_timeout_ms: int = Field(
        60_000,
        ge=1_000,
        le=3_600_000,
        description="The most consumer.session.timeout.ms a group config may set "
        "(Kafka's group.consumer.max.session.timeout.ms).",
    )
    consumer_group_min_heartbeat_interval_ms: int = Field(
        5_000,
        ge=100,
        le=600_000,
        description="The least consumer.heartbeat.interval.ms a group config may set "
        "(Kafka's group.consumer.min.heartbeat.interval.ms).",
    )
    consumer_group_max_heartbeat_interval_ms: int = Field(
        15_000,
        ge=100,
        le=600_000,
        description="The most consumer.heartbeat.interval.ms a group config may set "
        "(Kafka's group.consumer.max.heartbeat.interval.ms).",
    )
    allowed_hosts: tuple[str, ...] = Field(
        (),
        description='Host names the server answers to besides localhost, 127.0.0.1 and ::1 ("*": any). Empty: a '
        "server bound to a loopback address answers only to those (a page cannot rebind its own name onto it), "
        "one bound elsewhere to any name.",
    )
    console: bool = Field(
        True,
        description="Serve the web console at /console (its pages and scripts hold no data and load without "
        "a key; everything they show comes from the API, with the key the user logs in with).",
    )


class ClusterSettings(BaseModel):
    """Several gateways on one root: membership in the root, one coordinator per group."""

    model_config = _FROZEN

    gateway_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Default: host-pid-random, new at every start."
    )
    advertise_url: str | None = Field(
        None, description="The URL other gateways forward to. Default: http(s)://<host>:<port> as served."
    )
    heartbeat_interval_s: float = Field(1.0, gt=0, description="How often a gateway refreshes its record.")
    member_timeout_s: float = Field(
        6.0, gt=0, description="A gateway whose record is older than this is out: its groups move."
    )
    forward_timeout_s: float = Field(
        330.0, gt=0, description="Forwarded requests (a join waits for its rebalance, up to 300 s)."
    )
    route_produce: bool = Field(
        True,
        description="Append each partition's records on the gateway that owns it (forwarding them there); "
        "off: every gateway appends where the request arrives (Delta still keeps offsets unique).",
    )
    ca_file: str | None = Field(None, description="CA bundle to verify other gateways' https certificates.")
    client_cert: str | None = Field(None, description="Certificate presented to gateways that verify clients.")
    client_key: str | None = Field(None, description="Its key (default: in client_cert).")


class KafkaSettings(BaseModel):
    """The Kafka protocol listener every gateway serves beside HTTP (kafka_gateway)."""

    model_config = _FROZEN

    enabled: bool = Field(True, description="Serve Kafka's wire protocol beside HTTP.")
    host: str | None = Field(None, description="Bind address (default: the HTTP server's host).")
    port: int = Field(9092, ge=0, le=65535, description="0: any free port (tests).")
    advertised_host: str | None = Field(
        None, description="The host clients are told to connect to (Metadata). Default: the bind address."
    )
    advertised_port: int | None = Field(None, ge=1, le=65535, description="Default: the bound port.")
    node_id: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="This gateway's broker id. Default: derived from the advertised address (stable across restarts).",
    )
    max_request_bytes: int = Field(
        100 * 1024 * 1024, gt=0, le=2**31 - 1, description="Largest request frame (Kafka's socket.request.max.bytes)."
    )
    shared_port: bool = Field(
        False,
        description="Set by `serve --workers N` for each worker: `port` is shared with the sibling workers "
        "(SO_REUSEPORT, for bootstrapping), and each worker also listens on a port of its own, which it "
        "advertises, so a client reaches the broker that leads its partitions.",
    )
    max_connections: int = Field(4096, ge=1, description="Open Kafka connections (Kafka's max.connections).")
    max_connections_per_client: int = Field(
        1024, ge=1, description="Open Kafka connections per client address (max.connections.per.ip)."
    )
    idle_timeout_s: float = Field(600.0, gt=0, description="Idle connections close (connections.max.idle.ms).")
    max_in_flight: int = Field(
        16, ge=1, le=1024, description="Requests of one connection read ahead of their responses (pipelining)."
    )
    max_in_flight_bytes: int = Field(
        128 * 1024 * 1024, gt=0, description="Request bytes of one connection read ahead of their responses."
    )
    fetch_max_bytes: int = Field(
        55 * 1024 * 1024, gt=0, description="Cap of one Fetch response (Kafka's fetch.max.bytes)."
    )
    max_wait_ms: int = Field(30_000, ge=0, description="Cap of a Fetch's max wait.")
    failed_authentication_delay_ms: int = Field(
        100,
        ge=0,
        le=60_000,
        description="A failed SASL login is answered after this delay, then its connection closes "
        "(Kafka's connection.failed.authentication.delay.ms).",
    )


class SparkSettings(BaseModel):
    model_config = _FROZEN

    master: str = "local[2]"
    app_name: str = "topiclake"
    delta_version: str = "4.4.0"
    ivy_dir: str | None = Field(None, description="spark.jars.ivy: where Delta's jars are cached.")
    hadoop_aws_version: str = Field(
        "3.5.0", description="org.apache.hadoop:hadoop-aws (s3a), the Hadoop version pyspark ships with."
    )
    s3a: bool | None = Field(
        None,
        description="Put hadoop-aws and its AWS SDK on Spark's classpath (about 690 MB, resolved once); "
        "unset: when the root or the replica root is on S3.",
    )
    avro_package: str = Field(
        "org.apache.spark:spark-avro_2.13:4.1.1",
        description="Maven coordinates of Spark's from_avro (the typed views of Avro topics); empty: none. "
        "Since Spark 4.1 Avro's core is inside spark-sql and this module is only the expressions; "
        "4.1.1 is the newest the package index serves, and the suite checks it on this Spark.",
    )
    kafka_package: str = Field(
        "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
        description="Maven coordinates of Spark's own Kafka connector (format(\"kafka\") against the gateways' "
        "Kafka listener); empty: none.",
    )
    conf: dict[str, str] = Field(default_factory=dict)


class JobsSettings(BaseModel):
    model_config = _FROZEN

    schedule: bool = Field(True, description="`topiclake serve` runs the jobs below in a separate process.")
    compaction_interval_s: float = Field(300.0, gt=0)
    rebalance_interval_s: float = Field(30.0, gt=0)
    replication_interval_s: float = Field(60.0, gt=0)
    replica_root: str | None = Field(None, description="Where the replication job mirrors to; unset: no replication.")
    replica_storage_options: dict[str, str] = Field(
        default_factory=dict, description="Object-store options of replica_root (as `storage_options`)."
    )
    use_spark: bool = Field(False, description="Scheduled runs use Spark (spark.master) instead of in-process.")
    upsert_interval_s: float = Field(
        5.0, gt=0, description="How often the upsert job merges new records into upsert topics' <topic>_latest."
    )
    upsert_max_records: int = Field(1_000_000, ge=1, description="The most records one upsert MERGE takes.")
    compaction_min_segments: int = Field(8, ge=2)
    compaction_target_bytes: int = Field(128 * 1024 * 1024, gt=0)
    rebalance_lag_imbalance: float = Field(
        2.0, ge=1.0, description="Reassign when the most loaded member has this many times the least's lag."
    )
    rebalance_min_lag: int = Field(1000, ge=0, description="Lag differences below this are not worth a rebalance.")


class CatalogSettings(BaseModel):
    """Topics in Spark's Hive metastore (delta_log.spark.catalog; docs/SPARK.md, "The catalog")."""

    model_config = _FROZEN

    enabled: bool = Field(
        True, description="Sessions made by get_spark use the Hive metastore and keep the topics registered in it."
    )
    metastore_uri: str = Field(
        "",
        description="thrift://host:port of a Hive metastore you run; empty: topiclake's own, on embedded Derby "
        "under <root>/_system/metastore (a local folder for S3 roots), started on demand.",
    )
    metastore_port: int = Field(0, ge=0, le=65535, description="Port of topiclake's own metastore; 0: a free one.")
    metastore_heap: str = Field("384m", description="The metastore JVM's -Xmx.")
    database: str = Field("topics", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    sync_interval_s: float = Field(
        2.0, gt=0, le=3600, description="How often a live session compares the catalog with the root."
    )
    partitions_refresh_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="How often a live session rewrites _partitions (high watermarks, log start offsets: what "
        "_consumer_lag's lag is measured against); on a root whose refresh takes long, at most a tenth of the time.",
    )
    start_timeout_s: float = Field(120.0, gt=0, description="How long to wait for the metastore to answer.")


class SqlServerSettings(BaseModel):
    """`topiclake sql-server`: Spark's Thrift JDBC/ODBC server on the catalog (sql_endpoint)."""

    model_config = _FROZEN

    host: str = Field("127.0.0.1", description="Where the JDBC/ODBC endpoint listens.")
    port: int = Field(10000, ge=0, le=65535, description="Its port (HiveServer2's default).")


class TransactionSettings(BaseModel):
    """Kafka's transactions (broker.transactions): the coordinator's limits."""

    model_config = _FROZEN

    max_timeout_ms: int = Field(
        900_000,
        ge=1_000,
        le=2**31 - 1,
        description="The longest transaction.timeout.ms a producer may ask for (Kafka's transaction.max.timeout.ms).",
    )
    max_transactional_ids: int = Field(
        100_000, ge=1, description="Transactional ids one gateway coordinates at once; more are refused."
    )
    max_partitions: int = Field(
        10_000, ge=1, description="Partitions and groups one transaction may touch; more are refused."
    )
    id_expiration_ms: int = Field(
        7 * 24 * 3600 * 1000,
        ge=60_000,
        description="A transactional id idle this long is forgotten: its next producer gets a new producer id "
        "(Kafka's transactional.id.expiration.ms).",
    )
    max_landing_gap_ms: float = Field(
        20.0,
        ge=0,
        le=1000,
        description="A transactional id under load: its next committed transaction lands in the topic tables "
        "3x as long after its previous landing ended as that one took, at most this, so the transactions decided "
        "meanwhile land in one Delta commit a topic: less CPU and fewer commits, for at most this much more time "
        "before read_committed readers see a transaction (its producer's answer does not wait). 0: each at once. "
        "This gap applies while a consumer waits on this gateway for new records of the landing's topics; "
        "see unwatched_landing_gap_ms.",
    )
    unwatched_landing_gap_ms: float = Field(
        100.0,
        ge=0,
        le=5000,
        description="The same gap while no consumer (a Kafka fetch, an HTTP long poll or stream) waits on this "
        "gateway for new records of the landing's topics: a busy producer's transactions then land a few at a "
        "time (at most 8), in fewer and bigger Delta commits, and table readers (Spark, SQL) and consumers of "
        "other gateways see them up to this much later. A consumer that begins to wait cuts it to "
        "max_landing_gap_ms. Below max_landing_gap_ms, that applies.",
    )


class Settings(BaseSettings):
    """Everything topiclake reads from configuration."""

    model_config = SettingsConfigDict(
        env_prefix="TOPICLAKE_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        toml_file=DEFAULTS_TOML,
    )

    root: str = Field("./data", description="Local folder or object-store URI holding every table.")
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="Object-store options (delta-rs names: AWS_ENDPOINT_URL, AWS_REGION, AWS_ALLOW_HTTP, "
        "credentials); an S3 root takes what is missing from the standard AWS environment variables.",
    )
    writer: WriterSettings = WriterSettings()
    reader: ReaderSettings = ReaderSettings()
    maintenance: MaintenanceSettings = MaintenanceSettings()
    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    cluster: ClusterSettings = ClusterSettings()
    kafka: KafkaSettings = KafkaSettings()
    transactions: TransactionSettings = TransactionSettings()
    spark: SparkSettings = SparkSettings()
    jobs: JobsSettings = JobsSettings()
    catalog: CatalogSettings = CatalogSettings()
    sql_server: SqlServerSettings = SqlServerSettings()

    @model_validator(mode="before")
    @classmethod
    def _move_legacy_keys(cls, data: Any) -> Any:
        """[writer] roll-up/cleanup/retention keys and [jobs] retention_interval_s now live in
        [maintenance]; accept them where they were (a user's old key overrides the packaged default)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for (section, key), new_key in _MOVED_TO_MAINTENANCE.items():
            old = data.get(section)
            if isinstance(old, dict) and key in old:
                old = dict(old)
                value = old.pop(key)
                data[section] = old
                maintenance = dict(data.get("maintenance") or {})
                maintenance[new_key] = value
                data["maintenance"] = maintenance
        return data

    @model_validator(mode="before")
    @classmethod
    def _object_store_environment(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        data["storage_options"] = object_store_options(
            str(data.get("root") or ""), dict(data.get("storage_options") or {})
        )
        jobs = data.get("jobs")
        if isinstance(jobs, dict) and jobs.get("replica_root"):
            data["jobs"] = jobs | {
                "replica_storage_options": object_store_options(
                    str(jobs["replica_root"]), dict(jobs.get("replica_storage_options") or {})
                )
            }
        return data

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        user_toml = os.environ.get("TOPICLAKE_CONFIG")
        if user_toml:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(user_toml)))
        sources.append(TomlConfigSettingsSource(settings_cls, toml_file=DEFAULTS_TOML))
        return tuple(sources)


def load_settings(**overrides: object) -> Settings:
    """Build settings from overrides, environment, TOPICLAKE_CONFIG and packaged defaults."""
    return Settings(**overrides)  # type: ignore[arg-type]
