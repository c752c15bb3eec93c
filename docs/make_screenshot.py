"""Make `docs/dashboard.png`: the dashboard after replaying agent transcripts through inflight.

    .venv/bin/python docs/make_screenshot.py [--seconds 120] [--out docs/dashboard.png]

The proxy runs on a real uvicorn with its usual settings (prices from `config/prices.toml`, a
temporary SQLite store). Its upstream is an in-process fake that bills like OpenAI: prompt
tokens counted with o200k, cache hits on the longest prefix shared with any earlier prompt
(1,024 tokens or more, 128-token steps). Three transcripts from `tests/data/traces` are replayed
turn by turn (16k window forced by header), spread over `--seconds` so the charts have a time
axis, plus a few requests to a self-hosted model (unpriced). Then headless Chromium (Debian's
`chromium` + `chromium-driver`) opens `/dashboard` and saves the page.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cost import ProviderCache  # noqa: E402
from inflight.factory import create_app  # noqa: E402
from inflight.pricing.table import PriceTable  # noqa: E402
from tests.conftest import make_settings  # noqa: E402
from tests.support import load_traces, request_points  # noqa: E402
from tests.support.fakes.chat import completion, reference_tokens  # noqa: E402
from tests.support.servers import serve  # noqa: E402

TRANSCRIPTS = {  # transcript → model it is replayed with
    "mini_deepseek-chat_django__django-13265": "gpt-4.1",
    "mini_deepseek-chat_astropy__astropy-12907": "gpt-4.1",
    "taubench_gpt-4o_airline_task2_trial1": "gpt-4o-mini",
}
LOCAL_MODEL = "qwen2.5-coder-7b"  # self-hosted: unpriced
WINDOW = "16384"


class BillingUpstream:
    """Answers every chat request with OpenAI-shaped usage, caching simulated per model."""

    def __init__(self) -> None:
        self.prices = PriceTable.load(ROOT / "config" / "prices.toml")
        self.caches: dict[str, ProviderCache] = {}
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        model, messages = body["model"], body["messages"]
        price = self.prices.lookup(model) or self.prices.lookup("gpt-4.1")
        assert price is not None
        cache = self.caches.setdefault(model, ProviderCache(price, self.prices.baseline))
        tokens = [reference_tokens([m]) - 3 for m in messages]
        billed = cache.bill(messages, tokens, completion=120)
        answer = completion(model, "Done: the next step is to run the tests.", billed.prompt)
        answer["usage"].update(
            completion_tokens=120,
            total_tokens=billed.prompt + 120,
            prompt_tokens_details={"cached_tokens": billed.cached},
        )
        return JSONResponse(answer)


def replay(base_url: str, seconds: float) -> int:
    traces = dict(load_traces())
    turns = [
        (model, traces[name][:k]) for name, model in TRANSCRIPTS.items()
        for k in request_points(traces[name])
    ]  # fmt: skip
    local = traces["taubench_gpt-4o_airline_task33_trial0"]
    turns += [(LOCAL_MODEL, local[:k]) for k in request_points(local)[:6]]
    turns.sort(key=lambda turn: len(turn[1]))  # interleave the conversations as they grow
    pause = seconds / max(1, len(turns))
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for model, messages in turns:
            response = client.post(
                "/v1/chat/completions",
                json={"model": model, "messages": messages},
                headers={"x-compaction-context-limit": WINDOW},
            )
            response.raise_for_status()
            time.sleep(pause)
    return len(turns)


def recorded(base_url: str, requests: int, timeout: float = 30.0) -> dict[str, Any]:
    """`/stats` once every request is in the store (the usage queue writes in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        stats: dict[str, Any] = httpx.get(f"{base_url}/stats", timeout=10).json()
        if stats["requests"] >= requests or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def screenshot(url: str, out: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit("needs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="inflight-shot-")
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--hide-scrollbars", "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(url)
        driver.find_element(By.CSS_SELECTOR, '#ranges button[data-window="900"]').click()
        WebDriverWait(driver, 20).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-requests rect.bar")
        )
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, int(height) + 20)
        time.sleep(0.5)  # one frame for the resized layout (a screenshot script, not a test)
        out.write_bytes(driver.get_screenshot_as_png())
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="docs/make_screenshot.py")
    parser.add_argument("--seconds", type=float, default=120.0, help="spread the replay over")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args()
    upstream = BillingUpstream()
    with tempfile.TemporaryDirectory() as tmp:
        settings = make_settings(Path(tmp), config_dir=ROOT / "config")
        app = create_app(settings, transport=httpx.ASGITransport(app=upstream.app))
        with serve(app) as base_url:
            sent = replay(base_url, args.seconds)
            stats = recorded(base_url, sent)
            screenshot(f"{base_url}/dashboard", args.out)
    cost = stats["cost"]
    print(  # noqa: T201 - a command-line script
        f"{sent} requests; spent ${cost['actual']:.2f}, baseline ${cost['baseline']:.2f}, "
        f"saved ${cost['saved']:.2f}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
