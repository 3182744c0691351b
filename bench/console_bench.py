"""The console with many topics and groups: API pages and page loads in a real headless Chromium.

    python -m bench.console_bench              # 10,000 topics, 1,000 groups
    python -m bench.console_bench --quick      # 2,000 topics, 200 groups

Creates the topics (one Delta table each, in this process, before the server starts) and the groups
(their committed offsets, one Delta commit) under a fresh root, starts `topiclake serve` on it,
then times, each 5 times (median and max):
- the API calls the console's list pages make: `GET /topics?limit=50` (first page, a page deep in
  the list, a search) and `GET /groups?limit=50`;
- the Topics and Consumer groups pages in Debian's chromium (Selenium), from navigation to drawn,
  which includes describing the page's 50 topics and reading their throughput.
Results: bench/results/console_bench.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import print_table, write_results
from conf import load_settings
from delta_log import Catalog, StorageRoot
from delta_log.system.offsets import OffsetCommit, OffsetStore
from tests.e2e.server import ServerProcess

REPEATS = 5


def populate(root: Path, topics: int, groups: int) -> float:
    settings = load_settings(root=str(root))
    storage = StorageRoot(settings.root)
    catalog = Catalog(storage, settings.writer)
    started = time.perf_counter()
    for i in range(topics):
        catalog.create_topic(f"topic-{i:05d}")
    store = OffsetStore(storage)
    store.commit(
        [OffsetCommit(group=f"group-{i:04d}", topic="topic-00000", partition=0, offset=0) for i in range(groups)]
    )
    return time.perf_counter() - started


def timed(fn: Any) -> dict[str, float]:
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}


def browser_loads(url: str) -> dict[str, dict[str, float]]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    out = {}
    try:
        driver.get(f"{url}/console/")
        for page in ("#/topics", "#/groups"):

            def load(page: str = page) -> None:
                driver.execute_script(
                    "document.body.dataset.ready = ''; location.hash = '#/'; location.hash = arguments[0]", page
                )
                WebDriverWait(driver, 120).until(
                    lambda d: d.execute_script("return document.body.dataset.ready") == page
                )

            out[f"console {page} page drawn"] = timed(load)
    finally:
        driver.quit()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.console_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    topics, groups = (2000, 200) if args.quick else (10_000, 1_000)
    work = Path(tempfile.mkdtemp(prefix="topiclake-console-bench-", dir=os.environ.get("BENCH_TMP")))
    try:
        root = work / "data"
        setup_s = populate(root, topics, groups)
        print(f"{topics} topics and {groups} groups created in {setup_s:.0f} s", flush=True)
        srv = ServerProcess(root).start()
        try:
            api = httpx.Client(base_url=srv.url, timeout=120)
            middle = f"topic-{topics // 2:05d}"
            assert len(api.get("/topics", params={"limit": 50}).json()["topics"]) == 50
            assert len(api.get("/groups", params={"limit": 50}).json()["groups"]) == 50
            results = {
                "GET /topics?limit=50 (first page)": timed(lambda: api.get("/topics", params={"limit": 50})),
                "GET /topics?limit=50&after=<middle>": timed(
                    lambda: api.get("/topics", params={"limit": 50, "after": middle})
                ),
                "GET /topics?search=12&limit=50": timed(
                    lambda: api.get("/topics", params={"search": "12", "limit": 50})
                ),
                "GET /groups?limit=50 (first page)": timed(lambda: api.get("/groups", params={"limit": 50})),
                **browser_loads(srv.url),
            }
        finally:
            srv.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [{"measure": k, **v} for k, v in results.items()]
    print_table(rows, ["measure", "median_ms", "max_ms"])
    write_results("console_bench", rows, {"topics": topics, "groups": groups, "setup_s": round(setup_s, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
