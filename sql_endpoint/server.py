"""`topiclake sql-server`: Spark's Thrift JDBC/ODBC server (HiveServer2's protocol, the jar pyspark
ships) inside a PySpark driver made by get_spark, so it has Delta, the catalog and its sync.

- Logins: with API keys configured, the JDBC user is a key's principal and the password the key
  (as Kafka's SASL/PLAIN); Hive's CUSTOM authentication calls `topiclake.sql.KeyAuthentication`,
  which compares SHA-256 hashes the driver hands it (the keys never reach the JVM). With no keys,
  any login is accepted, as every other door of an unsecured root.
- Tables: a principal sees and reads `topics.<t>` and `topics_typed.<t>` for the topics it may
  consume (delta_log.core.acl, the one rule), `_partitions` and `_consumer_lag` when it may describe
  every topic (`*`), and everything when it administers everything. The rest is hidden
  (`AccessFilterHook`: SHOW TABLES, the driver's getTables) and refused as not found
  (`ReadOnlyAccess`, a check rule on every statement). Recomputed at each catalog sync.
- Read-only for everyone: queries and the SHOW / DESCRIBE / SET / USE commands BI tools send. Topic
  tables are written only by the gateways, which assign offsets.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import signal
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conf import ApiKeySettings, Settings
from delta_log.core.acl import principal_of
from delta_log.spark.java_build import package_jars
from delta_log.table.storage import StorageRoot
from sql_endpoint.build import endpoint_jar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
_DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_ON_CLASS_PATH = ("io.delta_delta-spark_", "io.delta_delta-storage-", "org.apache.spark_spark-avro_")


def endpoint_conf(settings: Settings, host: str, port: int) -> dict[str, str]:
    """The Spark and HiveServer2 settings of the endpoint's session (pure but for the jar's path)."""
    jar = str(endpoint_jar())
    given = settings.spark.conf
    extensions = given.get("spark.sql.extensions", _DELTA_EXTENSION)
    auth = "CUSTOM" if settings.auth.enabled else "NONE"
    java_options = " ".join(
        o
        for o in (
            given.get("spark.driver.extraJavaOptions", ""),
            # Hive reads the class from a fresh HiveConf (system properties), not from the server's
            "-Dhive.server2.custom.authentication.class=topiclake.sql.KeyAuthentication",
        )
        if o
    )
    # Delta's and spark-avro's own jars, not their dependencies (an older Jackson among them would
    # come before pyspark's on the class path)
    packaged = [j for j in package_jars(settings) if Path(j).name.startswith(_ON_CLASS_PATH)]
    class_path = ":".join(p for p in (given.get("spark.driver.extraClassPath", ""), jar, *packaged) if p)
    return {
        "spark.sql.extensions": f"{extensions},topiclake.sql.ReadOnlyAccess",
        "spark.driver.extraClassPath": class_path,
        "spark.driver.extraJavaOptions": java_options,
        "spark.hadoop.hive.metastore.filter.hook": "topiclake.sql.AccessFilterHook",
        # else Hive swaps the filter hook for its own authorizer's after the first CREATE TABLE
        "spark.hadoop.hive.security.authorization.manager": (
            "org.apache.hadoop.hive.ql.security.authorization.DefaultHiveAuthorizationProvider"
        ),
        "spark.hadoop.hive.server2.thrift.bind.host": host,
        "spark.hadoop.hive.server2.thrift.port": str(port),
        "spark.hadoop.hive.server2.transport.mode": "binary",
        "spark.hadoop.hive.server2.authentication": auth,
        "spark.hadoop.hive.server2.enable.doAs": "false",
        "spark.hadoop.hive.server2.allow.user.substitution": "false",
    }


@dataclass(frozen=True, slots=True)
class Grants:
    """What the principals of the configured keys may read, for the JVM's topiclake.sql.Access."""

    admins: set[str]  # may read everything
    tables: dict[str, set[str]]  # principal -> lower-case "db.table" it may see and read
    folders: dict[str, list[str]]  # principal -> those tables' folders, "authority/path"


def _folder(uri: str) -> str:
    """A location as Access compares it: no scheme ("/data/topics/t", "bucket/root/topics/t")."""
    return uri.split("://", 1)[1] if "://" in uri else uri


def endpoint_keys(settings: Settings) -> list[ApiKeySettings]:
    """The keys that can log in here: the JDBC user names a principal, so a principal must have
    one key (two keys with different ACLs could not be told apart), and Hive's server cuts a user
    name at `@` or `/` (Kerberos style), so such principals would run as someone else."""
    counts = Counter(k.principal for k in settings.auth.api_keys)
    usable = []
    for key in settings.auth.api_keys:
        if counts[key.principal] > 1:
            log.warning(
                "principal %r has %d API keys: none of them logs in to the SQL endpoint",
                key.principal,
                counts[key.principal],
            )
        elif "@" in key.principal or "/" in key.principal:
            log.warning("principal %r has @ or / in its name: it cannot log in to the SQL endpoint", key.principal)
        else:
            usable.append(key)
    return usable


