"""`/dashboard` in a real browser: headless Chromium (Debian's `chromium` + `chromium-driver`)
driven by Selenium against the proxy on a real uvicorn, its upstream the in-process fake.

The page must show the figures `/stats` has, and with `INFLIGHT_API_KEYS` set nothing at all
until a valid key is entered in its form (the key kept in memory: never in the URL, a cookie
or web storage)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.support.servers import WatchedStore, serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "Chromium or chromedriver is absent (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.e2e
WAIT = 20.0
KEY = "sk-dashboard-test-key"


def usd(value: float) -> str:
    """The page's dollar format."""
    sign = "-$" if value < 0 else "$"
    return sign + (f"{abs(value):.4f}" if abs(value) < 1 else f"{abs(value):.2f}")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None
    assert CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="inflight-chromium-")
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--window-size=1400,1800", f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i} " * 400})
    return messages


def fill(base_url: str, store: WatchedStore, fake: FakeUpstream, headers: dict[str, str]) -> int:
    """Traffic of every kind the page shows; returns the number of usage records."""
    conversation = _conversation(12)
    requests: list[tuple[str, list[dict[str, Any]], dict[str, str]]] = [
        ("gpt-4o", conversation[: 2 + 2 * n], {"x-compaction-context-limit": "3000"})
        for n in range(4, 13)
    ]
    requests.append(("gpt-4o-mini", conversation[:4], {}))
    # far under the window: only cost mode cuts it (the fixtures' floor is 1,000 tokens)
    requests.append(
        ("gpt-4o", conversation, {"x-compaction-context-limit": "200000",
                                  "x-compaction-for-cost": "on"})
    )  # fmt: skip
    requests.append(("local-qwen", conversation[:4], {}))  # unpriced
    requests.append(
        ("gpt-4o", conversation, {"x-compaction-context-limit": "3000",
                                  "x-compaction-strategy": "summarize"})
    )  # fmt: skip
    with httpx.Client(base_url=base_url, headers=headers, timeout=WAIT) as client:
        for model, messages, extra in requests:
            response = client.post(
                "/v1/chat/completions",
                json={"model": model, "messages": messages, "max_tokens": 64},
                headers=extra,
            )
            assert response.status_code == 200, response.text
    expected = len(requests) + fake.summary_calls  # one record per summary call too
    store.wait_for(expected, timeout=WAIT)
    return expected


@pytest.fixture
def proxy(tmp_path: Path, fake: FakeUpstream) -> Iterator[tuple[str, WatchedStore]]:
    fake.prompt_tokens = 150_000  # a price you can see
    store = WatchedStore()
    # summaries made for the request that needs them: `fill` counts their records at once
    app = create_app(
        make_settings(tmp_path, summary_wait=True, cost_min_prompt=1000),
        transport=httpx.ASGITransport(app=fake.app),
        store=store,
    )
    with serve(app) as base_url:
        yield base_url, store


@pytest.fixture
def keyed_proxy(tmp_path: Path, fake: FakeUpstream) -> Iterator[tuple[str, WatchedStore]]:
    fake.prompt_tokens = 150_000
    store = WatchedStore()
    settings = make_settings(tmp_path, api_keys=KEY, summary_wait=True, cost_min_prompt=1000)
    app = create_app(settings, transport=httpx.ASGITransport(app=fake.app), store=store)
    with serve(app) as base_url:
        yield base_url, store


def _text(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def _loaded(driver: WebDriver) -> None:
    WebDriverWait(driver, WAIT).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded")
    )


