"""The `cost` object of `/stats` (DESIGN.md §9), in total and per model, from summed records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

DIGITS = 9  # nano-dollars: one gpt-5-nano token costs $0.00000005


@dataclass(slots=True)
class CostTally:
    """Sums of one scope (all traffic, or one model)."""

    actual: float = 0.0
    baseline: float = 0.0
    summaries: float = 0.0
    unpriced_requests: int = 0
    saved_by_fit: float = 0.0  # baseline less actual of requests cut to fit the window
    saved_by_cost_mode: float = 0.0  # ... of requests only cost mode cut (DESIGN.md §16)

    def add(
        self, kind: str, actual: float, baseline: float, unpriced: int, cut_for: str = ""
    ) -> None:
        self.actual += actual
        if kind == "summary":
            self.summaries += actual  # a cost of compaction: in `actual`, never in `baseline`
            return
        self.baseline += baseline
        self.unpriced_requests += unpriced
        if cut_for == "fit":
            self.saved_by_fit += baseline - actual
        elif cut_for == "cost":
            self.saved_by_cost_mode += baseline - actual

    def as_json(self) -> dict[str, Any]:
        return {
            "currency": "USD",
            "actual": round(self.actual, DIGITS),
            "baseline": round(self.baseline, DIGITS),
            "saved": round(self.baseline - self.actual, DIGITS),
            "summaries": round(self.summaries, DIGITS),
            "saved_by_fit": round(self.saved_by_fit, DIGITS),
            "saved_by_cost_mode": round(self.saved_by_cost_mode, DIGITS),
            "unpriced_requests": self.unpriced_requests,
        }


def add_costs(stats: dict[str, Any], rows: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """Put `cost` into `stats` and each of its `models`; `rows` are (model, kind, cost,
    baseline cost, records without a price, why compaction cut or '') sums by model, kind and
    why compaction cut."""
    total = CostTally()
    by_model: dict[str, CostTally] = {}
    for model, kind, actual, baseline, unpriced, cut_for in rows:
        values = (str(kind), float(actual), float(baseline), int(unpriced), str(cut_for or ""))
        total.add(*values)
        by_model.setdefault(str(model), CostTally()).add(*values)
    stats["cost"] = total.as_json()
    for name, entry in stats.get("models", {}).items():
        entry["cost"] = by_model.get(name, CostTally()).as_json()
    return stats
