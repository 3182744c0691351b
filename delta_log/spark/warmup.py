"""Resolve Delta's JVM jars once (setup step): build a SparkSession, write and read a Delta table."""

from __future__ import annotations

import tempfile

from delta_log.spark.session import get_spark


def main() -> None:
    spark = get_spark(app_name="topiclake-setup")
    with tempfile.TemporaryDirectory() as tmp:
        spark.range(3).write.format("delta").save(f"{tmp}/t")
        assert spark.read.format("delta").load(f"{tmp}/t").count() == 3
    spark.stop()
    print("Spark + Delta ready")


if __name__ == "__main__":
    main()
