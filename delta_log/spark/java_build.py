"""Our few Java classes, compiled with the JDK's javac against the jars pyspark ships, once per
version of their sources, into ~/.cache/topiclake/java/<name>-<hash>.jar:

- `delta_log/spark/java`: the root's metastore service bound to one address (metastore.py);
- `sql_endpoint/java`: the SQL endpoint's logins and table access (sql_endpoint.build).

    python -m delta_log.spark.java_build      (make setup runs it; the metastore builds it if needed)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conf import Settings

CACHE = Path(os.environ.get("TOPICLAKE_CACHE", Path.home() / ".cache" / "topiclake")) / "java"
METASTORE_SOURCES = Path(__file__).parent / "java"


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / name) if home and (Path(home) / "bin" / name).exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"`{name}` was not found: topiclake's catalog needs a JDK 17 (see README, Setup)")
    return found


def jar_path(sources: Path, name: str) -> Path:
    """The jar of `sources` as they are now, for this pyspark (built or not)."""
    digest = hashlib.sha256()
    for src in sorted(sources.rglob("*.java")):
        digest.update(src.relative_to(sources).as_posix().encode() + b"\0" + src.read_bytes())
    digest.update(str(_pyspark_jars()).encode())
    return CACHE / f"{name}-{digest.hexdigest()[:16]}.jar"


def ensure_jar(sources: Path, name: str) -> Path:
    """The jar of `sources`, compiled if this version is not cached yet.

    Raises: RuntimeError with javac's output when they do not compile, or without a JDK."""
    jar = jar_path(sources, name)
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        files = [str(p) for p in sorted(sources.rglob("*.java"))]
        done = subprocess.run(
            [_tool("javac"), "--release", "17", "-nowarn", "-cp", f"{_pyspark_jars()}/*", "-d", str(classes), *files],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{name}'s Java classes did not compile:\n{done.stdout}{done.stderr}")
        staged = Path(tmp) / jar.name
        subprocess.run([_tool("jar"), "cf", str(staged), "-C", str(classes), "."], check=True)
        staged.replace(jar)  # atomic: a concurrent build finds a whole jar or none
    return jar


_LIST_JARS = """
import os, sys
os.environ["TOPICLAKE_CATALOG__ENABLED"] = "false"
from conf import load_settings
from delta_log.spark import get_spark
spark = get_spark(load_settings())
print("JARS " + (spark.sparkContext.getConf().get("spark.jars", "") or ""), flush=True)
spark.stop()
"""


def package_jars(settings: Settings) -> list[str]:
    """Local paths of the jars `spark.jars.packages` resolves for these settings (Delta, spark-avro,
    the Kafka connector, with their dependencies), found once by a session of their own and cached.

    The endpoint puts them on the driver's class path: Hive's service threads load classes (Delta's
    catalog) through loaders that do not see what spark.jars.packages adds at run time."""
    key = hashlib.sha256(
        json.dumps(
            [
                settings.spark.delta_version,
                settings.spark.avro_package,
                settings.spark.kafka_package,
                settings.spark.ivy_dir,
            ]
        ).encode()
    ).hexdigest()[:16]
    cached = CACHE / f"packages-{key}.json"
    if cached.exists():
        jars = json.loads(cached.read_text())
        if all(Path(j).exists() for j in jars):
            return list(jars)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", _LIST_JARS], capture_output=True, text=True, env=env, timeout=900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("JARS ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"could not resolve Spark's packages for the SQL endpoint:\n{done.stderr[-3000:]}")
    jars = [j.removeprefix("file://") for j in line[5:].split(",") if j]
    CACHE.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(jars))
    return jars


if __name__ == "__main__":
    print(ensure_jar(METASTORE_SOURCES, "topiclake-metastore"))
    sys.exit(0)
