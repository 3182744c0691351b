"""A brand-new SparkSession in a process of its own, made as users make one (get_spark, the catalog
on), driven by the test over stdin/stdout: one JSON command a line, one JSON answer a line.

    {"sql": "SELECT ..."}                        -> {"rows": [[...], ...]}
    {"until": "SELECT ...", "expect": [[...]], "timeout": 30}
                                                 -> {"rows": ..., "seconds": s} once the rows match
                                                    (or the last rows at the timeout)
    {"sync": true}                               -> the catalog sync's report of a pass run now
Errors answer {"error": "..."}. Started with the root and settings in the environment.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def _plain(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "replace")
    if hasattr(v, "asDict"):
        return {k: _plain(x) for k, x in v.asDict().items()}
    if isinstance(v, int | float | str | bool) or v is None:
        return v
    return str(v)


def main() -> int:
    from conf import load_settings
    from delta_log.spark import get_spark
    from delta_log.spark.session import catalog_sync

    settings = load_settings()
    started = time.monotonic()
    spark = get_spark(settings, app_name="topiclake-test-worker")
    spark.sparkContext.setLogLevel("ERROR")
    print(json.dumps({"ready": round(time.monotonic() - started, 1)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if "sql" in cmd:
                answer: dict[str, Any] = {"rows": [_plain(list(r)) for r in spark.sql(cmd["sql"]).collect()]}
            elif "until" in cmd:
                t0 = time.monotonic()
                while True:
                    try:
                        rows = [_plain(list(r)) for r in spark.sql(cmd["until"]).collect()]
                    except Exception as exc:  # the table is not there yet
                        rows = [["error", str(exc)[:300]]]
                    if rows == cmd["expect"] or time.monotonic() - t0 > cmd.get("timeout", 30):
                        break
                    time.sleep(0.5)
                answer = {"rows": rows, "seconds": round(time.monotonic() - t0, 1)}
            elif "sync" in cmd:
                sync = catalog_sync(settings)
                answer = {"report": sync.sync().to_dict() if sync is not None else None}
            else:
                answer = {"error": f"unknown command {cmd}"}
        except Exception as exc:
            answer = {"error": str(exc)[:2000]}
        print(json.dumps(answer), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
