"""The `topiclake` command: serve, topics, produce."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from topiclake.client import DEFAULT_URL, AdminClient, TopiclakeClientError


def _url(args: argparse.Namespace) -> str:
    return args.url or os.environ.get("TOPICLAKE_URL", DEFAULT_URL)


def _api_key(args: argparse.Namespace) -> str | None:
    return args.api_key or os.environ.get("TOPICLAKE_API_KEY")


def _tls(args: argparse.Namespace) -> dict[str, Any]:
    """The client TLS options: --ca-file ($TOPICLAKE_CA_FILE), --client-cert/--client-key."""
    cert = (args.client_cert, args.client_key or args.client_cert) if args.client_cert else None
    return {"ca_file": args.ca_file or os.environ.get("TOPICLAKE_CA_FILE"), "client_cert": cert}


def _http(args: argparse.Namespace, timeout: float) -> Any:
    from topiclake.client import http_client

    return http_client(_url(args), api_key=_api_key(args), timeout=timeout, **_tls(args))


def cmd_serve(args: argparse.Namespace) -> int:
    import logging.config

    from conf import load_settings
    from conf.settings import LOGGING_JSON
    from ingest_gateway import server as http_server
    from topiclake import gateway

    overrides: dict[str, Any] = {}
    if args.root:
        overrides["root"] = args.root
    settings = load_settings(**overrides)
    tls = {
        k: v
        for k, v in {
            "ssl_certfile": args.ssl_certfile,
            "ssl_keyfile": args.ssl_keyfile,
            "ssl_ca_certs": args.ssl_ca_certs,
            "ssl_client_auth": args.ssl_client_auth,
        }.items()
        if v
    }
    if tls:
        settings = settings.model_copy(update={"server": settings.server.model_copy(update=tls)})
    kafka: dict[str, Any] = {}
    if args.kafka_port is not None:
        kafka["port"] = args.kafka_port
    if args.no_kafka:
        kafka["enabled"] = False
    if kafka:
        settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(update=kafka)})
    server = settings.server
    host = args.host or server.host
    port = args.port if args.port is not None else server.port
    if args.workers > 1:
        return _supervise(args, settings.root, host, port)
    sockets = None
    advertise_port = port
    if args.worker:  # one of `--workers N`: the shared port beside its siblings, and its own
        sockets = list(http_server.worker_sockets(host, port))
        advertise_port = sockets[1].getsockname()[1]
        settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(update={"shared_port": True})})
    if not settings.cluster.advertise_url or args.worker:  # where the other gateways forward to
        reachable = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        scheme = "https" if server.ssl_certfile else "http"
        advertise = f"{scheme}://{f'[{reachable}]' if ':' in reachable else reachable}:{advertise_port}"
        settings = settings.model_copy(
            update={"cluster": settings.cluster.model_copy(update={"advertise_url": advertise})}
        )
    # The group-commit thread releases the GIL in every Delta and parquet call; a short switch
    # interval lets it back in quickly while the event loop is busy (5 ms by default).
    sys.setswitchinterval(0.0005)
    log_config = json.loads(LOGGING_JSON.read_text())
    logging.config.dictConfig(log_config)
    kafka_on = f" and Kafka on {settings.kafka.host or host}:{settings.kafka.port}" if settings.kafka.enabled else ""
    print(
        f"topiclake serving {settings.root} on http{'s' if server.ssl_certfile else ''}://{host}:{port}{kafka_on}",
        flush=True,
    )
    gateway.serve(
        settings,
        host=host,
        port=port,
        log_config=log_config,
        sockets=sockets,
        jobs=not args.no_jobs and not args.worker,
    )
    return 0


def _parse_config(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--config expects key=value, got {pair!r}")
        out[key] = value
    return out


def _read_schema(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"--value-schema: cannot read {path}: {exc}") from exc


def cmd_topics(args: argparse.Namespace) -> int:
    with AdminClient(_url(args), api_key=_api_key(args), **_tls(args)) as admin:
        if args.action == "create":
            print(
                json.dumps(
                    admin.create_topic(
                        args.name,
                        partitions=args.partitions,
                        config=_parse_config(args.config),
                        value_schema=_read_schema(args.value_schema),
                        schema_type=args.schema_type,
                    ),
                    indent=2,
                )
            )
        elif args.action == "list":
            for name in admin.list_topics():
                print(name)
        elif args.action == "describe":
            print(json.dumps(admin.describe_topic(args.name), indent=2))
        elif args.action == "alter":
            if args.partitions:
                admin.add_partitions(args.name, args.partitions)
            cfg: dict[str, Any] = dict(_parse_config(args.config))
            cfg.update({k: None for k in args.reset})
            if cfg:
                admin.alter_config(args.name, cfg)
            print(json.dumps(admin.describe_topic(args.name), indent=2))
        elif args.action == "delete":
            admin.delete_topic(args.name)
            print(f"deleted {args.name}")
    return 0


def _lines(paths: list[str]) -> Iterator[str]:
    if not paths or paths == ["-"]:
        yield from sys.stdin
        return
    for path in paths:
        with open(path, encoding="utf-8") as f:
            yield from f


def _progress(done: int, total_bytes: int, read_bytes: int, start: float) -> None:
    import time

    elapsed = max(time.monotonic() - start, 1e-9)
    if total_bytes:
        frac = min(read_bytes / total_bytes, 1.0)
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r[{bar:<30}] {frac:6.1%} {done:,} records {done / elapsed:,.0f}/s")
    else:
        sys.stderr.write(f"\r{done:,} records {done / elapsed:,.0f}/s")
    sys.stderr.flush()


def cmd_produce(args: argparse.Namespace) -> int:
    import time

    from topiclake.client import raise_for_error

    total = sum(os.path.getsize(p) for p in args.files if p != "-") if args.files else 0
    show = args.progress or (args.progress is None and total > 10 * 1024 * 1024)
    headers = {"Content-Type": "application/x-ndjson"}
    params = {"value_format": args.value_format, "key_format": args.key_format}
    done, read, start = 0, 0, time.monotonic()
    with _http(args, 60) as http:

        def send(batch: list[str]) -> None:
            nonlocal done
            for attempt in range(6):
                resp = http.post(
                    f"/topics/{args.topic}/records",
                    params=params,
                    headers=headers,
                    content="".join(batch).encode(),
                )
                if resp.status_code not in (429, 503) or attempt == 5:
                    break
                time.sleep(float(resp.headers.get("Retry-After", "1")))
            raise_for_error(resp)
            done += len(batch)

        batch: list[str] = []
        for line in _records(_lines(args.files), args):
            read += len(line)
            batch.append(line)
            if len(batch) >= args.batch_size:
                send(batch)
                batch = []
                if show:
                    _progress(done, total, read, start)
        if batch:
            send(batch)
    if show:
        _progress(done, total, read, start)
        sys.stderr.write("\n")
    print(f"produced {done} records to {args.topic}", file=sys.stderr)
    return 0


def _records(lines: Iterable[str], args: argparse.Namespace) -> Iterator[str]:
    """Each input line becomes one NDJSON record: raw lines as string values, or --json objects."""
    for raw in lines:
        line = raw.rstrip("\n")
        if not line:
            continue
        if args.line_format == "record":
            yield line + "\n"
            continue
        key = None
        if args.key_separator and args.key_separator in line:
            key, line = line.split(args.key_separator, 1)
        value: Any = json.loads(line) if args.value_format == "json" else line
        yield json.dumps({"key": key, "value": value}) + "\n"


def cmd_consume(args: argparse.Namespace) -> int:
    """Print records (one line each) or write them to a file; Ctrl-C or --max-records stops."""
    import base64
    import time

    from topiclake.consumer import Consumer

    consumer = Consumer(
        _url(args),
        group_id=args.group,
        api_key=_api_key(args),
        **_tls(args),
        auto_offset_reset="earliest" if args.from_beginning else "latest",
    )
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    seen = 0
    idle_deadline = time.monotonic() + args.idle_timeout if args.idle_timeout else None
    try:
        if args.group:
            consumer.subscribe([args.topic])
        else:
            partitions = [
                p["partition"]
                for p in AdminClient(_url(args), api_key=_api_key(args), **_tls(args)).describe_topic(args.topic)[
                    "partition_offsets"
                ]
            ]
            consumer.assign([(args.topic, p) for p in partitions])
            if args.from_beginning:
                consumer.seek_to_beginning()
        while args.max_records is None or seen < args.max_records:
            records = consumer.poll(1.0)
            if records and idle_deadline is not None:
                idle_deadline = time.monotonic() + args.idle_timeout
            for i, r in enumerate(records):
                if args.max_records is not None and seen >= args.max_records:
                    # Commit only what was output: rewind each partition to its first record not shown.
                    rewound: set[int] = set()
                    for rest in records[i:]:
                        if rest.partition not in rewound:
                            consumer.seek((rest.topic, rest.partition), rest.offset)
                            rewound.add(rest.partition)
                    break
                if args.format == "json":
                    out.write(
                        json.dumps(
                            {
                                "partition": r.partition,
                                "offset": r.offset,
                                "timestamp": r.timestamp_ms,
                                "key": r.key.decode("utf-8", "replace") if r.key is not None else None,
                                "value": base64.b64encode(r.value).decode()
                                if r.value is not None and args.binary
                                else (r.value.decode("utf-8", "replace") if r.value is not None else None),
                            }
                        )
                        + "\n"
                    )
                else:
                    value = r.value.decode("utf-8", "replace") if r.value is not None else ""
                    out.write(
                        (f"{r.key.decode('utf-8', 'replace')}{args.key_separator}" if args.print_key and r.key else "")
                        + value
                        + "\n"
                    )
                seen += 1
            out.flush()
            if idle_deadline is not None and time.monotonic() > idle_deadline:
                break
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
        if args.output:
            out.close()
    print(f"consumed {seen} records", file=sys.stderr)
    return 0


def cmd_groups(args: argparse.Namespace) -> int:

    from topiclake.client import raise_for_error

    with _http(args, 30) as http:
        if args.action == "list":
            resp = http.get("/groups")
            raise_for_error(resp)
            for g in resp.json()["groups"]:
                print(f"{g['group']}\t{g['state']}\tmembers={g['members']}\tgeneration={g['generation']}")
        elif args.action == "describe":
            resp = http.get(f"/groups/{args.group}")
            raise_for_error(resp)
            d = resp.json()
            print(f"group {d['group']}  state {d['state']}  generation {d['generation']}  assignor {d['assignor']}")
            for m in d["members"]:
                print(f"  member {m['member_id']}  {m['assignment']}")
            print("  TOPIC  PARTITION  COMMITTED  HIGH-WATERMARK  LAG")
            for lag in d["lag"]:
                print(
                    f"  {lag['topic']}  {lag['partition']}  {lag['committed_offset']}  "
                    f"{lag['high_watermark']}  {lag['lag']}"
                )
        elif args.action == "reset":
            body: dict[str, Any] = {"topic": args.topic, "to": args.to}
            if args.to == "timestamp":
                body["timestamp"] = args.value
            if args.to == "offset":
                body["offset"] = args.value
            resp = http.post(f"/groups/{args.group}/offsets/reset", json=body)
            raise_for_error(resp)
            for o in resp.json()["offsets"]:
                print(f"{o['topic']}-{o['partition']} -> {o['offset']}")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    """Run SQL over topics in a local Spark session (topics registered as topics.<name>)."""
    from conf import load_settings
    from delta_log.spark import get_spark, register_topics
    from delta_log.spark.session import catalog_sync

    settings = load_settings(**({"root": args.root} if args.root else {}))
    spark = get_spark(settings, app_name="topiclake-sql")
    try:
        sync = catalog_sync(settings)  # the catalog keeps them; else register them in this session
        tables = (
            sync.tables()
            if sync is not None
            else register_topics(spark, settings.root, storage_options=settings.storage_options)
        )
        if not args.query:
            for topic, table in tables.items():
                print(f"topics.{table}\t<- topic {topic}")
            for view in spark.sql("SHOW VIEWS IN topics_typed").collect():
                if not view.isTemporary:
                    print(f"topics_typed.{view.viewName}\t<- its value's fields as columns")
            print("topics._partitions\ntopics._consumer_lag")
            return 0
        spark.sql(args.query).show(args.limit, truncate=False)
    finally:
        spark.stop()
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    """`catalog sync`: make the Hive metastore match the root now and print the drift it fixed."""
    from conf import load_settings
    from delta_log.spark import get_spark
    from delta_log.spark.session import catalog_sync

    settings = load_settings(**({"root": args.root} if args.root else {}))
    if not settings.catalog.enabled:
        print("the catalog is off (catalog.enabled = false): nothing to sync", file=sys.stderr)
        return 2
    spark = get_spark(settings, app_name="topiclake-catalog")
    try:
        sync = catalog_sync(settings)
        assert sync is not None and sync.first_report is not None  # get_spark started it
        report = sync.first_report.merge(sync.sync(verify=True))
        print(json.dumps(report.to_dict(), indent=2))
    finally:
        spark.stop()
    return 0


def cmd_sql_server(args: argparse.Namespace) -> int:
    """Spark's Thrift JDBC/ODBC server on the root's catalog, until Ctrl-C (sql_endpoint)."""
    from conf import load_settings
    from sql_endpoint.server import serve

    settings = load_settings(**({"root": args.root} if args.root else {}))
    return serve(settings, args.host, args.port)


def cmd_jobs(args: argparse.Namespace) -> int:
    from jobs import compaction, rebalance, replication, retention, upsert

    argv = ["--root", args.root] if args.root else []
    for t in getattr(args, "topic", None) or []:
        argv += ["--topic", t]
    for g in getattr(args, "group", None) or []:
        argv += ["--group", g]
    if getattr(args, "replica", None):
        argv += ["--replica", args.replica]
    if args.local:
        argv.append("--local")
    mains = {
        "retention": retention.main,
        "compaction": compaction.main,
        "rebalance": rebalance.main,
        "replication": replication.main,
        "upsert": upsert.main,
    }
    return mains[args.job](argv)


def cmd_replica(args: argparse.Namespace) -> int:
    from delta_log.errors import TopiclakeError
    from jobs import replication

    try:
        return replication.promote_main(["--root", args.root])
    except TopiclakeError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 1


def _supervise(args: argparse.Namespace, root: str, host: str, port: int) -> int:
    """`serve --workers N`: N gateway processes on one host behind one port, each a member of the
    root's cluster exactly as a gateway on another host is. Workers are spawned (a fresh
    interpreter, never a fork of one that loaded deltalake); one that dies is started again; the
    maintenance jobs run once, beside the supervisor."""
    import signal
    import time

    argv = [sys.executable, "-m", "topiclake"]
    for flag in ("url", "api_key"):
        if getattr(args, flag, None):
            argv += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    argv += ["serve", "--worker", "--host", host, "--port", str(port), "--root", root, "--no-jobs"]
    for flag in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs", "ssl_client_auth", "kafka_port"):
        if getattr(args, flag, None) is not None:
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.no_kafka:
        argv.append("--no-kafka")
    workers = [subprocess.Popen(argv) for _ in range(args.workers)]
    print(f"topiclake: {args.workers} workers on {host}:{port} (pids {[w.pid for w in workers]})", flush=True)
    scheduler = None
    if not args.no_jobs:
        from conf import load_settings

        if load_settings(root=root).jobs.schedule:
            scheduler = subprocess.Popen(
                [sys.executable, "-m", "jobs.scheduler", "--root", root, "--parent-pid", str(os.getpid())]
            )
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping:
            for i, w in enumerate(workers):
                if w.poll() is not None and not stopping:
                    print(f"topiclake: worker {w.pid} exited ({w.returncode}); starting another", flush=True)
                    workers[i] = subprocess.Popen(argv)
            time.sleep(0.5)
    finally:
        for p in [*workers, *([scheduler] if scheduler else [])]:
            if p.poll() is None:
                p.terminate()
        for p in [*workers, *([scheduler] if scheduler else [])]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    """The gateways on the root: id, URL, heartbeat age, the groups each coordinates; with
    --topic, the partitions of that topic each one owns (appends to)."""
    from topiclake.client import raise_for_error

    with _http(args, 30) as http:
        resp = http.get("/cluster", params={"topic": args.topic} if args.topic else None)
        raise_for_error(resp)
        view = resp.json()
    if args.format == "json":
        print(json.dumps(view, indent=2))
        return 0
    owned: dict[str, list[str]] = {}
    for row in view.get("partitions", []):
        owned.setdefault(row["owner"], []).append(str(row["partition"]))
    print("GATEWAY\tURL\tHEARTBEAT-AGE-MS\tLIVE\tGROUPS" + (f"\tPARTITIONS OF {args.topic}" if args.topic else ""))
    for gw in view["gateways"]:
        mark = " (this)" if gw["gateway_id"] == view["self"] else ""
        line = (
            f"{gw['gateway_id']}{mark}\t{gw['url']}\t{gw['heartbeat_age_ms']}\t{gw['live']}\t{','.join(gw['groups'])}"
        )
        print(line + (f"\t{','.join(owned.get(gw['gateway_id'], []))}" if args.topic else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="topiclake", description="A Kafka-like log whose topics are Delta tables.")
    p.add_argument("--url", help=f"server URL (default $TOPICLAKE_URL or {DEFAULT_URL})")
    p.add_argument("--api-key", help="API key (default $TOPICLAKE_API_KEY)")
    p.add_argument("--ca-file", help="https: CA certificates to trust (default $TOPICLAKE_CA_FILE, else the system's)")
    p.add_argument("--client-cert", help="https: client certificate (PEM) for servers that verify clients")
    p.add_argument("--client-key", help="https: the client certificate's key (default: in --client-cert)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the server (produce, topics, consume)")
    s.add_argument("--host", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (default 8080)")
    s.add_argument("--root", help="storage root (default $TOPICLAKE_ROOT or ./data)")
    s.add_argument("--ssl-certfile")
    s.add_argument("--ssl-keyfile")
    s.add_argument("--ssl-ca-certs", help="CA bundle: verify client certificates (mutual TLS)")
    s.add_argument("--ssl-client-auth", choices=["none", "optional", "required"], help="with --ssl-ca-certs")
    s.add_argument("--no-jobs", action="store_true", help="do not start the maintenance-job scheduler process")
    s.add_argument("--kafka-port", type=int, help="Kafka protocol port (default 9092; 0: any free port)")
    s.add_argument("--no-kafka", action="store_true", help="do not serve Kafka's protocol (HTTP only)")
    s.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway processes on this host behind one port (default 1; see OPERATIONS.md)",
    )
    s.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # set by --workers for each child
    s.set_defaults(func=cmd_serve)

    cl = sub.add_parser("cluster", help="the gateways serving this root and what each coordinates")
    cl.add_argument("--format", choices=["table", "json"], default="table")
    cl.add_argument("--topic", help="also show which gateway owns each partition of this topic")
    cl.set_defaults(func=cmd_cluster)

    t = sub.add_parser("topics", help="manage topics")
    tsub = t.add_subparsers(dest="action", required=True)
    c = tsub.add_parser("create")
    c.add_argument("name")
    c.add_argument("--partitions", type=int, default=1)
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument(
        "--value-schema", metavar="FILE", help="a value schema (.avsc, or JSON Schema) registered with the topic"
    )
    c.add_argument("--schema-type", choices=["AVRO", "JSON"], default="AVRO", help="of --value-schema (default AVRO)")
    tsub.add_parser("list")
    d = tsub.add_parser("describe")
    d.add_argument("name")
    a = tsub.add_parser("alter")
    a.add_argument("name")
    a.add_argument("--partitions", type=int, help="new total partition count")
    a.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--reset", action="append", default=[], metavar="KEY")
    x = tsub.add_parser("delete")
    x.add_argument("name")
    t.set_defaults(func=cmd_topics)

    pr = sub.add_parser("produce", help="produce lines from stdin or files")
    pr.add_argument("topic")
    pr.add_argument("files", nargs="*", help="input files (default stdin)")
    pr.add_argument(
        "--line-format",
        choices=["value", "record"],
        default="value",
        help="value: each line is a value; record: each line is an NDJSON record object",
    )
    pr.add_argument("--value-format", choices=["string", "json", "binary"], default="string")
    pr.add_argument("--key-format", choices=["string", "json", "binary"], default="string")
    pr.add_argument("--key-separator", help="split each line into key and value at this string")
    pr.add_argument("--batch-size", type=int, default=5000)
    pr.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: on for inputs over 10 MB)",
    )
    pr.set_defaults(func=cmd_produce)

    co = sub.add_parser("consume", help="print or save records")
    co.add_argument("topic")
    co.add_argument("--group", help="consume as a member of this group (commits offsets)")
    co.add_argument("--from-beginning", action="store_true", help="without committed offsets, start at the earliest")
    co.add_argument("--max-records", type=int)
    co.add_argument("--idle-timeout", type=float, help="stop after this many seconds without records")
    co.add_argument("--output", help="write to this file instead of stdout")
    co.add_argument("--format", choices=["value", "json"], default="value")
    co.add_argument("--binary", action="store_true", help="with --format json: values as base64")
    co.add_argument("--print-key", action="store_true")
    co.add_argument("--key-separator", default="\t")
    co.set_defaults(func=cmd_consume)

    g = sub.add_parser("groups", help="consumer groups")
    gsub = g.add_subparsers(dest="action", required=True)
    gsub.add_parser("list")
    gd = gsub.add_parser("describe")
    gd.add_argument("group")
    gr = gsub.add_parser("reset", help="move an empty group's committed offsets")
    gr.add_argument("group")
    gr.add_argument("topic")
    gr.add_argument("--to", choices=["earliest", "latest", "timestamp", "offset"], required=True)
    gr.add_argument("--value", type=int, help="epoch ms for --to timestamp, the offset for --to offset")
    g.set_defaults(func=cmd_groups)

    q = sub.add_parser("sql", help="SQL over topics in a local Spark session (no query: list the tables)")
    q.add_argument("query", nargs="?")
    q.add_argument("--root", help="storage root (default $TOPICLAKE_ROOT or ./data)")
    q.add_argument("--limit", type=int, default=20)
    q.set_defaults(func=cmd_sql)

    ss = sub.add_parser("sql-server", help="a JDBC/ODBC SQL endpoint (Spark's Thrift server) on the catalog")
    ss.add_argument("--root", help="the root (default: the settings' root)")
    ss.add_argument("--host", help="listen address (default: sql_server.host, 127.0.0.1)")
    ss.add_argument("--port", type=int, help="port (default: sql_server.port, 10000)")
    ss.set_defaults(func=cmd_sql_server)

    ca = sub.add_parser("catalog", help="the topics in Spark's Hive metastore")
    casub = ca.add_subparsers(dest="action", required=True)
    cs = casub.add_parser("sync", help="make the catalog match the root now and print the drift it fixed")
    cs.add_argument("--root", help="the root (default: the settings' root)")
    cs.set_defaults(func=cmd_catalog)

    j = sub.add_parser("jobs", help="maintenance jobs (Spark)")
    jsub = j.add_subparsers(dest="job", required=True)
    jr = jsub.add_parser("retention", help="drop segments past retention.ms / retention.bytes")
    jr.add_argument("--root")
    jr.add_argument("--topic", action="append")
    jr.add_argument("--local", action="store_true", help="without Spark")
    jc = jsub.add_parser("compaction", help="merge adjacent segments; key compaction on compacted topics")
    jc.add_argument("--root")
    jc.add_argument("--topic", action="append")
    jc.add_argument("--local", action="store_true", help="without Spark")
    jb = jsub.add_parser("rebalance", help="expire dead group members; balance lag across members")
    jb.add_argument("--root")
    jb.add_argument("--group", action="append")
    jb.add_argument("--local", action="store_true", help="without Spark")
    jp = jsub.add_parser("replication", help="mirror topics, configs and group offsets to a replica root")
    jp.add_argument("--root")
    jp.add_argument("--replica", help="replica root (default jobs.replica_root)")
    jp.add_argument("--topic", action="append")
    jp.add_argument("--local", action="store_true", help="without Spark")
    ju = jsub.add_parser("upsert", help="merge upsert topics' new records into <topic>_latest (latest value per key)")
    ju.add_argument("--root")
    ju.add_argument("--topic", action="append")
    ju.add_argument("--local", action="store_true", help="without Spark")
    j.set_defaults(func=cmd_jobs)

    r = sub.add_parser("replica", help="replica roots")
    rsub = r.add_subparsers(dest="action", required=True)
    rp = rsub.add_parser("promote", help="make a replica the primary after losing the original")
    rp.add_argument("--root", required=True, help="the replica root")
    r.set_defaults(func=cmd_replica)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except TopiclakeClientError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
