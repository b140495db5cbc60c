"""The status page in a real browser: headless chromium driven by selenium, against an
in-process daemon probing the simulator and a hostile engine (tests/support/status.py).

What the browser shows is checked against the daemon's /metrics (the last outcome, the count
of probes, read between two scrapes); the hostile engine's error text (markup, an event
handler, control characters, the API key split by a zero-width space) must be shown as inert,
redacted text: no element made of it, no alert, nothing in the console. Screenshots of the
index, a target and the index on a phone's width are saved under `artifacts_dir()`.
Skipped without chromium, chromedriver or selenium; failed under CI (tests/support/browser.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.browser import artifacts_dir, chromium, full_page_screenshot
from tests.support.daemon import daemon, scrape, simulator, value, wait_for
from tests.support.status import KEY, KEY_ENV, hostile_engine, targets

pytestmark = pytest.mark.browser
PHONE_WIDTH = 390  # CSS pixels of a common phone


@dataclass
class Card:
    outcome: str
    probes: int
    errors: list[str]


@dataclass
class Seen:
    cards: dict[str, Card] = field(default_factory=dict)
    scripts: int = 0
    images: int = 0
    alert: bool = False
    console: list[dict[str, Any]] = field(default_factory=list)
    page_text: str = ""
    overflow: int = 0  # CSS pixels wider than the window (a phone would scroll sideways)


def read_page(driver: Any, url: str, shot: str) -> Seen:
    """Load `url` and read what the browser made of it (in a thread: selenium blocks)."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    driver.get(url)
    seen = Seen()
    for card in driver.find_elements(By.CSS_SELECTOR, "section.card.target"):
        name = card.find_element(By.CSS_SELECTOR, "h2").text.split("\n")[0].strip()
        outcome = card.find_element(By.CSS_SELECTOR, ".last-probe .pill").text
        probes = card.find_element(By.XPATH, ".//dt[text()='probes']/following-sibling::dd[1]")
        errors = [e.text for e in card.find_elements(By.CSS_SELECTOR, ".error") if e.text]
        seen.cards[name] = Card(outcome, int(probes.text), errors)
    seen.scripts = len(driver.find_elements(By.TAG_NAME, "script"))
    seen.images = len(driver.find_elements(By.TAG_NAME, "img"))
    try:
        driver.switch_to.alert  # noqa: B018  (raises when no alert is open)
        seen.alert = True
    except NoAlertPresentException:
        pass
    seen.console = driver.get_log("browser")
    seen.page_text = driver.find_element(By.TAG_NAME, "body").text
    seen.overflow = driver.execute_script(
        "return document.documentElement.scrollWidth - window.innerWidth"
    )
    full_page_screenshot(driver, artifacts_dir() / shot)
    return seen


async def test_the_status_page_in_chromium(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    with chromium() as driver:
        async with (
            simulator(slots=4) as sim,
            hostile_engine() as hostile,
            daemon({"targets": targets(sim, hostile, interval=0.3)}) as (url, _),
        ):

            async def probed() -> bool:
                s = await scrape(url)
                return all(
                    value(s, "llmprober_requests_total", target=t, mode="probe") >= 3
                    for t in ("sim", "hostile")
                )

            await wait_for(probed, timeout=40)
            before = await scrape(url)
            index = await asyncio.to_thread(read_page, driver, url + "/", "status-index.png")
            after = await scrape(url)
            detail = await asyncio.to_thread(
                read_page, driver, url + "/targets/hostile", "status-target-hostile.png"
            )
            await asyncio.to_thread(driver.set_window_size, PHONE_WIDTH, 900)
            phone = await asyncio.to_thread(read_page, driver, url + "/", "status-phone.png")
            phone_detail = await asyncio.to_thread(
                read_page, driver, url + "/targets/sim", "status-phone-target.png"
            )

    # What the browser shows agrees with /metrics.
    assert set(index.cards) == {"sim", "hostile"}
    assert index.cards["sim"].outcome == "ok"
    assert value(after, "llmprober_probe_success", target="sim") == 1
    assert index.cards["hostile"].outcome == "http_5xx"
    assert value(after, "llmprober_requests_total", target="hostile", outcome="http_5xx") >= 3
    assert value(after, "llmprober_probe_success", target="hostile") == 0
    for name, card in index.cards.items():
        low = value(before, "llmprober_requests_total", target=name, mode="probe")
        high = value(after, "llmprober_requests_total", target=name, mode="probe")
        assert low <= card.probes <= high, name

    # The hostile text is text: shown as written, redacted, and nothing of it ran.
    for seen in (index, detail, phone, phone_detail):
        assert seen.scripts == 0
        assert seen.images == 0
        assert not seen.alert
        assert seen.console == [], seen.console  # no error, no message: nothing ran
        assert KEY not in seen.page_text
        assert KEY[:12] not in seen.page_text
        assert not any(c in seen.page_text for c in "\x1b\x07\x00\u200b")
    error = index.cards["hostile"].errors[0]
    assert error.startswith('HTTP 500: <script>alert(1)</script><img src=x onerror="alert(2)">')
    assert "key=[REDACTED]" in error
    assert len(detail.cards["hostile"].errors) >= 3  # one per probe in the detail's table

    # Readable on a phone: nothing wider than its screen.
    assert phone.overflow <= 0
    assert phone_detail.overflow <= 0
