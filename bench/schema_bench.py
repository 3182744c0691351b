"""Typed topics benchmark (issue 16): what checking values against a topic's schema costs a producer.
One gateway, three topics fed the same orders by topiclake's Producer (Arrow requests, 1,000
records each), alternating, medians over repeats: no schema (JSON values), a JSON Schema (JSON
values), an Avro schema (values framed by id, as Confluent's AvroSerializer writes them). Also the
checker alone, per value, in this process.

    python -m bench.schema_bench [--records 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

import fastavro
import httpx

from bench.common import median, print_table, write_results
from delta_log.core.value_schemas import SubjectSchemas, parse_schema
from tests.e2e.server import ServerProcess
from topiclake import Producer

ORDER_JSON = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "country": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["id", "country", "amount"],
}
ORDER_AVRO = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "country", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}


def orders(n: int) -> list[dict]:
    return [{"id": i, "country": "DE", "amount": i * 0.5} for i in range(n)]


def avro_values(n: int, schema_id: int) -> list[bytes]:
    parsed = fastavro.parse_schema(ORDER_AVRO)
    out = []
    for order in orders(n):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, order)
        out.append(b"\0" + schema_id.to_bytes(4, "big") + buf.getvalue())
    return out


def produce(url: str, topic: str, values: list, value_format: str) -> float:
    """Records/s of one Producer sending `values` to `topic` and waiting for every ack."""
    start = time.perf_counter()
    with Producer(url, linger_ms=5, batch_size=1000, value_format=value_format) as p:
        futures = [p.send(topic, v) for v in values]
        for f in futures:
            f.result(timeout=120)
    return len(values) / (time.perf_counter() - start)


def checker_rates(n: int) -> list[dict]:
    rows = []
    json_values = [json.dumps(o).encode() for o in orders(n)]
    for name, schema, values in (
        ("JSON Schema", parse_schema("JSON", json.dumps(ORDER_JSON)), json_values),
        ("Avro", parse_schema("AVRO", json.dumps(ORDER_AVRO)), avro_values(n, 1)),
    ):
        checker = SubjectSchemas("s-value", 1, {1: schema})
        start = time.perf_counter()
        assert not checker.invalid(values)
        secs = time.perf_counter() - start
        rows.append({"checker": name, "values/s": n / secs, "us/value": secs / n * 1e6})
    start = time.perf_counter()
    for v in json_values:
        json.loads(v)
    rows.append({"checker": "json.loads alone", "values/s": n / (time.perf_counter() - start)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="schema-bench-"))
    srv = ServerProcess(tmp / "data").start()
    try:
        http = httpx.Client(base_url=srv.url, timeout=60)
        for topic in ("plain", "typed-json", "typed-avro"):
            http.post("/topics", json={"name": topic, "partitions": 4}).raise_for_status()
        http.post(
            "/registry/subjects/typed-json-value/versions",
            json={"schemaType": "JSON", "schema": json.dumps(ORDER_JSON)},
        ).raise_for_status()
        avro_id = http.post(
            "/registry/subjects/typed-avro-value/versions", json={"schema": json.dumps(ORDER_AVRO)}
        ).json()["id"]
        cases = [
            ("no schema (JSON values)", "plain", orders(args.records), "json"),
            ("JSON Schema (JSON values)", "typed-json", orders(args.records), "json"),
            ("Avro (framed values)", "typed-avro", avro_values(args.records, avro_id), "binary"),
        ]
        rates: dict[str, list[float]] = {name: [] for name, *_ in cases}
        for _ in range(args.repeats):
            for name, topic, values, fmt in cases:
                rates[name].append(produce(srv.url, topic, values, fmt))
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    base = median(rates[cases[0][0]])
    rows = [{"topic": name, "records/s": median(r), "vs no schema": median(r) / base} for name, r in rates.items()]
    print(f"Producer -> one gateway, {args.records:,} records of ~50 B per run, medians of {args.repeats}")
    print_table(rows, ["topic", "records/s", "vs no schema"])
    checks = checker_rates(min(args.records, 50_000))
    print("\nThe checker alone, one thread")
    print_table(checks, ["checker", "values/s", "us/value"])
    write_results("schema_bench", rows + checks, {"records": args.records, "repeats": args.repeats})


if __name__ == "__main__":
    main()
