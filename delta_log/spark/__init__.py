"""The Spark face of delta_log: session factory, the Kafka-compatible `topiclake` source, SQL."""

from typing import Any

from delta_log.spark.session import get_spark, spark_conf_from_file

__all__ = ["get_spark", "register_topics", "spark_conf_from_file"]


def register_topics(*args: Any, **kwargs: Any) -> dict[str, str]:
    """See delta_log.spark.sql.register_topics (imported lazily: it needs pyspark)."""
    from delta_log.spark.sql import register_topics as _register

    return _register(*args, **kwargs)
