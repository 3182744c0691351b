"""The console's browser tests: Debian's chromium, headless, driven through its chromedriver by
Selenium (no browser download at run time). `make setup` installs both; without them these tests
are skipped and say why, unless TOPICLAKE_REQUIRE_BROWSER is set (CI), which fails instead.

TOPICLAKE_CONSOLE_SCREENSHOTS=<dir> makes the tests save a screenshot of each page there
(docs/console holds the ones docs/CONSOLE.md shows)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        reason = "Debian's chromium and chromium-driver are not installed (make setup installs them)."
        if os.environ.get("TOPICLAKE_REQUIRE_BROWSER"):
            pytest.fail(reason)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def screenshots():
    where = os.environ.get("TOPICLAKE_CONSOLE_SCREENSHOTS")

    def take(driver, name: str) -> None:
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(Path(where) / f"{name}.png"))

    return take
