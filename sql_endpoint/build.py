"""The SQL endpoint's Java classes (java/topiclake/sql) and the package jars its driver's class path
needs, built and resolved once, cached under ~/.cache/topiclake (delta_log.spark.java_build).

    python -m sql_endpoint.build      (make setup runs it; the server does it too if needed)
"""

from __future__ import annotations

from pathlib import Path

from delta_log.spark.java_build import ensure_jar

SOURCES = Path(__file__).parent / "java"


def endpoint_jar() -> Path:
    return ensure_jar(SOURCES, "topiclake-sql")


if __name__ == "__main__":
    from conf import load_settings
    from delta_log.spark.java_build import package_jars

    print(endpoint_jar())
    print(f"{len(package_jars(load_settings()))} package jars resolved for the SQL endpoint")
