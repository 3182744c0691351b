"""pydantic-settings models for topiclake.

Precedence (highest first): explicit keyword arguments, environment variables
(`TOPICLAKE_` prefix, `__` for nesting, e.g. `TOPICLAKE_WRITER__LINGER_MS=2`), the TOML file
named by `TOPICLAKE_CONFIG` (if set), then the packaged defaults in `conf/topiclake.toml`.

The composition root (CLI, `create_app`) builds settings once and passes them down; no module
keeps a global instance.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
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


class WriterSettings(BaseModel):
    """Group commit and Delta table hygiene for topic writers."""

    model_config = _FROZEN

    linger_ms: float = Field(2.0, ge=0, description="How long a flush waits for more requests.")
    batch_bytes: int = Field(8 * 1024 * 1024, gt=0, description="A flush starts once this many bytes wait.")
    max_queue_bytes: int = Field(256 * 1024 * 1024, gt=0, description="Back-pressure above this.")
    max_commit_attempts: int = Field(50, ge=1, description="Conflict retries before giving up.")
    reopen_every_commits: int = Field(2000, ge=1, description="Re-open the table to keep memory flat.")
    cleanup_every_commits: int = Field(100, ge=1, description="Expired-log cleanup, off the hot path.")
    rollup_every_commits: int = Field(32, ge=1, description="Wake the segment roll-up after this many commits.")
    rollup_fanout: int = Field(8, ge=2, description="Adjacent same-tier segments merged at once.")
    rollup_base_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Only segments below this are rolled up.")
    rollup_max_bytes: int = Field(64 * 1024 * 1024, gt=0, description="The roll-up never writes larger files.")
    maintenance_interval_s: float = Field(5.0, gt=0, description="Roll-up check when commits are few.")
    vacuum_interval_s: float = Field(600.0, gt=0, description="Vacuum of replaced files (older than retention).")
    retention_check_interval_s: float = Field(60.0, gt=0, description="How often the server applies retention.")
    checkpoint_interval: int = Field(100, ge=1)
    log_retention: str = Field("interval 7 days", description="delta.logRetentionDuration of new topics")
    log_keep_versions: int = Field(1000, ge=10, description="Log versions kept by topiclake's cleanup.")
    log_min_age_s: float = Field(10.0, ge=0, description="Log files younger than this are never cleaned.")
    deleted_file_retention: str = Field("interval 1 hours", description="delta.deletedFileRetentionDuration")
    max_row_group_rows: int = Field(8192, gt=0, description="Parquet row group size; a fetch reads only these.")
    compression: Literal["SNAPPY", "ZSTD", "LZ4_RAW", "UNCOMPRESSED"] = "SNAPPY"


class ApiKeySettings(BaseModel):
    """One API key (bearer token) and what it may do.

    `acls` maps a topic name or glob (`*`, `orders-*`) to operations among produce, consume, admin.
    """

    model_config = _FROZEN

    key: SecretStr
    principal: str
    acls: dict[str, list[Literal["produce", "consume", "admin"]]] = Field(default_factory=dict)


class AuthSettings(BaseModel):
    model_config = _FROZEN

    api_keys: list[ApiKeySettings] = Field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys)


class ServerSettings(BaseModel):
    model_config = _FROZEN

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_request_bytes: int = Field(64 * 1024 * 1024, gt=0)
    default_partitions: int = Field(1, ge=1)
    retry_after_seconds: int = Field(1, ge=1)
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    groups_sync_interval_s: float = Field(
        1.0, gt=0, description="How often the server looks for generations written by the rebalance job."
    )
    heartbeat_persist_interval_s: float = Field(
        5.0, gt=0, description="How often live groups' heartbeats are persisted to _system/consumer_groups."
    )


class SparkSettings(BaseModel):
    model_config = _FROZEN

    master: str = "local[2]"
    app_name: str = "topiclake"
    delta_version: str = "4.4.0"
    ivy_dir: str | None = Field(None, description="spark.jars.ivy: where Delta's jars are cached.")
    conf: dict[str, str] = Field(default_factory=dict)


class JobsSettings(BaseModel):
    model_config = _FROZEN

    schedule: bool = Field(True, description="`topiclake serve` runs the jobs below in a separate process.")
    compaction_interval_s: float = Field(300.0, gt=0)
    retention_interval_s: float = Field(300.0, gt=0)
    rebalance_interval_s: float = Field(30.0, gt=0)
    replication_interval_s: float = Field(60.0, gt=0)
    replica_root: str | None = Field(None, description="Where the replication job mirrors to; unset: no replication.")
    replica_storage_options: dict[str, str] = Field(default_factory=dict)
    use_spark: bool = Field(False, description="Scheduled runs use Spark (spark.master) instead of in-process.")
    compaction_min_segments: int = Field(8, ge=2)
    compaction_target_bytes: int = Field(128 * 1024 * 1024, gt=0)
    rebalance_lag_imbalance: float = Field(
        2.0, ge=1.0, description="Reassign when the most loaded member has this many times the least's lag."
    )
    rebalance_min_lag: int = Field(1000, ge=0, description="Lag differences below this are not worth a rebalance.")


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
    storage_options: dict[str, str] = Field(default_factory=dict)
    writer: WriterSettings = WriterSettings()
    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    spark: SparkSettings = SparkSettings()
    jobs: JobsSettings = JobsSettings()

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
