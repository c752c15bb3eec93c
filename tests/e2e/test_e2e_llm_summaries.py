"""A long session through the proxy on the real llama.cpp server (one slot, CPU): no request
waits for a summary. Each request's wall time stays within twice its own generation time
(llama.cpp's `timings`: `prompt_ms` + `predicted_ms`) plus a fixed allowance, while the
summaries are made in the background between requests and stand in once made."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from inflight.compaction.summary.background import BackgroundSummaries
from inflight.factory import create_app
from tests.conftest import make_settings
from tests.e2e.test_e2e_llm import LLM_URL, MODEL, pytestmark  # noqa: F401 (the LLM tier)
from tests.support.servers import serve

# The session goes on until AFTER_EVENT turns past its first compaction event (it comes at
# about the twelfth turn): an event whose span was not among those summarised ahead serves
# `pending`, and its summary, made in the background, stands in from the next turn on. An
# event on the session's last turn could show only the first half of that.
AFTER_EVENT = 2
MAX_TURNS = 24
# What the proxy may add to a request besides twice its generation: HTTP, counting, planning
# and rendering on a loaded 2-core machine.
ALLOWANCE = 1.5  # seconds
WAIT = 900.0  # the longest any one wait may take (the shared server is slow and busy)


class SlotWatch:
    """Samples the server's one slot while a request is in flight: which prompts it worked on,
    so a request that queued behind someone else's (the server is shared) is told apart."""

    def __init__(self, server: str) -> None:
        self._url = server + "/slots"
        self.prompts: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                try:
                    slot = client.get(self._url).json()[0]
                except (httpx.HTTPError, ValueError, LookupError):
                    slot = {}
                if slot.get("is_processing"):
                    self.prompts.add(int(slot.get("n_prompt_tokens", -1)))
                self._stop.wait(0.05)

    def __enter__(self) -> SlotWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT:g}s for {what}"
        time.sleep(0.1)


def server_idle(server: str) -> bool:
    try:
        return not httpx.get(server + "/slots", timeout=5).json()[0].get("is_processing")
    except (httpx.HTTPError, ValueError, LookupError):
        return False


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FastAPI]]:
    assert LLM_URL is not None
    tmp = tmp_path_factory.mktemp("llm-summaries")
    app = create_app(make_settings(tmp, upstream_url=LLM_URL, summary_timeout=600))
    with serve(app, timeout=30) as url:
        yield url + "/v1", app


def note(i: int) -> str:
    return (
        f"Note {i}: the build server number {i} runs job {i * 7} at port {8000 + i}; "
        "its logs rotate daily, its owner is the platform team, and it must not be restarted "
        "during business hours unless the on-call engineer approves the change in writing."
    )


@pytest.mark.timeout(3000)  # a shared, slow one-slot server: other clients' requests go first
def test_no_request_of_a_long_session_waits_for_a_summary(proxy: tuple[str, FastAPI]) -> None:
    url, app = proxy
    assert LLM_URL is not None
    server = LLM_URL.removesuffix("/v1")
    background = app.state.inflight.compactor.background
    assert isinstance(background, BackgroundSummaries)
    stats = app.state.inflight.metrics.summary_stats
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "Remember the notes I send; answer OK to each. " + note(0)},
    ]
    states: list[str] = []
    with openai.OpenAI(base_url=url, api_key="none", timeout=WAIT, max_retries=0) as oai:

        def ask() -> tuple[Any, float]:
            started = time.monotonic()
            raw = oai.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=6,
                temperature=0,
                extra_headers={"X-Compaction-Context-Limit": "1024"},
            )
            return raw, time.monotonic() - started

        ask()  # warm-up, not measured: window discovery, first connections
        for i in range(MAX_TURNS):
            if i:
                messages.append({"role": "user", "content": note(i)})
            for _attempt in range(5):
                # the user "types" while the summaries are made; then the server is idle
                wait_until(lambda: background.counts.queued + background.counts.running == 0,
                           "the background summaries")  # fmt: skip
                wait_until(lambda: server_idle(server), "the shared server to be idle")
                calls = stats.calls
                with SlotWatch(server) as watch:
                    raw, wall = ask()
                body = raw.http_response.json()
                timings = body["timings"]
                generation = (timings["prompt_ms"] + timings["predicted_ms"]) / 1000
                own = timings["prompt_n"] + timings.get("cache_n", 0)
                foreign = watch.prompts - {own}
                if wall <= 2 * generation + ALLOWANCE or stats.calls != calls or not foreign:
                    break  # measured (a summary call of our own is never excused)
                # it queued behind another client of the shared server: measure it again
            assert stats.calls == calls, "a summary call was made on the request path"
            assert wall <= 2 * generation + ALLOWANCE, (i, wall, generation, own, watch.prompts)
            states.append(raw.headers.get("x-compaction-summary") or "-")
            answer = body["choices"][0]["message"]["content"] or "OK"
            messages.append({"role": "assistant", "content": answer})
            events = [k for k, state in enumerate(states) if state != "-"]
            if events and len(states) - 1 - events[0] >= AFTER_EVENT:
                break
    # turn by turn, so that a failure shows where the events fell and what stood in
    # a string, so that the whole sequence is printed (pytest cuts a long list's repr short)
    seen = f"states {' '.join(states)}; {background.counts}; summary calls {stats.calls}"
    assert set(states) != {"-"}, ("no compaction event: the session is too short", seen)
    assert "cached" in states, seen  # a summary made in the background stood in
    assert background.counts.made >= 1
