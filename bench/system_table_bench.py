"""Sustained saves of a system table: does a save cost the same after 40,000 as after 5,000?

    python -m bench.system_table_bench              # 8 windows of 5,000 saves
    python -m bench.system_table_bench --quick      # 4 windows
    python -m bench.system_table_bench --compare <checkout>   # and another checkout's ("before")

One transactional id saved again and again through `_system/transactions`'s store on a local root,
rewritten every 256 saves as the transaction coordinator does (a busy exactly-once producer saves
once or twice a transaction). Each window prints its wall and CPU seconds, how many files the
table's `_delta_log` holds, and the size of its newest checkpoint. Each save takes a version and a
file; without the rewrite's log cleanup and short-lived tombstones (delta_log.table.storage) the
log grows by a file a save and every checkpoint carries all the files ever replaced, so a save
costs more and more. `--compare DIR` runs DIR's code in a second process afterwards.
Results: bench/results/system_table_bench.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table, write_results

WINDOW = 5000
REPO = Path(__file__).resolve().parents[1]


def run_windows(windows: int) -> list[dict[str, Any]]:
    """In this process (this checkout's code): one row a window."""
    from delta_log.core import transactions as rules
    from delta_log.system.transactions import TABLE, TransactionStore
    from delta_log.table.storage import StorageRoot

    storage = StorageRoot(tempfile.mkdtemp(prefix="topiclake-system-table-bench-", dir=os.environ.get("BENCH_TMP")))
    store = TransactionStore(storage)
    epoch = store.claim("app")
    log_dir = os.path.join(storage.fs_path(storage.system_uri(TABLE)), "_delta_log")
    rows, saves = [], 0
    for _ in range(windows):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(WINDOW):
            saves += 1
            txn = rules.Txn(transactional_id="app", producer_id=1, producer_epoch=saves % 30_000, timeout_ms=60_000)
            store.save(txn, epoch)
            if saves % 256 == 0:
                store.compact(min_rows=256)
        checkpoints = sorted(glob.glob(os.path.join(log_dir, "*.checkpoint.parquet")))
        rows.append(
            {
                "saves": saves,
                "wall_s": round(time.perf_counter() - wall, 2),
                "cpu_ms_a_save": round((time.process_time() - cpu) * 1000 / WINDOW, 3),
                "log_files": len(os.listdir(log_dir)),
                "checkpoint_kb": os.path.getsize(checkpoints[-1]) // 1024 if checkpoints else 0,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.system_table_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--windows", type=int)
    ap.add_argument("--compare", type=Path, help="another checkout, run afterwards as 'before'")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    windows = args.windows or (4 if args.quick else 8)
    if args.child:
        run_windows(windows)
        return 0
    rows = [{"code": "this checkout", **r} for r in run_windows(windows)]
    if args.compare is not None:
        checkout = args.compare.resolve()
        done = subprocess.run(
            [sys.executable, "-m", "bench.system_table_bench", "--child", "--windows", str(windows)],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": str(checkout)},
            capture_output=True,
            text=True,
        )
        # (its exit status is not looked at: a checkpoint thread of delta-rs still running when the
        # interpreter exits can take the process down after its figures are printed)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if len(lines) < windows:
            raise RuntimeError(f"{checkout} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        rows += [{"code": "before", **json.loads(line)} for line in lines]
    print_table(rows, list(rows[0]))
    write_results("system_table_bench", rows, {"window": WINDOW})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
