"""Facts survive (DESIGN.md §14): reference retention per strategy on the transcript replays.

For each compaction event, the identifiers of the cut span that the session mentions again
later are retained (in the forwarded prompt), restorable (behind a marker's ref) or lost
(app/cli/retention.py). Summaries come from a fake extractive summariser (the first line of
each message, bounded: a model that keeps the gist and drops most details), through the real
rolling-summary code with the exact-fact guard off and on; with `INFLIGHT_TEST_LLM_URL` set, the
transcripts and windows of `LLM_CASES` also with the real model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson

from inflight.cli.retention import Retention, retention
from inflight.compaction.engine import CompactionResult, compact
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.summary.cache import MemoryCache, SummaryFlight
from inflight.compaction.summary.prompt import Completer, SummaryFailed, SummaryPrompt
from inflight.compaction.summary.rolling import Summaries, SummaryJob, summary_budget
from inflight.compaction.summary.stand_in import without_summary
from inflight.strategies import StrategyName
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from tests.support import load_traces

MODEL = "gpt-4o"
WINDOWS = (8192, 16384, 32768)
CONFIG = Path(__file__).resolve().parents[1] / "config"
_TRANSCRIPT = re.compile(r"<transcript>\n(.*)\n</transcript>", re.S)
_PREVIOUS = re.compile(r"<previous_summary>\n(.*)\n</previous_summary>", re.S)


@dataclass(frozen=True, slots=True)
class Row:
    """One strategy of the table: its pipeline, restore, and how summaries are made."""

    name: str
    pipeline: tuple[StrategyName, ...]
    restore: bool = False
    guard: bool | None = None  # None: no summariser


ROWS = (
    Row("trim", ("trim",)),
    Row("trim + restore", ("trim",), restore=True),
    Row("middle-out", ("middle-out",)),
    Row("summarize (model alone)", ("summarize",), guard=False),
    Row("summarize + guard", ("summarize",), guard=True),
    Row("auto (+ guard)", ("truncate", "prune", "summarize"), guard=True),
)


def extractive(prompt: str, max_tokens: int) -> str:
    """The fake summariser: the previous summary, then the first line of each message of the
    transcript, cut to 100 characters, within about `max_tokens`."""
    lines: list[str] = []
    previous = _PREVIOUS.search(prompt)
    if previous:
        lines.append(previous.group(1).split("\n\nFacts kept")[0])
    found = _TRANSCRIPT.search(prompt)
    blocks = found.group(1).split("\n\n[") if found else []
    for block in blocks:
        body = block.split("\n", 1)[1:] or [""]
        first = body[0].strip().split("\n", 1)[0][:100]
        if first:
            lines.append(f"- {first}")
    text = "\n".join(lines)
    return text[: max_tokens * 3].rsplit("\n", 1)[0] if len(text) > max_tokens * 3 else text


async def fake_completer(body: dict[str, Any]) -> tuple[int, bytes]:
    """A chat completion of `extractive`."""
    text = extractive(body["messages"][0]["content"], int(body["max_tokens"]))
    answer = {"choices": [{"message": {"role": "assistant", "content": text or "-"}}]}
    return 200, orjson.dumps(answer)


def llm_completer(client: httpx.AsyncClient, url: str) -> Completer:
    """The real model's chat completions, remembered by request body (the guard's run and
    the model-alone run ask the same questions; temperature 0)."""
    seen: dict[bytes, tuple[int, bytes]] = {}

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        key = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        if key not in seen:
            response = await client.post(f"{url.rstrip('/')}/chat/completions", json=body)
            seen[key] = response.status_code, response.content
        return seen[key]

    return complete


@dataclass(frozen=True, slots=True)
class Setup:
    """What the replays of one window share."""

    counter: ChatTokenCounter
    budget: Budget
    complete: Completer
    chunk_tokens: int

    def count(self, message: Mapping[str, Any]) -> int:
        return self.counter.count_message(MODEL, message)

    def count_text(self, text: str) -> int:
        return self.counter.count_text(MODEL, text)


def compactor(setup: Setup, row: Row) -> Any:
    """The compaction of one request for `row` (summaries made in wait mode, cached)."""
    prompt = SummaryPrompt.load(CONFIG / "summary_prompt.md")
    summaries = Summaries(prompt, SummaryFlight(MemoryCache()), guard=bool(row.guard))
    budget = setup.budget

    async def run(messages: Sequence[Mapping[str, Any]]) -> CompactionResult:
        if row.guard is None:
            return compact(messages, row.pipeline, budget, setup.count, 0, restore=row.restore)
        reserved = summary_budget(budget.goal)
        the_plan = plan(messages, row.pipeline, budget, setup.count, 0, reserved)
        given = {"summary_tokens": reserved, "planned": the_plan}
        if not the_plan.summarize:
            return compact(messages, row.pipeline, budget, setup.count, 0, summary="", **given)
        job = SummaryJob(
            messages, the_plan, MODEL, setup.complete, reserved, setup.chunk_tokens,
            setup.count_text,
        )  # fmt: skip
        try:
            text: str | None = await summaries.summary_for(job)
        except SummaryFailed:
            text = None
        result = compact(messages, row.pipeline, budget, setup.count, 0, summary=text, **given)
        if text is None:
            return without_summary(result, row.pipeline, reserved, budget, setup.count)
        return result

    return run


def _cells(r: Retention) -> str:
    return (
        f"{r.share(r.retained):.0%} | {r.share(r.restorable):.0%} | {r.share(r.lost):.0%} | "
        f"{r.saved:.0%} | {r.recurring} / {r.events}"
    )


def _table(scores: Mapping[tuple[str, int], Retention], windows: Sequence[int]) -> str:
    lines = [
        "| strategy | window | retained | restorable | lost | tokens saved | refs / events |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in ROWS:
        for window in windows:
            if (row.name, window) in scores:
                score = scores[(row.name, window)]
                lines.append(f"| {row.name} | {window // 1024}k | {_cells(score)} |")
    return "\n".join(lines)


LEGEND = (
    "Recurring references: identifiers (paths, URLs, ids, hashes, numbers with units, error "
    "codes, exception, function and class names, quoted strings) of the span an event cut "
    "that the session mentions again later. Retained: in the forwarded prompt; restorable: "
    "behind a restore marker's ref; lost: neither. Summed over the events of {what}; "
    "tokens saved over every request. Windows with a 1,024-token output reserve, threshold "
    "0.8, target 0.5, counted with o200k.\n\n"
)


def report(windows: Sequence[int] = WINDOWS) -> str:
    """Every shipped transcript, every row, with the fake summariser."""
    counter = ChatTokenCounter(load_encodings())
    scores: dict[tuple[str, int], Retention] = {}

    async def main() -> None:
        for window in windows:
            budget = Budget(window, 1024, 0.8, 0.5)
            setup = Setup(counter, budget, fake_completer, 100_000)
            for row in ROWS:
                for _, messages in load_traces():
                    score = await retention(messages, compactor(setup, row))
                    scores[(row.name, window)] = scores.get((row.name, window), Retention()) + score

    anyio.run(main)
    return LEGEND.format(what="the 8 shipped transcripts") + _table(scores, windows)


# (transcript, window) pairs the real model summarises: the sessions whose events its CPU
# time allows (a summary call takes one to two minutes on the shared 2-core server); more
# (e.g. the other tau transcripts at 8k, ponyc at 16k) are one argument away
LLM_CASES: tuple[tuple[str, int], ...] = (
    ("tau2_gpt-4.1_retail_task71", 8192),
    ("taubench_gpt-4o_airline_task2_trial1", 8192),
)
LLM_ROWS = tuple(row for row in ROWS if row.name != "auto (+ guard)")


def _cases_table(scores: Mapping[tuple[str, str, int], Retention], cases: Sequence[str]) -> str:
    """One line per strategy and transcript, then per strategy over all of them."""
    lines = [
        "| strategy | transcript | window | retained | restorable | lost | tokens saved "
        "| refs / events |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in LLM_ROWS:
        total = Retention()
        for (name, trace, window), score in scores.items():
            if name == row.name:
                total += score
                lines.append(f"| {name} | `{trace}` | {window // 1024}k | {_cells(score)} |")
        if len(cases) > 1:
            lines.append(f"| **{row.name}** | all {len(cases)} | | {_cells(total)} |")
    return "\n".join(lines)


def llm_report(url: str, cases: Sequence[tuple[str, int]] = LLM_CASES) -> str:
    """The rows but `auto` on the `cases` (transcript, window), summaries by the real model
    behind `url` (its OpenAI base URL)."""
    counter = ChatTokenCounter(load_encodings())
    traces = dict(load_traces())
    scores: dict[tuple[str, str, int], Retention] = {}

    async def main() -> None:
        async with httpx.AsyncClient(timeout=600) as client:
            complete = llm_completer(client, url)
            for row in LLM_ROWS:
                for trace, window in cases:
                    setup = Setup(counter, Budget(window, 1024, 0.8, 0.5), complete, 2500)
                    score = await retention(traces[trace], compactor(setup, row))
                    scores[(row.name, trace, window)] = score

    anyio.run(main)
    what = f"{len(cases)} transcripts, summaries by the real model"
    return LEGEND.format(what=what) + _cases_table(scores, [t for t, _ in cases])
