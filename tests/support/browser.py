"""A real browser for the status page's tests: Debian's headless chromium, driven by selenium
through the system chromedriver (`scripts/setup-chromium.sh` installs both).

Missing chromium, chromedriver or selenium skips the tests on a developer machine and fails
them under `CI` (`deploy.missing_tool`). The browser's console is kept (`goog:loggingPrefs`),
so a test can read what the page logged: a page without script logs nothing. Screenshots go to
`artifacts_dir()`: `$PROBER_TEST_ARTIFACTS`, else tests/artifacts/ (ignored by git).
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.deploy import ROOT, missing_tool

CHROMEDRIVER = Path(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
SETUP = "scripts/setup-chromium.sh"


def artifacts_dir() -> Path:
    path = Path(os.environ.get("PROBER_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator[Any]:
    """A headless chromium (a selenium `WebDriver`) of the given window size, quit after."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None or not CHROMEDRIVER.exists():
        missing_tool(f"chromium and chromium-driver ({SETUP})")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing_tool("selenium (pip install -e '.[test]')")
    options = Options()
    options.binary_location = binary or ""
    for argument in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(argument)
    if os.geteuid() == 0:  # chromium refuses to run its sandbox as root
        options.add_argument("--no-sandbox")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def full_page_screenshot(driver: Any, path: Path) -> None:
    """The whole page, not just the window (Chrome's DevTools `captureBeyondViewport`)."""
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
