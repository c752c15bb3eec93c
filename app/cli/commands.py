"""`inflight serve | stats | simulate | count`: the command line."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from inflight.settings import Settings, config_file, packaged_config_dir

if TYPE_CHECKING:
    from inflight.tokens.counter import TokenCounter


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _settings(overrides: dict[str, Any]) -> Settings:
    """Settings from the environment and the flags; a bad value exits with one line per error
    naming the variable, never a traceback."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = [
            (f"INFLIGHT_{'_'.join(map(str, e['loc'])).upper()}" if e["loc"] else "configuration")
            + ": "
            + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        ]
        raise SystemExit("\n".join(f"inflight: {p}" for p in problems)) from None


def _config_dir(value: str | None) -> Path | None:
    """`--config` (else `INFLIGHT_CONFIG_DIR`) of `count` and `simulate`: an existing directory,
    or None for the packaged defaults."""
    value = value or os.environ.get("INFLIGHT_CONFIG_DIR") or None
    if value is None:
        return None
    path = Path(value)
    if not path.is_dir():
        raise SystemExit(f"inflight: config directory not found: {path.absolute()}")
    return path


def _listen_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from inflight.factory import create_app
    from inflight.http.protocol import with_deadlines

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
    try:
        app = create_app(settings)
    except (OSError, ValueError) as exc:  # a config file that cannot be read or parsed
        print(f"inflight: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("app.startup").info("listening on %s", _listen_url(args.host, args.port))
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        proxy_headers=args.proxy_headers,
        forwarded_allow_ips=args.forwarded_allow_ips,
        timeout_graceful_shutdown=args.graceful_timeout,
        # Longer than any client pool keeps an idle connection (httpx and the openai SDK: 5 s),
        # so a client never reuses a connection at the instant the proxy closes it.
        timeout_keep_alive=75,
        # a request's headers within INFLIGHT_HEADER_READ_TIMEOUT s (slowloris), its body within
        # INFLIGHT_BODY_READ_TIMEOUT s (the routes answer 408), a client reading nothing for
        # INFLIGHT_CLIENT_STALL_TIMEOUT s dropped
        http=with_deadlines(settings.header_read_timeout, settings.client_stall_timeout),
        log_level=args.log_level,
    )
    return 0


def _stats(args: argparse.Namespace) -> int:
    import httpx
    import orjson

    from inflight.cli.stats_table import render_stats

    stats: dict[str, Any]
    if args.database_url:
        import asyncio

        from inflight.apis.registry import route_names
        from inflight.usage.records import name_apis
        from inflight.usage.stores import open_store

        async def read() -> dict[str, Any]:
            store = open_store(args.database_url)
            await store.open()
            try:
                return name_apis(await store.totals(), route_names())
            finally:
                await store.close()

        from inflight.errors import StoreUnavailable

        try:
            stats = asyncio.run(read())
        except StoreUnavailable as exc:
            print(f"inflight: the usage store is unavailable: {exc.message}", file=sys.stderr)
            return 1
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
    from inflight.tokens.counter import ChatTokenCounter
    from inflight.tokens.encodings import load_encodings

    return ChatTokenCounter(load_encodings())


def _count(args: argparse.Namespace) -> int:
    import orjson

    from inflight.cli.simulate import load_messages
    from inflight.windows.registry import WindowRegistry
    from inflight.windows.table import ModelTable, output_reserve

    messages, model_in_file = load_messages(Path(args.file))
    model = args.model or model_in_file or "gpt-4o"
    body: dict[str, Any] = orjson.loads(Path(args.file).read_bytes())
    body = body if isinstance(body, dict) else {"messages": messages}
    counter = _counter()
    table = ModelTable.load(config_file(_config_dir(args.config), "models.toml"))
    known = WindowRegistry(table, discover=None).known_window(model, "")
    window = known.tokens
    tokens = counter.count_request(model, body)
    reserve = output_reserve(body, window)
    result = {
        "model": model,
        "prompt_tokens": tokens,
        "messages": len(messages),
        "context_limit": window,
        "limit_source": known.source.value,
        "output_reserve": reserve,
        "usage_ratio": round(tokens / max(1, window - reserve), 4),
        "exact": counter.is_exact(model),
        "encoding": counter.encoding_name(model),
    }
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from inflight.cli.simulate import load_messages, plot, simulate
    from inflight.errors import InvalidControl
    from inflight.strategies import parse_strategy
    from inflight.windows.registry import WindowRegistry
    from inflight.windows.table import ModelTable

    try:
        strategies = parse_strategy(args.strategy, "--strategy")
    except InvalidControl as exc:
        print(f"inflight: {exc.message}", file=sys.stderr)
        return 2
    counter = _counter()
    table = ModelTable.load(config_file(_config_dir(args.config), "models.toml"))
    windows = WindowRegistry(table, discover=None)
    results = {}
    window = 0
    for name in args.traces:
        messages, model_in_file = load_messages(Path(name))
        model = args.model or model_in_file or "gpt-4o"
        window = windows.known_window(model, "", setting_limit=args.context_limit).tokens
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
        if args.compare:
            _print_comparison(messages, model, window, counter)
        if args.retention:
            from inflight.cli.retention import offline_table

            print("\nreference retention (DESIGN.md §14):")
            print(offline_table(messages, model, window, counter))
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


