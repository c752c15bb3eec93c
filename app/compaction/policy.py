"""Per-request compaction controls (headers, body `compaction`, OpenRouter `transforms`) and
the budget they imply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inflight.compaction.cost_mode import CostRule
from inflight.compaction.pins import BadPin, Pin, parse_pins
from inflight.errors import InvalidControl
from inflight.strategies import StrategyName, parse_strategy

HEADER_PREFIX = "x-compaction-"
# Read where they apply, not here: the body shape of `/v1/compaction/*` (DESIGN.md §8).
OTHER_HEADERS = frozenset({"x-compaction-format"})
_BODY_KEYS = {
    "strategy": "x-compaction-strategy",
    "context_limit": "x-compaction-context-limit",
    "threshold": "x-compaction-threshold",
    "target": "x-compaction-target",
    "summary_model": "x-compaction-summary-model",
    "protect_tools": "x-compaction-protect-tools",
    "restore": "x-compaction-restore",
    "summary_wait": "x-compaction-summary-wait",
    "pin": "x-compaction-pin",
    "for_cost": "x-compaction-for-cost",
}


@dataclass(frozen=True, slots=True)
class Controls:
    """What one request asked for; None means "use the setting"."""

    strategies: tuple[StrategyName, ...] | None = None  # None: auto; () : none
    context_limit: int | None = None
    threshold: float | None = None
    target: float | None = None
    summary_model: str | None = None
    protect_tools: frozenset[str] | None = None  # tool names whose outputs are kept (§11)
    restore: bool | None = None  # offer the model `inflight_restore` (§11)
    summary_wait: bool | None = None  # a compaction event waits for its summary (§12)
    pins: tuple[Pin, ...] | None = None  # text kept verbatim beside a stand-in (§14)
    for_cost: bool | None = None  # compact under the threshold when it pays (§16)


@dataclass(frozen=True, slots=True)
class Budget:
    """Window minus output reserve, and the hysteresis band inside it (DESIGN.md §4)."""

    window: int
    reserve: int
    threshold: float
    target: float
    cost: CostRule | None = None  # cost mode (§16): events also when a cut pays

    @property
    def budget(self) -> int:
        return max(1, self.window - self.reserve)

    @property
    def calm(self) -> int:
        """The largest prompt no event can touch: the trigger, or lower in cost mode."""
        if self.cost is None:
            return self.trigger
        return min(self.trigger, self.cost.calm(self.goal))

    @property
    def trigger(self) -> int:
        return int(self.threshold * self.budget)

    @property
    def goal(self) -> int:
        return int(self.target * self.budget)


# No model has a window near this; a larger "window" is a mistake, not a request to honour.
MAX_CONTEXT_LIMIT = 100_000_000


def _limit(value: Any, param: str) -> int:
    if isinstance(value, bool):
        raise InvalidControl(f"{param} must be a positive integer", param=param)
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        number = None
    if number is None or number <= 0:
        raise InvalidControl(f"{param} must be a positive integer", param=param)
    if number > MAX_CONTEXT_LIMIT:
        raise InvalidControl(f"{param} must be at most {MAX_CONTEXT_LIMIT:,}", param=param)
    return number


def _fraction(value: Any, param: str) -> float:
    if isinstance(value, bool):
        raise InvalidControl(f"{param} must be a number in (0, 1]", param=param)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not 0 < number <= 1:
        raise InvalidControl(f"{param} must be a number in (0, 1]", param=param)
    return number


_TRUE = frozenset({"true", "on", "1", "yes"})
_FALSE = frozenset({"false", "off", "0", "no"})


def _switch(value: Any, param: str, words: str) -> bool:
    """A boolean control: a JSON boolean, or one of the words (any case)."""
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise InvalidControl(f"{param} must be {words}", param=param)


def _names(value: Any, param: str) -> frozenset[str]:
    """A comma list (or array) of tool names; empty means none."""
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, list):
        items = value
    else:
        raise InvalidControl(f"{param} must be a comma list of tool names", param=param)
    if not all(isinstance(v, str) for v in items):
        raise InvalidControl(f"{param} must be a comma list of tool names", param=param)
    return frozenset(v.strip() for v in items if v.strip())


# The body keys that carry controls; they never reach the upstream.
CONTROL_KEYS = ("transforms", "compaction")


def parse_controls(
    headers: Mapping[str, str], body: Mapping[str, Any]
) -> tuple[Controls, dict[str, Any]]:
    """Controls from headers (lower-cased names) and the body; headers win over the body.

    `body` is not changed: the second value is the body to forward, without the control keys
    `compaction` and `transforms` (the same object when it holds neither).
    """
    raw = _body_controls(body)
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith(HEADER_PREFIX):
            if lower not in _BODY_KEYS.values() and lower not in OTHER_HEADERS:
                raise InvalidControl(f"unknown header {name}", param=name)
            raw[lower] = (value, name)
    if any(k in body for k in CONTROL_KEYS):
        return _controls(raw), {k: v for k, v in body.items() if k not in CONTROL_KEYS}
    return _controls(raw), body if isinstance(body, dict) else dict(body)


def _body_controls(body: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The raw control values the body carries (`transforms`, `compaction`), by header name."""
    raw: dict[str, tuple[Any, str]] = {}
    if "transforms" in body:
        transforms = body["transforms"]
        if not isinstance(transforms, list) or not all(isinstance(t, str) for t in transforms):
            raise InvalidControl("transforms must be an array of strings", param="transforms")
        unknown = [t for t in transforms if t != "middle-out"]
        if unknown:
            raise InvalidControl(
                f"transforms: unsupported transform {unknown[0]!r} (only 'middle-out')",
                param="transforms",
            )
        raw["x-compaction-strategy"] = ("middle-out" if transforms else "none", "transforms")
    if "compaction" in body:
        section = body["compaction"]
        if not isinstance(section, dict):
            raise InvalidControl("compaction must be an object", param="compaction")
        for key, value in section.items():
            header = _BODY_KEYS.get(key)
            if header is None:
                raise InvalidControl(f"compaction.{key} is not a known field", param="compaction")
            if value is not None:
                raw[header] = (value, f"compaction.{key}")
    return raw


