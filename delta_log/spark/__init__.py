"""The Spark face of delta_log: session factory (Kafka-compatible source and SQL come later)."""

from delta_log.spark.session import get_spark, spark_conf_from_file

__all__ = ["get_spark", "spark_conf_from_file"]
