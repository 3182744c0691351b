"""Transactional produce, topiclake's Kafka listener beside Apache Kafka, in one run.

    python -m bench.txn_bench            # 3 alternating repeats, 8 s a run
    python -m bench.txn_bench --quick    # 1 repeat, 4 s a run
    python -m bench.txn_bench --compare <checkout>   # and a server of another checkout ("before")

The same clients run against a Kafka 4.x broker (KRaft, 127.0.0.1, bench/kafka_broker.py) and a
`topiclake serve` on 127.0.0.1, alternating: Java's producer (bench/kafka/TxnPerf.java) and
confluent-kafka's, 1 KB records, acks=all, idempotent, on a 4-partition topic:
- plain: no transaction, for as long as a run lasts (the throughput a transaction is compared to);
- transactional: transactions of 100 and of 10,000 records, each commit timed (commitTransaction:
  the records not yet acked, then EndTxn).
Reports throughput, commit latency p50/p99/mean, each system's overhead, transactional / plain
throughput (the target: topiclake's no worse than Kafka's), and the server's CPU time a
transaction (its process's user + system time over the run: what a transaction costs a server
when the cores are shared). Rounds of plain runs warm both systems until their plain rates hold
(within 20% of the round before, 5 rounds at most), then a 2 s run of each transactional mode;
none is counted. Before each run the page cache's dirty data is written out and the servers are
given up to 15 s to finish the previous run's work (`settle`).
`--compare DIR` runs a server of another checkout (e.g. a worktree of the previous main) in the same rotation, as "before".
Results: bench/results/txn_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.common import percentile, print_table, write_results
from bench.kafka_broker import KafkaBroker
from bench.produce_bench import random_values
from tests.e2e import java_build
from tests.e2e.server import ServerProcess

PARTITIONS = 4
SIZE = 1024
PER_TXN = (100, 10_000)
TXN_PERF = Path(__file__).with_name("kafka") / "TxnPerf.java"
#: each client, transactional mode and system runs this long once before the counted rounds
WARM_S = 2.0
#: at most this long, before each run, for the servers to finish the previous run's work (`settle`)
SETTLE_MAX_S = 15.0
#: rounds of plain runs that warm the systems, at most; they stop once every plain rate moved by
#: WARM_TOLERANCE at most since the round before
WARM_ROUNDS = 5
WARM_TOLERANCE = 0.2


def java_producer(bootstrap: str, topic: str, per_txn: int, seconds: float, transactional: bool) -> dict[str, Any]:
    """TxnPerf's figures. A run the Java client fails with InvalidTxnStateException is run again,
    up to twice (said on stdout): Kafka 4.x's producer can send EndTxn before the batch it just appended
    (the Sender reads `hasIncomplete()` before it takes the EndTxn queued meanwhile), seen against
    Kafka and topiclake alike when transactions are small and their commits fast (docs/KAFKA.md)."""
    for attempt in (1, 2, 3):
        tid = f"bench-{uuid.uuid4().hex[:8]}" if transactional else "-"
        cmd = java_build.command(TXN_PERF, bootstrap, topic, str(SIZE), str(per_txn), str(seconds), tid)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 10 + 120)
        if done.returncode == 0:
            return dict(json.loads(done.stdout.strip().splitlines()[-1]))
        if attempt < 3 and "InvalidTxnStateException" in done.stderr:
            print(
                f"TxnPerf against {bootstrap}: the client's EndTxn race (InvalidTxnStateException); again", flush=True
            )
            continue
        raise RuntimeError(f"TxnPerf against {bootstrap} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    raise AssertionError("unreachable")


def confluent_producer(bootstrap: str, topic: str, per_txn: int, seconds: float, transactional: bool) -> dict[str, Any]:
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "enable.idempotence": True,
        "queue.buffering.max.messages": 500_000,
    }
    if transactional:
        conf["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    if transactional:
        p.init_transactions(60)
    values = random_values(1000, SIZE)
    commits: list[float] = []
    records = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or (transactional and len(commits) < 3):
        if transactional:
            p.begin_transaction()
        for i in range(per_txn):
            while True:
                try:
                    p.produce(topic, values[i % 1000])
                    break
                except BufferError:
                    p.poll(0.01)
        p.poll(0)
        if transactional:
            t0 = time.perf_counter()
            p.commit_transaction(120)
            commits.append((time.perf_counter() - t0) * 1000)
        records += per_txn
    p.flush(120)
    elapsed = time.perf_counter() - start
    out: dict[str, Any] = {"records": records, "seconds": elapsed, "records_s": records / elapsed}
    if commits:
        out |= {
            "commit_p50_ms": percentile(commits, 50),
            "commit_p99_ms": percentile(commits, 99),
            "commit_mean_ms": sum(commits) / len(commits),
        }
    return out


CLIENTS = {"Java producer": java_producer, "confluent-kafka": confluent_producer}


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far, all its threads (Linux: /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pids: list[int], *, busy: float = 0.1, window_s: float = 0.5, max_s: float = SETTLE_MAX_S) -> float:
    """Write the page cache's dirty data to disk, then wait until the servers `pids` are quiet
    (together under `busy` of a core over `window_s`), at most `max_s`: the seconds waited. A run
    starts on a machine that the previous run's system no longer works on (its landings, roll-ups,
    checkpoints, log deletion), which would otherwise be counted against the next run, the other
    system's; and with the kernel's budget of dirty pages unspent. Spent, it holds every writer to
    the disk's speed: Kafka's plain produce measured 323,527 and 336,658 records/s in the first two
    of five runs in a row, then 66,226-75,662 with 2 GB dirty at each start."""
    start = time.monotonic()
    os.sync()
    synced = time.monotonic()
    while time.monotonic() - synced < max_s:
        before = sum(cpu_seconds(p) for p in pids)
        time.sleep(window_s)
        if sum(cpu_seconds(p) for p in pids) - before < busy * window_s:
            break
    return time.monotonic() - start


def drop_topic(system: str, bootstrap: str, url: str, topic: str) -> None:
    """Delete a run's topic on its system (Kafka: the admin client; topiclake: its HTTP API)."""
    if system == "Kafka":
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the deletion is answered
        for future in admin.delete_topics([topic]).values():
            future.result(60)
    else:
        httpx.delete(f"{url}/topics/{topic}", timeout=60).raise_for_status()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.txn_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--compare", type=Path, help="another checkout whose server runs beside, as 'before'")
    ap.add_argument("--clients", nargs="+", choices=list(CLIENTS), default=list(CLIENTS))
    ap.add_argument("--per-txn", nargs="+", type=int, choices=PER_TXN, default=list(PER_TXN))
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    seconds = args.seconds or (4.0 if args.quick else 8.0)
    work = Path(tempfile.mkdtemp(prefix="topiclake-txn-bench-", dir=os.environ.get("BENCH_TMP")))
    kafka = KafkaBroker(work / "kafka").start()
    servers = {"topiclake": ServerProcess(work / "topiclake" / "data").start()}
    if args.compare is not None:
        servers["before"] = ServerProcess(work / "before" / "data", repo=args.compare.resolve()).start()
    systems = {"Kafka": kafka.bootstrap, **{name: srv.kafka for name, srv in servers.items()}}
    clients = {c: CLIENTS[c] for c in args.clients}
    modes = ("plain", *(f"{n} / txn" for n in args.per_txn))
    pids = [kafka.proc.pid, *(srv.proc.pid for srv in servers.values())]  # type: ignore[union-attr]
    rows: list[dict[str, Any]] = []

    def one_run(client: str, mode: str, system: str, seconds: float) -> tuple[dict[str, Any], float]:
        """One run on a fresh topic (deleted after it), once the machine has settled: its figures,
        and how long the settling took."""
        bootstrap = systems[system]
        topic = f"txn-{uuid.uuid4().hex[:8]}"
        url = servers[system].url if system in servers else ""
        if system == "Kafka":
            kafka.create_topic(topic, partitions=PARTITIONS)
        else:
            httpx.post(f"{url}/topics", json={"name": topic, "partitions": PARTITIONS}, timeout=60).raise_for_status()
        per_txn = 1000 if mode == "plain" else int(mode.split()[0])
        pid = (servers[system].proc if system in servers else kafka.proc).pid  # type: ignore[union-attr]
        waited = settle(pids)
        try:
            cpu = cpu_seconds(pid)
            res = clients[client](bootstrap, topic, per_txn, seconds, mode != "plain")
            res["server_cpu_ms_per_txn"] = (cpu_seconds(pid) - cpu) * 1000 / (res["records"] / per_txn)
        finally:  # gigabytes a run: the disk holds one run's, not all of them
            drop_topic(system, bootstrap, url, topic)
        return res, waited

    try:
        # warm: plain runs until every system's plain rate holds (a Kafka broker's rose from 59,408
        # to 155,617 and 353,020 records/s over its first three rounds), then a short run of each
        # transactional mode; none counted
        last: dict[tuple[str, str], float] = {}
        for warm in range(WARM_ROUNDS):
            rates = {(c, s): one_run(c, "plain", s, seconds)[0]["records_s"] for c in clients for s in systems}
            print(f"warm-up {warm}: " + ", ".join(f"{c} {s} {r:,.0f}" for (c, s), r in rates.items()), flush=True)
            if last and all(abs(r - last[k]) <= WARM_TOLERANCE * last[k] for k, r in rates.items()):
                break
            last = rates
        for client in clients:
            for mode in modes[1:]:
                for system in systems:
                    one_run(client, mode, system, WARM_S)
        for rep in range(repeats):
            for client in clients:
                for mode in modes:
                    for system in systems:  # alternating, run by run
                        res, waited = one_run(client, mode, system, seconds)
                        row = {
                            "client": client,
                            "mode": mode,
                            "system": system,
                            "repeat": rep,
                            "settled_s": waited,
                            **res,
                        }
                        rows.append(row)
                        print(
                            f"#{rep} {client} {mode} {system}: {res['records_s']:,.0f} records/s"
                            + (f", commit p50 {res['commit_p50_ms']:.1f} ms" if "commit_p50_ms" in res else ""),
                            flush=True,
                        )
    finally:
        for srv in servers.values():
            srv.stop()
        kafka.stop()
        shutil.rmtree(work, ignore_errors=True)

    def med(client: str, mode: str, system: str, key: str) -> float:
        values = [r[key] for r in rows if (r["client"], r["mode"], r["system"]) == (client, mode, system) and key in r]
        return statistics.median(values) if values else float("nan")

    table = []
    for client in clients:
        for mode in modes[1:]:
            line: dict[str, Any] = {"client": client, "records a transaction": mode.split()[0]}
            for system in systems:
                plain = med(client, "plain", system, "records_s")
                txn = med(client, mode, system, "records_s")
                line[f"{system} records/s"] = round(txn)
                line[f"{system} commit p50/p99/mean ms"] = " / ".join(
                    f"{med(client, mode, system, f'commit_{q}_ms'):.1f}" for q in ("p50", "p99", "mean")
                )
                line[f"{system} overhead (txn/plain)"] = round(txn / plain, 3)
                line[f"{system} server CPU ms a txn"] = round(med(client, mode, system, "server_cpu_ms_per_txn"), 2)
            for system in servers:
                line[f"overhead ratio ({system}/Kafka)"] = round(
                    line[f"{system} overhead (txn/plain)"] / line["Kafka overhead (txn/plain)"], 3
                )
            table.append(line)
    plain_rows = [
        {
            "client": client,
            **{f"{s} plain records/s": round(med(client, "plain", s, "records_s")) for s in systems},
        }
        for client in clients
    ]
    print_table(plain_rows, list(plain_rows[0]))
    print_table(table, list(table[0]))
    write_results("txn_bench", rows, {"summary": table, "plain": plain_rows, "seconds": seconds, "repeats": repeats})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