def _controls(raw: Mapping[str, tuple[Any, str]]) -> Controls:
    """Validate the raw values (by lower-cased header name) into `Controls`."""
    strategies = context_limit = threshold = target = summary_model = None
    if "x-compaction-strategy" in raw:
        strategies = parse_strategy(*raw["x-compaction-strategy"])
    if "x-compaction-context-limit" in raw:
        context_limit = _limit(*raw["x-compaction-context-limit"])
    if "x-compaction-threshold" in raw:
        threshold = _fraction(*raw["x-compaction-threshold"])
    if "x-compaction-target" in raw:
        target = _fraction(*raw["x-compaction-target"])
    if threshold is not None and target is not None and target > threshold:
        raise InvalidControl(
            "X-Compaction-Target must be <= X-Compaction-Threshold",
            param=raw["x-compaction-target"][1],
        )
    if "x-compaction-summary-model" in raw:
        value, param = raw["x-compaction-summary-model"]
        if not isinstance(value, str) or not value.strip():
            raise InvalidControl(f"{param} must be a non-empty string", param=param)
        summary_model = value.strip()
    protect = restore = wait = None
    if "x-compaction-protect-tools" in raw:
        protect = _names(*raw["x-compaction-protect-tools"])
    if "x-compaction-restore" in raw:
        restore = _switch(*raw["x-compaction-restore"], "on or off")
    if "x-compaction-summary-wait" in raw:
        wait = _switch(*raw["x-compaction-summary-wait"], "true or false")
    pins = for_cost = None
    if "x-compaction-for-cost" in raw:
        for_cost = _switch(*raw["x-compaction-for-cost"], "on or off")
    if "x-compaction-pin" in raw:
        value, param = raw["x-compaction-pin"]
        try:
            pins = parse_pins(value)
        except BadPin as exc:
            raise InvalidControl(f"{param}: {exc}", param=param) from exc
    return Controls(
        strategies=strategies,
        context_limit=context_limit,
        threshold=threshold,
        target=target,
        summary_model=summary_model,
        protect_tools=protect,
        restore=restore,
        summary_wait=wait,
        pins=pins,
        for_cost=for_cost,
    )


def resolve_pipeline(
    strategies: tuple[StrategyName, ...] | None, summarizer_available: bool
) -> tuple[StrategyName, ...]:
    """The ordered pipeline: `auto` is truncate, prune, then summarize if usable else trim."""
    if strategies is None:
        return ("truncate", "prune", "summarize" if summarizer_available else "trim")
    return strategies
