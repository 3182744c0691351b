"""A real Apache Kafka 4.x broker (KRaft, single node, 127.0.0.1) for side-by-side benchmarks.

The jars come from Maven Central through Maven (`bench/kafka/pom.xml`, versions pinned there),
copied once into `~/.cache/topiclake/kafka-<version>/libs`. The broker is formatted and started
with `java` directly (no scripts, no Docker), and stopped by its pid.

    with KafkaBroker(workdir) as kafka:
        kafka.create_topic("t", partitions=4)
        kafka.tool("org.apache.kafka.tools.ProducerPerformance", "--topic", "t", ...)

    python -m bench.kafka_broker          # resolve the jars, start a broker, print its address, stop
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

POM = Path(__file__).with_name("kafka") / "pom.xml"
KAFKA_VERSION = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text()).group(1)  # type: ignore[union-attr]
CACHE = Path(os.environ.get("TOPICLAKE_CACHE", Path.home() / ".cache" / "topiclake")) / f"kafka-{KAFKA_VERSION}"

LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders><Console name="stderr" target="SYSTEM_ERR"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console></Appenders>
  <Loggers><Root level="WARN"><AppenderRef ref="stderr"/></Root></Loggers>
</Configuration>
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    exe = Path(home) / "bin" / "java" if home else None
    found = str(exe) if exe and exe.exists() else shutil.which("java")
    if not found:
        raise RuntimeError("Kafka needs Java 17+: install a JDK or set JAVA_HOME.")
    return found


def ensure_jars() -> Path:
    """The broker's and tools' jars, resolved through Maven on first use."""
    libs = CACHE / "libs"
    stamp = CACHE / ".complete"
    wanted = hashlib.sha256(POM.read_bytes()).hexdigest()  # a changed pom resolves again
    if stamp.exists() and stamp.read_text() == wanted:
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise RuntimeError("Resolving Kafka's jars needs Maven (`mvn`) on PATH.")
    tmp = CACHE / "libs.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(
        [mvn, "-q", "-f", str(POM), "dependency:copy-dependencies", f"-DoutputDirectory={tmp}"],
        check=True,
    )
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)
    (CACHE / "log4j2.xml").write_text(LOG4J2)
    stamp.write_text(wanted)
    return libs


def _cluster_id() -> str:
    # one in 64 starts with "-"; the caller passes it as --cluster-id=ID, or it reads as an option
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaBroker:
    """One KRaft broker+controller on 127.0.0.1, in `workdir`."""

    def __init__(
        self,
        workdir: Path,
        *,
        heap: str = "2g",
        config: dict[str, str] | None = None,
        client_config: dict[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.heap = heap
        #: more broker settings (server.properties), after the defaults below
        self.config = dict(config or {})
        #: what Kafka's tools need to connect (a SASL listener's login), as their --command-config
        self.client_config = dict(client_config or {})
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.libs = ensure_jars()
        self.log = self.workdir / "kafka.log"

    def _java(self, main: str, *args: str, heap: str = "512m") -> list[str]:
        return [
            java(),
            f"-Xmx{heap}",
            f"-Dlog4j2.configurationFile={CACHE / 'log4j2.xml'}",
            "-cp",
            f"{self.libs}/*",
            main,
            *args,
        ]

    def tool(self, main: str, *args: str, timeout: float = 900) -> str:
        """Run one of Kafka's Java tools (e.g. org.apache.kafka.tools.ProducerPerformance); its stdout."""
        out = subprocess.run(self._java(main, *args), capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{main} failed: {out.stderr[-2000:]}")
        return out.stdout

    def _command_config(self) -> list[str]:
        if not self.client_config:
            return []
        path = self.workdir / "client.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.client_config.items()))
        return ["--command-config", str(path)]

    def start(self, timeout: float = 120) -> KafkaBroker:
        self.workdir.mkdir(parents=True, exist_ok=True)
        props = self.workdir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    f"log.dirs={self.workdir / 'logs'}",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=false",
                    *(f"{k}={v}" for k, v in self.config.items()),
                ]
            )
            + "\n"
        )
        self.tool(
            "kafka.tools.StorageTool", "format", "--standalone", f"--cluster-id={_cluster_id()}", "-c", str(props)
        )
        return self.launch(timeout)

    def launch(self, timeout: float = 120, *, wait: bool = True) -> KafkaBroker:
        """Start the broker on its formatted storage (again, after `kill9`: it recovers its log);
        `wait`: until its topic listing answers."""
        props = self.workdir / "server.properties"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(props), heap=self.heap), stdout=out, stderr=subprocess.STDOUT
            )
        if not wait:
            return self
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Kafka exited: {self.log.read_text()[-3000:]}")
            try:
                self.tool(
                    "org.apache.kafka.tools.TopicCommand",
                    "--bootstrap-server",
                    self.bootstrap,
                    "--list",
                    *self._command_config(),
                    timeout=60,
                )
                return self
            except RuntimeError:
                time.sleep(1)
        self.stop()
        raise RuntimeError("Kafka did not come up")

    def create_topic(self, name: str, *, partitions: int = 1) -> None:
        self.tool(
            "org.apache.kafka.tools.TopicCommand",
            "--bootstrap-server",
            self.bootstrap,
            "--create",
            "--topic",
            name,
            "--partitions",
            str(partitions),
            "--replication-factor",
            "1",
            *self._command_config(),
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="topiclake-kafka-"))
    try:
        with KafkaBroker(work) as kafka:
            kafka.create_topic("smoke", partitions=2)
            print(f"Kafka {KAFKA_VERSION} up at {kafka.bootstrap} (pid {kafka.proc.pid if kafka.proc else '?'})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