def check_figures(driver: WebDriver, stats: dict[str, Any]) -> None:
    """Every figure the page shows against `/stats`."""
    cost = stats["cost"]
    assert _text(driver, "kpi-requests") == f"{stats['requests']:,}"
    assert _text(driver, "kpi-saved-tokens") == f"{stats['tokens_saved']:,}"
    assert _text(driver, "kpi-actual") == usd(cost["actual"])
    assert _text(driver, "kpi-baseline") == usd(cost["baseline"])
    assert _text(driver, "kpi-saved-dollars") == usd(cost["saved"])
    assert _text(driver, "kpi-summaries") == f"{usd(cost['summaries'])} of it on summaries"
    assert _text(driver, "kpi-unpriced") == f"{cost['unpriced_requests']:,} unpriced requests"
    assert _text(driver, "kpi-saved-by") == (
        f"{usd(cost['saved_by_fit'])} by fit · {usd(cost['saved_by_cost_mode'])} by cost mode"
    )
    ledger = stats["ledger"]
    assert _text(driver, "kpi-realised") == (
        f"{usd(ledger['realised_net'])} realised net of {ledger['realised_events']:,} events "
        f"over {ledger['realised_turns']:,} requests after"
    )
    assert _text(driver, "kpi-lost-refs") == f"{ledger['lost_per_event']:.2f}"
    assert _text(driver, "kpi-refs") == (
        f"{ledger['facts_retained']:,} retained · {ledger['facts_restorable']:,} restorable · "
        f"{ledger['facts_lost']:,} lost in {ledger['rows_with_facts']:,} events"
    )
    rows = driver.find_elements(By.CSS_SELECTOR, "#models tbody tr")
    assert {r.get_attribute("data-model") for r in rows} == set(stats["models"])
    for row in rows:
        entry = stats["models"][row.get_attribute("data-model")]
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        model_cost = entry["cost"]
        assert cells[1:] == [
            f"{entry['requests']:,}", f"{entry['tokens_in']:,}", f"{entry['tokens_saved']:,}",
            usd(model_cost["actual"]), usd(model_cost["baseline"]), usd(model_cost["saved"]),
        ]  # fmt: skip
    bars = driver.find_elements(By.CSS_SELECTOR, "#compactions .row")
    shown = {b.get_attribute("data-name"): b.find_element(By.CLASS_NAME, "num").text for b in bars}
    assert shown == {name: f"{n:,}" for name, n in stats["compactions"].items()}
    facts = dict(
        zip(
            [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#summaries dt")],
            [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#summaries dd")],
            strict=True,
        )
    )
    stood = stats["summaries"]["stand_ins"]
    if stood:  # the share of compacted requests a summary stood in for
        share = round(100 * stood.get("summary", 0) / sum(stood.values()))
        assert facts["compacted requests with a summary"] == f"{share} % of {sum(stood.values()):,}"
    windows = driver.find_elements(By.CSS_SELECTOR, "#windows .row")
    assert {w.get_attribute("data-name") for w in windows} == {
        name for name, m in stats["models"].items() if "recent_window_share" in m
    }


def settled_stats(
    driver: WebDriver, base_url: str, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """`/stats` once every ledger row has its references' fates (worked out after the answers,
    off the event loop): polled by the driver's bounded wait."""
    found: dict[str, Any] = {}

    def settled(_: WebDriver) -> bool:
        found.update(httpx.get(f"{base_url}/stats", headers=headers, timeout=WAIT).json())
        return bool(found["ledger"]["rows_with_facts"] == found["ledger"]["rows"])

    WebDriverWait(driver, WAIT).until(settled)
    return found


def test_dashboard_shows_what_stats_has(
    browser: WebDriver, proxy: tuple[str, WatchedStore], fake: FakeUpstream
) -> None:
    base_url, store = proxy
    records = fill(base_url, store, fake, {})
    stats = settled_stats(browser, base_url)
    assert stats["cost"]["saved"] != 0  # the fake reports no cache hits: the sign may be either
    assert stats["cost"]["unpriced_requests"] == 1
    assert stats["cost"]["saved_by_fit"] != 0
    assert stats["cost"]["saved_by_cost_mode"] != 0  # the request only cost mode cut
    assert stats["ledger"]["rows_with_facts"] > 0  # each compacted request's references
    assert stats["ledger"]["realised_events"] > 0  # the gpt-4o conversation's events
    assert stats["compactions"]
    assert stats["summary_calls"] >= 1
    assert stats["summaries"]["stand_ins"]  # the share of requests with a summary is shown
    browser.get(f"{base_url}/dashboard")
    _loaded(browser)
    check_figures(browser, stats)
    recent = browser.find_elements(By.CSS_SELECTOR, "#recent tbody tr")
    assert len(recent) == min(20, records - stats["summary_calls"])
    assert "unpriced" in {r.find_elements(By.TAG_NAME, "td")[-1].text for r in recent}
    series = httpx.get(f"{base_url}/stats/timeseries", timeout=WAIT).json()["series"]
    assert sum(b["requests"] for b in series) == stats["requests"]
    bars = browser.find_elements(By.CSS_SELECTOR, "#chart-requests rect.bar")
    assert len(bars) == len([b for b in series if b["requests"]])
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-dollars polyline")
    assert not browser.find_element(By.ID, "login").is_displayed()


def test_keyed_dashboard_shows_nothing_without_a_key(
    browser: WebDriver, keyed_proxy: tuple[str, WatchedStore], fake: FakeUpstream
) -> None:
    base_url, store = keyed_proxy
    fill(base_url, store, fake, {"authorization": f"Bearer {KEY}"})
    stats = settled_stats(browser, base_url, {"authorization": f"Bearer {KEY}"})
    browser.get(f"{base_url}/dashboard")
    login = browser.find_element(By.ID, "login")
    WebDriverWait(browser, WAIT).until(lambda d: login.is_displayed())
    assert not browser.find_element(By.ID, "board").is_displayed()
    assert _text(browser, "status") == "locked"
    for figure in ("kpi-requests", "kpi-actual", "kpi-baseline", "kpi-saved-dollars"):
        assert browser.find_element(By.ID, figure).get_attribute("textContent") == ""
    assert not browser.find_elements(By.CSS_SELECTOR, "#models tbody tr, #recent tbody tr")

    form = browser.find_element(By.ID, "key-input")
    form.send_keys("sk-wrong")
    browser.find_element(By.ID, "key-submit").click()
    WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.ID, "key-error").is_displayed())
    assert not browser.find_element(By.ID, "board").is_displayed()

    browser.find_element(By.ID, "key-input").send_keys(KEY)
    browser.find_element(By.ID, "key-submit").click()
    _loaded(browser)
    WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.ID, "board").is_displayed())
    check_figures(browser, stats)
    assert not login.is_displayed()
    # the key lives in the page's memory only
    assert KEY not in browser.current_url
    assert browser.get_cookies() == []
    storage = browser.execute_script(
        "return JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])"
    )
    assert KEY not in storage
    assert storage == "[[],[]]"
    assert browser.find_element(By.ID, "key-input").get_attribute("value") == ""