def _print_comparison(
    messages: Sequence[Mapping[str, Any]], model: str, window: int, counter: TokenCounter
) -> None:
    """`simulate --compare`: inflight's replay beside re-trimming every request."""
    from inflight.cli.simulate import compare

    print("\nagainst re-trimming every request (no summaries; a broken request lost its")
    print("current turn, orphaned a tool call or result, or did not fit):")
    print(f"{'':<15} {'reuse':>6} {'events':>7} {'broken':>7}")
    for row in compare(messages, model, window, counter):
        print(f"{row.name:<15} {row.reuse:>6.0%} {row.events:>7} {row.broken:>4} of {row.requests}")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's default in its help; where the default is "unset", the help says what then
    happens instead of printing `(default: None)`."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def _subcommand(sub: Any, name: str, help_text: str, handler: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text, formatter_class=_HelpFormatter
    )
    parser.set_defaults(handler=handler)
    return parser


def _config_help() -> str:
    return (
        "directory with models.toml, summary_prompt.md, prices.toml; a file it lacks comes from "
        f"the packaged defaults (default: $INFLIGHT_CONFIG_DIR, else {packaged_config_dir()})"
    )


def _add_serve(sub: Any) -> None:
    serve = _subcommand(sub, "serve", "run the proxy", _serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8787, help="port to listen on")
    serve.add_argument(
        "--upstream",
        help="upstream base URL, ending in /v1 (default: $INFLIGHT_UPSTREAM_URL, else "
        f"{Settings.model_fields['upstream_url'].default})",
    )
    serve.add_argument("--config", help=_config_help())
    serve.add_argument(
        "--proxy-headers",
        action="store_true",
        help="trust X-Forwarded-For/-Proto from --forwarded-allow-ips (default: off)",
    )
    serve.add_argument(
        "--forwarded-allow-ips",
        default="127.0.0.1",
        help="comma list of proxy addresses whose X-Forwarded-* are trusted ('*': any)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=float,
        default=30.0,
        help="seconds streams in flight may finish after SIGTERM",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level of the proxy and uvicorn",
    )


def _add_stats(sub: Any) -> None:
    stats = _subcommand(sub, "stats", "usage and compaction totals as a table", _stats)
    stats.add_argument("--url", default="http://127.0.0.1:8787", help="a running proxy")
    stats.add_argument(
        "--key", help="proxy API key, when INFLIGHT_API_KEYS is set (default: none sent)"
    )
    stats.add_argument(
        "--database-url",
        help="read this usage store directly instead of asking the proxy (default: ask --url)",
    )
    stats.add_argument(
        "--json", action="store_true", help="print the raw JSON of /stats (default: a table)"
    )
    stats.add_argument("--width", type=int, default=80, help="width of the table in columns")


def _add_count(sub: Any) -> None:
    count = _subcommand(sub, "count", "token count of a request body or message list", _count)
    count.add_argument("file", help="a JSON request body, or a JSON list of messages")
    count.add_argument("--model", help="model to count for (default: the file's, else gpt-4o)")
    count.add_argument("--config", help=_config_help())


def _add_simulate(sub: Any) -> None:
    sim = _subcommand(
        sub, "simulate", "replay transcripts through the compaction engine", _simulate
    )
    sim.add_argument("traces", nargs="+", help="transcript files (JSON with 'messages')")
    sim.add_argument("--model", help="model to plan for (default: the file's, else gpt-4o)")
    sim.add_argument(
        "--context-limit",
        type=int,
        help="window to assume (default: the model's from models.toml, else the fallback)",
    )
    sim.add_argument(
        "--strategy",
        default="auto",
        help="auto, none, or a comma list of truncate, prune, trim, middle-out, summarize",
    )
    sim.add_argument("--config", help=_config_help())
    sim.add_argument(
        "--compare",
        action="store_true",
        help="also replay LangChain's/LiteLLM's trim_messages and keep-newest-units re-trimming "
        "every request, and print prefix reuse, compaction events and broken requests beside "
        "inflight's (default: off)",
    )
    sim.add_argument(
        "--retention",
        action="store_true",
        help="also print, per strategy, the share of the references each event cut that the "
        "conversation uses again which stay retained, restorable or lost (default: off)",
    )
    sim.add_argument(
        "--plot",
        help="write a PNG of tokens per turn to this path (needs matplotlib; default: no plot)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inflight", description=__doc__, formatter_class=_HelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_stats(sub)
    _add_count(sub)
    _add_simulate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
