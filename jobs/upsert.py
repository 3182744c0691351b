"""Upsert job: keeps `<topic>_latest` (one row per key, its latest value) for every topic with
`topiclake.table.mode = upsert`, by MERGE in offset order, exactly once across restarts
(delta_log.maintenance.upsert says how).

    python -m jobs.upsert [--root DIR] [--topic T ...] [--local]
    topiclake jobs upsert

The scheduler runs it every `jobs.upsert_interval_s`. A run merges what each topic gained since the
last one, up to `jobs.upsert_max_records` per MERGE, until it has caught up or made 100 MERGEs of a
topic (so one topic's backlog cannot hold up the others; the next run goes on, and its lag shows). A topic with a JSON
Schema or Avro value schema gets the value's fields as typed columns (the typed views' types).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from conf import Settings
from delta_log.core.value_schemas import AVRO, JSON, subject_for
from delta_log.log.catalog import Catalog
from delta_log.maintenance.upsert import UpsertReport, ValueParse, upsert_topic
from delta_log.spark.typed import parser_for
from delta_log.system.offsets import OffsetStore
from delta_log.system.schemas import SchemaStore
from delta_log.table.storage import StorageRoot
from jobs.common import Progress, for_each_topic, job_settings, job_spark

__all__ = ["UpsertJobReport", "main", "run", "upsert_topics"]


@dataclass(frozen=True, slots=True, kw_only=True)
class UpsertJobReport:
    topics: list[dict[str, Any]]


def _parser(storage: StorageRoot, topic: str) -> ValueParse | None:
    store = SchemaStore.open_if_exists(storage)
    schemas = store.state(max_age_s=0).subject_schemas(subject_for(topic)) if store is not None else None
    if schemas is None or schemas.latest.schema_type not in (JSON, AVRO):
        return None
    return parser_for(schemas).column


def _one(root: str, storage_options: dict[str, str], topic: str, settings_json: str) -> dict[str, Any]:
    settings = Settings.model_validate_json(settings_json)
    storage = StorageRoot(root, storage_options)
    total = UpsertReport(topic)
    rounds = 0
    try:
        parse, offsets = _parser(storage, topic), OffsetStore(storage)
    except Exception as exc:  # one topic's trouble must not stop the others
        return total.to_dict() | {"merges": 0, "error": f"{type(exc).__name__}: {exc}"[:500]}
    while True:  # until caught up: each MERGE takes at most upsert_max_records
        try:
            report = upsert_topic(
                storage, topic, parse=parse, max_records=settings.jobs.upsert_max_records, offsets=offsets
            )
        except Exception as exc:  # deleted meanwhile, a schema the table cannot take: reported, next run
            return total.to_dict() | {"merges": rounds, "error": f"{type(exc).__name__}: {exc}"[:500]}
        rounds += 1
        for k in ("merged", "upserted_keys", "deleted", "without_key", "skipped_by_retention"):
            setattr(total, k, getattr(total, k) + getattr(report, k))
        total.lag, total.conflict = report.lag, report.conflict
        if report.conflict or report.merged < settings.jobs.upsert_max_records or rounds >= 100:
            break
    return total.to_dict() | {"merges": rounds}


def upsert_topics(settings: Settings) -> list[str]:
    """The topics in upsert mode."""
    catalog = Catalog(StorageRoot(settings.root, settings.storage_options), settings.writer)
    out = []
    for t in catalog.list_topics():
        try:
            if catalog.describe_topic(t).config.table_mode == "upsert":
                out.append(t)
        except Exception:  # deleted meanwhile
            continue
    return out


def run(spark: Any, settings: Settings, *, topics: list[str] | None = None) -> UpsertJobReport:
    """Merge the new records of `topics` (default: every upsert topic). `spark` None: in this process."""
    progress = Progress("upsert", spark)
    results = for_each_topic(spark, settings, topics if topics is not None else upsert_topics(settings), _one, progress)
    for r in results:
        progress.say(
            f"{r['topic']}: {r['merged']} records merged into {r['upserted_keys']} keys, lag {r['lag']}"
            + (f" CONFLICT: {r['conflict']}" if r["conflict"] else "")
            + (f" ERROR: {r['error']}" if r.get("error") else "")
        )
    return UpsertJobReport(topics=results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jobs.upsert", description=__doc__)
    ap.add_argument("--root")
    ap.add_argument("--topic", action="append")
    ap.add_argument("--local", action="store_true", help="run in this process, without Spark")
    args = ap.parse_args(argv)
    settings = job_settings(args.root)
    with job_spark(settings, "topiclake-upsert", local=args.local) as spark:
        report = run(spark, settings, topics=args.topic)
    print(json.dumps({"topics": report.topics}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
