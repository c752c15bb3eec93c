"""`python -m bench.ledger`: what the ledger of cuts costs a compacted request, side by side.

`CompactionService.prepare` on agent sessions of growing size, compacted with
`truncate,prune,trim` into a 32k window, with `INFLIGHT_LEDGER=off`, `meta` and `full` in turn
(medians of interleaved runs), and the time the ledger row takes on the request path (its JSON
is built later, in the writer's thread).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from inflight.apis.chat.api import API as CHAT_API
from inflight.apis.chat.format import ChatFormat
from inflight.compaction.service import CompactionService
from inflight.proxy.api import Exchange
from inflight.settings import LedgerMode, Settings
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.usage.ledger import Ledger
from inflight.usage.records import UsageQueue
from inflight.usage.stores.null import NullStore
from inflight.windows.registry import WindowRegistry
from inflight.windows.table import ModelTable

CONFIG = Path(__file__).resolve().parents[1] / "config"
HEADERS = {"x-compaction-context-limit": "32000", "x-compaction-strategy": "truncate,prune,trim"}
SIZES = ((40, 2000), (400, 2000), (2000, 1000))  # (tool rounds, output chars)


def session(rounds: int, size: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(rounds):
        call = {"name": "bash", "arguments": f'{{"cmd": "cat f{i}.py"}}'}
        messages += [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": f"c{i}", "type": "function", "function": call}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i} " * (size // 8)},
            {"role": "assistant", "content": f"Read f{i}.py."},
        ]  # fmt: skip
    return {"model": "gpt-4o", "messages": messages}


async def measure(runs: int = 7) -> list[str]:
    table = ModelTable.load(CONFIG / "models.toml")
    counter = ChatTokenCounter(load_encodings(), table)
    settings = Settings(_env_file=None, database_url="none", config_dir=CONFIG)  # type: ignore[call-arg]
    services = {
        mode: CompactionService(settings, counter, WindowRegistry(table, None), ledger=mode)
        for mode in LedgerMode
    }
    store = NullStore()
    lines = []
    for rounds, size in SIZES:
        body = session(rounds, size)
        prepare: dict[LedgerMode, list[float]] = {mode: [] for mode in LedgerMode}
        row: list[float] = []
        cuts = 0
        for _ in range(runs):
            for mode, service in services.items():
                started = time.perf_counter()
                compacted = await service.prepare(ChatFormat(), HEADERS, body, "http://upstream")
                prepare[mode].append(time.perf_counter() - started)
                if mode is LedgerMode.META:
                    cuts = len(compacted.cuts)
                    exchange = Exchange(CHAT_API, "gpt-4o", False, b"", body, compacted=compacted)
                    started = time.perf_counter()
                    Ledger(mode, 60.0, UsageQueue(store), store).row_for(exchange)
                    row.append(time.perf_counter() - started)
        times = ", ".join(
            f"{mode.value} {statistics.median(v) * 1000:.1f} ms" for mode, v in prepare.items()
        )
        lines.append(
            f"{len(body['messages'])} messages, {cuts} cut: prepare {times}; "
            f"ledger row on the request path {statistics.median(row) * 1000:.2f} ms"
        )
    return lines


if __name__ == "__main__":
    for line in asyncio.run(measure()):
        print(line)
