"""The shared agent transcripts (../shared/traces), read-only, and their request points."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def load() -> list[tuple[str, list[dict[str, Any]]]]:
    if not TRACES.is_dir():
        raise SystemExit(f"no transcripts at {TRACES}")
    return [(p.stem, json.loads(p.read_text())["messages"]) for p in sorted(TRACES.glob("*.json"))]


def request_points(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each k where `messages[:k]` is a request (the assistant speaks next)."""
    return [
        k
        for k in range(1, len(messages) + 1)
        if messages[k - 1].get("role") != "assistant"
        and (k == len(messages) or messages[k].get("role") == "assistant")
    ]