def grants(settings: Settings, tables: dict[str, str], upserts: dict[str, str] | None = None) -> Grants:
    """Each usable key's reading rights over {topic: table} and {topic: upsert table} (pure): consume
    on a topic reads its table, typed view and upsert table; describe on every topic reads
    `_partitions`, and describe on every topic and group `_consumer_lag`; admin on everything reads
    everything (delta_log.core.acl decides each)."""
    db = settings.catalog.database.lower()
    storage = StorageRoot(settings.root, settings.storage_options)
    out = Grants(set(), {}, {})
    for key in endpoint_keys(settings):
        principal = principal_of(key.principal, key.acls, key.groups, key.transactional_ids)
        if principal.administers_all():
            out.admins.add(principal.name)
            continue
        names = out.tables.setdefault(principal.name, set())
        folders = out.folders.setdefault(principal.name, [])
        for topic, table in tables.items():
            if principal.allows("consume", topic):
                names |= {f"{db}.{table}".lower(), f"{db}_typed.{table}".lower()}
                folders.append(_folder(storage.topic_uri(topic)))
                if upserts and topic in upserts:
                    names.add(f"{db}.{upserts[topic]}".lower())
                    folders.append(_folder(storage.latest_uri(topic)))
        if principal.allows("describe", "*"):
            names.add(f"{db}._partitions")
            folders.append(_folder(storage.system_uri("partitions")))
            if principal.allows_group("describe", "*"):
                names.add(f"{db}._consumer_lag")
                folders.append(_folder(storage.system_uri("consumer_offsets")))
    return out


class Endpoint:
    """The Thrift server in this process's session."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark = spark
        self.settings = settings
        self._server: Any = None
        self._access = spark._jvm.topiclake.sql.Access  # type: ignore[union-attr]

    def start(self) -> None:
        jvm = self.spark._jvm
        assert jvm is not None
        self._access.setOpen(not self.settings.auth.enabled)
        self._access.captureBaseSettings(self.spark._jsparkSession)  # what JDBC sessions' settings go back to
        self.update({}, {})
        self._server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithSparkSession(
            self.spark._jsparkSession,
            False,  # a server error must not exit the driver's JVM under us
        )

    def update(self, tables: dict[str, str], upserts: dict[str, str]) -> None:
        """Hand the JVM what each principal may do now (after each catalog sync)."""
        jvm = self.spark._jvm
        assert jvm is not None
        granted = grants(self.settings, tables, upserts)
        hashes = jvm.java.util.HashMap()
        for key in endpoint_keys(self.settings):
            digest = hashlib.sha256(key.key.get_secret_value().encode()).digest()
            hashes.put(key.principal, bytearray(digest))
        names = jvm.java.util.HashMap()
        for principal, readable in granted.tables.items():
            names.put(principal, _java_set(jvm, readable))
        folders = jvm.java.util.HashMap()
        for principal, paths in granted.folders.items():
            folders.put(principal, _java_list(jvm, paths))
        self._access.set(hashes, _java_set(jvm, granted.admins), names, folders)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def _java_set(jvm: Any, items: set[str]) -> Any:
    out = jvm.java.util.HashSet()
    for item in items:
        out.add(item)
    return out


def _java_list(jvm: Any, items: list[str]) -> Any:
    out = jvm.java.util.ArrayList()
    for item in items:
        out.add(item)
    return out


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(settings: Settings, host: str | None = None, port: int | None = None) -> int:
    """Run the endpoint until SIGTERM or SIGINT. Prints one line when it listens."""
    from delta_log.spark import get_spark
    from delta_log.spark.session import catalog_sync

    host = host or settings.sql_server.host
    port = settings.sql_server.port if port is None else port
    if not settings.catalog.enabled:
        raise SystemExit("the SQL endpoint serves the catalog: set catalog.enabled = true")
    if settings.auth.enabled and not _loopback(host):
        log.warning(
            "the SQL endpoint listens on %s without TLS: JDBC logins (API keys) cross the network in clear "
            "text; keep it on 127.0.0.1 and reach it through an SSH tunnel or a TLS proxy",
            host,
        )
    conf = {**settings.spark.conf, **endpoint_conf(settings, host, port)}
    settings = settings.model_copy(update={"spark": settings.spark.model_copy(update={"conf": conf})})
    spark = get_spark(settings, app_name="topiclake-sql-server")
    endpoint = Endpoint(spark, settings)
    sync = catalog_sync(settings)
    assert sync is not None  # get_spark started it: catalog sessions keep one
    endpoint.start()
    endpoint.update(sync.tables(), sync.upsert_tables())
    sync.listeners.append(endpoint.update)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"topiclake SQL endpoint: jdbc:hive2://{host}:{port}/default (root {settings.root})", flush=True)
    stop.wait()
    endpoint.stop()
    spark.stop()
    return 0
