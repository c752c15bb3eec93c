"""`inflight serve | stats | simulate | count`: the command line."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from app.settings import Settings


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _settings(overrides: dict[str, Any]) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise SystemExit(f"inflight: invalid configuration:\n{exc}") from exc


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.factory import create_app

    settings = _settings({"upstream_url": args.upstream, "config_dir": args.config})
    if not _is_loopback(args.host) and not settings.api_keys and not settings.allow_unauthenticated:
        print(
            f"inflight: refusing to listen on {args.host} with no INFLIGHT_API_KEYS: anyone who "
            "reaches this port could spend your upstream credits. Set INFLIGHT_API_KEYS, or "
            "INFLIGHT_ALLOW_UNAUTHENTICATED=true if the network is private.",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        proxy_headers=args.proxy_headers,
        forwarded_allow_ips=args.forwarded_allow_ips,
        timeout_graceful_shutdown=args.graceful_timeout,
        # Longer than any client pool keeps an idle connection (httpx and the openai SDK: 5 s),
        # so a client never reuses a connection at the instant the proxy closes it.
        timeout_keep_alive=75,
        log_level=args.log_level,
    )
    return 0


def _stats(args: argparse.Namespace) -> int:
    import httpx
    import orjson

    from app.stats_view import render_stats

    stats: dict[str, Any]
    if args.database_url:
        import asyncio

        from app.stores import open_store

        async def read() -> dict[str, Any]:
            store = open_store(args.database_url)
            await store.open()
            try:
                return await store.totals()
            finally:
                await store.close()

        stats = asyncio.run(read())
    else:
        headers = {"authorization": f"Bearer {args.key}"} if args.key else {}
        try:
            response = httpx.get(args.url.rstrip("/") + "/stats", headers=headers, timeout=10)
        except httpx.HTTPError as exc:
            print(f"inflight: cannot reach {args.url}: {exc}", file=sys.stderr)
            return 1
        if response.status_code != 200:
            print(f"inflight: {args.url}/stats answered {response.status_code}", file=sys.stderr)
            return 1
        stats = response.json()
    if args.json:
        print(orjson.dumps(stats, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_stats(stats, width=args.width), end="")
    return 0


def _counter() -> Any:
    from app.encodings import load_encodings
    from app.tokens import ChatTokenCounter

    return ChatTokenCounter(load_encodings())


def _count(args: argparse.Namespace) -> int:
    from pathlib import Path

    import orjson

    from app.limits import ModelTable, output_reserve
    from app.simulate import load_messages

    messages, model_in_file = load_messages(Path(args.file))
    model = args.model or model_in_file or "gpt-4o"
    body: dict[str, Any] = orjson.loads(Path(args.file).read_bytes())
    body = body if isinstance(body, dict) else {"messages": messages}
    counter = _counter()
    table = ModelTable.load(Path(args.config) / "models.toml")
    entry = table.lookup(model)
    window = entry.context_window if entry is not None else table.fallback_window
    tokens = counter.count_request(model, body)
    reserve = output_reserve(body, window)
    result = {
        "model": model,
        "prompt_tokens": tokens,
        "messages": len(messages),
        "context_limit": window,
        "limit_source": "table" if entry is not None else "fallback",
        "output_reserve": reserve,
        "usage_ratio": round(tokens / max(1, window - reserve), 4),
        "exact": counter.is_exact(model),
        "encoding": counter.encoding_name(model),
    }
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app.compaction.policy import parse_strategy
    from app.errors import InvalidControl
    from app.limits import ModelTable
    from app.simulate import load_messages, plot, simulate, window_for

    try:
        strategies = parse_strategy(args.strategy, "--strategy")
    except InvalidControl as exc:
        print(f"inflight: {exc.message}", file=sys.stderr)
        return 2
    counter = _counter()
    table = ModelTable.load(Path(args.config) / "models.toml")
    results = {}
    window = 0
    for name in args.traces:
        messages, model_in_file = load_messages(Path(name))
        model = args.model or model_in_file or "gpt-4o"
        window = window_for(model, table, args.context_limit)
        turns = simulate(messages, model, window, strategies, counter)
        results[Path(name).stem] = turns
        print(f"\n{name}: model {model}, window {window}, strategy {args.strategy}")
        print(f"{'turn':>5} {'msgs':>5} {'before':>8} {'after':>8}  {'reuse':>6}  applied")
        for t in turns:
            mark = " *" if t.event else ""
            over = "  OVER BUDGET" if t.over_budget else ""
            applied = ",".join(t.applied) or "-"
            print(
                f"{t.index:>5} {t.messages:>5} {t.tokens_before:>8} {t.tokens_after:>8}  "
                f"{t.prefix_reuse:>6.0%}  {applied}{mark}{over}"
            )
        events = sum(t.event for t in turns)
        mean = sum(t.prefix_reuse for t in turns[1:]) / max(1, len(turns) - 1)
        print(
            f"{len(turns)} requests, {events} compaction events (*), mean prefix reuse {mean:.0%}"
        )
    if args.plot:
        try:
            plot(results, window, Path(args.plot))
        except ImportError:
            print(
                "inflight: --plot needs matplotlib: pip install 'inflight[plot]'", file=sys.stderr
            )
            return 2
        print(f"plot written to {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inflight", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8787)
    serve.add_argument("--upstream", help="upstream base URL (INFLIGHT_UPSTREAM_URL)")
    serve.add_argument("--config", help="config directory (INFLIGHT_CONFIG_DIR)")
    serve.add_argument("--proxy-headers", action="store_true", help="trust X-Forwarded-*")
    serve.add_argument("--forwarded-allow-ips", default="127.0.0.1")
    serve.add_argument("--graceful-timeout", type=float, default=30.0)
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(handler=_serve)

    stats = sub.add_parser("stats", help="usage and compaction totals as a table")
    stats.add_argument("--url", default="http://127.0.0.1:8787", help="a running proxy")
    stats.add_argument("--key", default=None, help="proxy API key, if keys are configured")
    stats.add_argument("--database-url", help="read the store directly instead")
    stats.add_argument("--json", action="store_true", help="print the raw JSON")
    stats.add_argument("--width", type=int, default=80)
    stats.set_defaults(handler=_stats)

    count = sub.add_parser("count", help="token count of a request body or message list")
    count.add_argument("file")
    count.add_argument("--model")
    count.add_argument("--config", default="config")
    count.set_defaults(handler=_count)

    sim = sub.add_parser("simulate", help="replay transcripts through the compaction engine")
    sim.add_argument("traces", nargs="+")
    sim.add_argument("--model")
    sim.add_argument("--context-limit", type=int)
    sim.add_argument("--strategy", default="auto")
    sim.add_argument("--config", default="config")
    sim.add_argument("--plot", help="write a PNG of tokens per turn (needs matplotlib)")
    sim.set_defaults(handler=_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
