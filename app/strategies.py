"""The strategies' names (DESIGN.md §3) and the parser of a strategy setting or header: one
vocabulary for the settings, the per-request controls and the engine."""

from __future__ import annotations

from typing import Any, Literal, cast, get_args

from inflight.errors import InvalidControl

StrategyName = Literal["truncate", "prune", "trim", "middle-out", "summarize"]
STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)


def parse_strategy(value: Any, param: str) -> tuple[StrategyName, ...] | None:
    """`auto` → None, `none` → (), else a comma list of known strategies in order (an empty
    value is an error)."""
    if isinstance(value, list):
        items = value
    elif isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    else:
        raise InvalidControl(f"{param} must be a string", param=param)
    names = [str(v).strip().lower() for v in items if str(v).strip()]
    if not names:  # an empty value must not silently turn compaction off
        raise InvalidControl(
            f"{param} is empty; use auto, none, or a comma list of " + ", ".join(STRATEGIES),
            param=param,
        )
    if names == ["auto"]:
        return None
    if names == ["none"]:
        return ()
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise InvalidControl(
            f"{param}: unknown strategy {unknown[0]!r}; use auto, none, or a comma list of "
            + ", ".join(STRATEGIES),
            param=param,
        )
    return tuple(dict.fromkeys(cast(list[StrategyName], names)))
