"""`inflight stats`: the `/stats` JSON as a terminal table with bars (pure: returns text)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(value: float, total: float, width: int) -> str:
    """A horizontal bar of `width` cells for value/total, with eighth-cell precision."""
    if total <= 0 or width <= 0:
        return " " * max(width, 0)
    eighths = round(min(1.0, max(0.0, value / total)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (BLOCKS[part] if part else "")
    return text.ljust(width)


def _n(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def percent(share: float) -> str:
    """A share as a percentage, capped: a runaway value prints as `>999%`, not `1549%`."""
    return ">999%" if share > 9.99 else f"{share:.0%}"


def _saved_line(stats: Mapping[str, Any], bar_width: int) -> str:
    """Tokens removed by compaction against the tokens before it: both the proxy's estimates."""
    saved = stats.get("tokens_saved", 0)
    before = stats.get("tokens_estimated_before", 0)
    line = f"saved (estimate) {_n(saved):>10}"
    if before:
        share = saved / before
        line += f"   {bar(share, 1, bar_width)} {percent(share)} of {_n(before)} est. before"
    return line


def _outcome_lines(stats: Mapping[str, Any]) -> list[str]:
    lines = []
    outcomes = stats.get("by_outcome", {})
    if outcomes:
        lines.append("outcomes         " + _by_reason(outcomes))
    passthrough = stats.get("passthrough", {})
    if passthrough.get("requests"):
        routes = _by_reason(passthrough.get("routes", {}))
        lines.append(f"passthrough      {passthrough['requests']:>10}   {routes}")
    return lines


def usd(value: float) -> str:
    """Dollars: four decimals under $1 (a request costs fractions of a cent), else two."""
    sign = "-" if value < 0 else ""
    return f"{sign}${abs(value):,.4f}" if abs(value) < 1 else f"{sign}${abs(value):,.2f}"


def _cost_lines(stats: Mapping[str, Any]) -> list[str]:
    """Dollars at list prices, actual against the uncompacted baseline (DESIGN.md §9)."""
    cost = stats.get("cost")
    if not cost:
        return []
    baseline, saved = cost.get("baseline", 0.0), cost.get("saved", 0.0)
    share = f"   {percent(saved / baseline)} of the baseline" if baseline > 0 else ""
    lines = [
        "",
        "dollars (list prices)       spent   without inflight      saved",
        f"  {'all models':<22}{usd(cost.get('actual', 0.0)):>10}{usd(baseline):>19}"
        f"{usd(saved):>11}{share}",
    ]
    models = stats.get("models", {})
    by_spend = sorted(models.items(), key=lambda kv: -kv[1].get("cost", {}).get("actual", 0))
    for name, entry in by_spend:
        c = entry.get("cost")
        if c and (c.get("actual") or c.get("baseline")):
            lines.append(
                f"  {name[:21]:<22}{usd(c['actual']):>10}{usd(c['baseline']):>19}"
                f"{usd(c['saved']):>11}"
            )
    lines.append(
        f"  of which summary calls {usd(cost.get('summaries', 0.0))}; "
        f"unpriced requests {cost.get('unpriced_requests', 0)}"
    )
    return lines + _ledger_lines(stats)


def _ledger_lines(stats: Mapping[str, Any]) -> list[str]:
    """From the ledger's rows: the realised net of compaction events, and the references of
    what the compacted requests cut (DESIGN.md §14, §16)."""
    ledger = stats.get("ledger")
    if not ledger or not ledger.get("rows"):
        return []
    return [
        f"  realised net of {ledger['realised_events']} compaction events "
        f"{usd(ledger['realised_net'])} over {ledger['realised_turns']} requests after them",
        f"references cut     {ledger['facts_retained']} retained, "
        f"{ledger['facts_restorable']} restorable, {ledger['facts_lost']} lost "
        f"({ledger['lost_per_event']} lost per event, {ledger['rows_with_facts']} events)",
    ]


def _by_reason(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _summary_lines(stats: Mapping[str, Any]) -> list[str]:
    """Summary calls of this proxy process: how many failed and how many requests fell back."""
    summaries = stats.get("summaries", {})
    if not summaries.get("calls") and not summaries.get("fallbacks"):
        return []
    failures, fallbacks = summaries.get("failures", {}), summaries.get("fallbacks", {})
    lines = ["", f"summary calls since start {summaries.get('calls', 0)}"]
    if failures:
        lines.append(f"  failed      {sum(failures.values()):>6}   {_by_reason(failures)}")
    if fallbacks:
        lines.append(f"  fell back   {sum(fallbacks.values()):>6}   {_by_reason(fallbacks)}")
    return lines


def _written(stats: Mapping[str, Any]) -> str:
    """Prompt tokens written to the upstream's cache (Anthropic bills them apart), when any."""
    written = stats.get("tokens_cache_write", 0)
    return f"   cache writes {_n(written)}" if written else ""


def render_stats(stats: Mapping[str, Any], width: int = 80) -> str:
    bar_width = max(10, width - 50)
    lines = ["inflight usage", "=" * min(width, 60)]
    lines += [
        f"requests         {stats.get('requests', 0):>10}   "
        f"summary calls {stats.get('summary_calls', 0)}",
        *_outcome_lines(stats),
        f"tokens in        {_n(stats.get('tokens_in', 0)):>10}   "
        f"cached {_n(stats.get('tokens_cached', 0))}{_written(stats)}",
        f"tokens out       {_n(stats.get('tokens_out', 0)):>10}",
        _saved_line(stats, bar_width),
        *_cost_lines(stats),
        "",
        f"{'model':<28}{'requests':>9}{'tokens in':>11}  share of tokens in",
    ]
    models = stats.get("models", {})
    top = max((m.get("tokens_in", 0) for m in models.values()), default=0)
    for name, entry in sorted(models.items(), key=lambda kv: -kv[1].get("tokens_in", 0)):
        lines.append(
            f"{name[:27]:<28}{entry.get('requests', 0):>9}{_n(entry.get('tokens_in', 0)):>11}  "
            f"{bar(entry.get('tokens_in', 0), top, bar_width)}"
        )
    windows = {n: e["recent_window_share"] for n, e in models.items() if "recent_window_share" in e}
    if windows:
        lines += ["", "window used by recent requests (after compaction)"]
        for name, value in sorted(windows.items()):
            lines.append(f"  {name[:26]:<26} {bar(value, 1, bar_width)} {percent(value)}")
    compactions = stats.get("compactions", {})
    if compactions:
        lines += ["", "compactions by strategy"]
        most = max(compactions.values())
        for name, count in sorted(compactions.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:<26} {bar(count, most, bar_width)} {count}")
    lines += _summary_lines(stats)
    factors = stats.get("calibration", {})
    if factors:
        lines += ["", "token calibration factors"]
        lines += [f"  {name[:26]:<26} ×{value:.3f}" for name, value in sorted(factors.items())]
    return "\n".join(lines) + "\n"
