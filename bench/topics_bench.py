"""Many topics on one gateway (issue 13): what each topic costs while it is idle.

One real `topiclake serve` on a local root. Topics (one partition each) are created up to each
step, and every new topic is produced to once (1 JSON record); then the figures at that count:

- threads and RSS of the server process (from /proc);
- topic creation p50 (the new topics of that step);
- produce p50/p99 of one record to a topic first used in that step (cold: its writer opens);
- produce p50/p99 of one record to 200 topics made at the very start, idle since (warm again).

    python -m bench.topics_bench [--steps 10 100 1000 3000 10000] [--compare <checkout>]

`--compare` runs the same steps against another checkout's code first (e.g. a worktree of the
previous main), so before and after come from one run on one machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import percentile, print_table, write_results
from tests.e2e.server import REPO, ServerProcess


def _proc_status(pid: int) -> tuple[int, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) / 1024


def run(steps: list[int], repo: Path, label: str) -> list[dict[str, float | str]]:
    root = Path(tempfile.mkdtemp(prefix="topics-bench-")) / "data"
    srv = ServerProcess(root, repo=repo).start()
    rows: list[dict[str, float | str]] = []
    made = 0
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:

            def produce(topic: str) -> float:
                t = time.perf_counter()
                r = c.post(f"/topics/{topic}/records", json={"records": [{"value": 1}]})
                assert r.status_code == 200, r.text
                return (time.perf_counter() - t) * 1000

            for step in steps:
                creates, cold = [], []
                for i in range(made, step):
                    t = time.perf_counter()
                    r = c.post("/topics", json={"name": f"t{i:05d}", "partitions": 1})
                    assert r.status_code == 201, r.text
                    creates.append((time.perf_counter() - t) * 1000)
                    cold.append(produce(f"t{i:05d}"))
                made = step
                warm = [produce(f"t{i:05d}") for i in range(min(step, 200))]
                assert srv.proc is not None
                threads, rss = _proc_status(srv.proc.pid)
                rows.append(
                    {
                        "code": label,
                        "topics": step,
                        "threads": threads,
                        "rss_mb": rss,
                        "create_p50_ms": percentile(creates, 50),
                        "first_produce_p50_ms": percentile(cold, 50),
                        "first_produce_p99_ms": percentile(cold, 99),
                        "produce_p50_ms": percentile(warm, 50),
                        "produce_p99_ms": percentile(warm, 99),
                    }
                )
                print_table(rows[-1:], list(rows[-1]))
    finally:
        srv.stop()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, nargs="+", default=[10, 100, 1000, 3000, 10000])
    p.add_argument("--compare", type=Path, help="another checkout to measure first (before)")
    args = p.parse_args()
    rows = run(args.steps, args.compare, "before") if args.compare else []
    rows += run(args.steps, REPO, "this")
    print_table(rows, list(rows[0]))
    write_results("topics_bench", rows, {"steps": args.steps, "compare": str(args.compare or "")})


if __name__ == "__main__":
    main()
