"""Resolve Delta's and s3a's JVM jars once (setup step): build a SparkSession, write and read a Delta table."""

from __future__ import annotations

import tempfile

from conf import load_settings
from delta_log.spark.session import get_spark


def main() -> None:
    settings = load_settings()
    spark = get_spark(
        settings.model_copy(update={"spark": settings.spark.model_copy(update={"s3a": True})}),
        app_name="topiclake-setup",
    )
    with tempfile.TemporaryDirectory() as tmp:
        spark.range(3).write.format("delta").save(f"{tmp}/t")
        assert spark.read.format("delta").load(f"{tmp}/t").count() == 3
    spark.stop()
    print("Spark + Delta (+ s3a) ready")


if __name__ == "__main__":
    main()
