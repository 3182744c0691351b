"""Settings models and default config files. Imports no project code."""

from conf.settings import (
    ApiKeySettings,
    AuthSettings,
    CatalogSettings,
    ClusterSettings,
    JobsSettings,
    KafkaSettings,
    MaintenanceSettings,
    ReaderSettings,
    ServerSettings,
    Settings,
    SparkSettings,
    SqlServerSettings,
    TransactionSettings,
    WriterSettings,
    load_settings,
)

__all__ = [
    "ApiKeySettings",
    "AuthSettings",
    "CatalogSettings",
    "ClusterSettings",
    "JobsSettings",
    "KafkaSettings",
    "MaintenanceSettings",
    "ReaderSettings",
    "ServerSettings",
    "Settings",
    "SparkSettings",
    "SqlServerSettings",
    "TransactionSettings",
    "WriterSettings",
    "load_settings",
]
