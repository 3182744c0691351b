"""A brand-new SparkSession in a process of its own, made as users make one (get_spark, the catalog
on), driven by the test over stdin/stdout: one JSON command a line, one JSON answer a line.

    {"sql": "SELECT ..."}                        -> {"rows": [[...], ...]}
    {"until": "SELECT ...", "expect": [[...]], "timeout": 30}
                                                 -> {"rows": ..., "seconds": s} once the rows match
                                                    (or the last rows at the timeout)
    {"sync": true}                               -> the catalog sync's report of a pass run now
    {"cli": ["catalog", "sync"]}                 -> {"returncode": n, "stdout": "...", "stderr": "..."}
                                                    of `topiclake catalog sync` run in this process
Errors answer {"error": "..."}. Started with the root and settings in the environment; with
`--no-session` it makes no session of its own (for "cli": each run makes and stops its own, as the
command does, and only the first pays for starting the JVM: the JVM outlives a stopped session).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
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
    spark = None
    if "--no-session" not in sys.argv:
        spark = get_spark(settings, app_name="topiclake-test-worker")
        spark.sparkContext.setLogLevel("ERROR")
    print(json.dumps({"ready": round(time.monotonic() - started, 1)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if "cli" in cmd:
                answer: dict[str, Any] = _cli(cmd["cli"])
            elif spark is None:
                answer = {"error": f"no session (--no-session) for {cmd}"}
            elif "sql" in cmd:
                answer = {"rows": [_plain(list(r)) for r in spark.sql(cmd["sql"]).collect()]}
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
    if spark is not None:
        spark.stop()
    return 0


def _cli(argv: list[str]) -> dict[str, Any]:
    """`topiclake <argv>` in this process, as its command line would run it."""
    from topiclake import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    # The command's process would end here, and its session's catalog sync thread with it: this
    # one ends at its next round (the command stopped its session), before the next command runs.
    for thread in threading.enumerate():
        if thread.name.startswith("topiclake-catalog-"):
            thread.join(30)
            if thread.is_alive():
                return {"error": f"{thread.name} outlived its stopped session"}
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    sys.exit(main())
