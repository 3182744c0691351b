"""Java programs of the tests (a Kafka client or Streams app in one source file), compiled against
Kafka's jars (bench.kafka_broker.ensure_jars) and cached by the source's hash."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from bench.kafka_broker import ensure_jars, java


def classes(source: Path) -> Path:
    """The folder holding `source` compiled (its class named as the file)."""
    libs = ensure_jars()
    digest = hashlib.sha256(source.read_bytes() + str(libs).encode()).hexdigest()[:16]
    out = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "topiclake" / f"java-{source.stem}" / digest
    if not (out / f"{source.stem}.class").exists():
        tmp = out.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        javac = Path(java()).with_name("javac")
        subprocess.run([str(javac), "-cp", f"{libs}/*", "-d", str(tmp), str(source)], check=True)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def command(source: Path, *args: str, heap: str = "512m") -> list[str]:
    """The command that runs `source`'s main class with `args`."""
    libs = ensure_jars()
    return [
        java(),
        f"-Xmx{heap}",
        f"-Dlog4j2.configurationFile={libs.parent / 'log4j2.xml'}",
        "-cp",
        f"{classes(source)}:{libs}/*",
        source.stem,
        *args,
    ]
