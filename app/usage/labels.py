"""The model names `/metrics` and `/stats` show: a bounded set, since clients choose them. The
models the operator configured (`models.toml`) or priced (`prices.toml`) by name, a few others
(`INFLIGHT_METRICS_TOP_MODELS`), and `other` for the rest."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

OTHER = "other"
_GLOB = frozenset("*?[")
DIGITS = 9  # sums of dollars keep nano-dollars (app/usage/costs.py)


def literal_names(patterns: Iterable[str]) -> frozenset[str]:
    """The names among config patterns (globs like `gpt-4o*` name no one model)."""
    return frozenset(p for p in patterns if p and not _GLOB & set(p))


class ModelLabels:
    """Maps a client's model name to its label. A Prometheus series cannot be renamed once it
    exists, so besides the named models the first `top` other names seen keep their own label
    and every later one is `other`: at most `len(known) + top + 1` label values, ever."""

    def __init__(self, known: Iterable[str], top: int) -> None:
        self._known = frozenset(known)
        self._top = top
        self._seen: set[str] = set()  # the admitted others, at most `top`

    def __call__(self, model: str) -> str:
        if model in self._known or model in self._seen:
            return model
        if len(self._seen) < self._top:
            self._seen.add(model)
            return model
        return OTHER

    def named(self, model: str) -> bool:
        """Whether `model` has a label of its own already (never admits it)."""
        return model in self._known or model in self._seen

    def named_only(self, table: Mapping[str, T]) -> dict[str, T]:
        """The entries of a per-model table whose model has a label of its own (for tables
        whose values cannot be summed into `other`, such as calibration factors)."""
        return {model: value for model, value in table.items() if self.named(model)}

    @property
    def size(self) -> int:
        """Label values handed out so far, `other` aside (bounded by known + top)."""
        return len(self._known) + len(self._seen)

    def fold(self, models: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """`/stats`' per-model table bounded the same way: the named models, the `top` busiest
        others (by requests), and the rest summed into `other`."""
        others = sorted(
            (m for m in models if m not in self._known),
            key=lambda m: (-int(models[m].get("requests", 0)), m),
        )
        kept = {m: models[m] for m in models if m in self._known}
        kept.update((m, models[m]) for m in others[: self._top])
        rest = [models[m] for m in others[self._top :]]
        if rest:
            folded = _sum_entries(rest)
            if OTHER in kept:  # a client's model really named "other"
                folded = _sum_entries([kept[OTHER], folded])
            kept[OTHER] = folded
        return kept


def _sum_entries(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-model entries summed field by field (nested objects too, such as `cost`); the
    ratios are recomputed or left out, never summed."""
    total: dict[str, Any] = {}
    for entry in entries:
        for key, value in entry.items():
            if isinstance(value, bool) or key in ("saved_share", "recent_window_share"):
                continue
            if isinstance(value, dict):
                total[key] = _sum_entries([total.get(key, {}), value])
            elif isinstance(value, int | float):
                total[key] = total.get(key, 0) + value
            else:
                total.setdefault(key, value)  # e.g. the currency
    for key, value in total.items():
        if isinstance(value, float):
            total[key] = round(value, DIGITS)
    if "tokens_estimated_before" in total:
        before = total["tokens_estimated_before"]
        total["saved_share"] = round(total.get("tokens_saved", 0) / before, 4) if before else 0.0
    return total
