"""`python -m bench`: the benchmark report, each figure measured side by side in one run.

Sections: added latency (inflight and LiteLLM vs a direct call), token accuracy and counting
cost, prefix reuse against re-trimming baselines (and as Responses and Messages requests), planning
cost, dollars at list prices, slow clients (slowloris, streams never read). The llama.cpp
sections (token accuracy, prompt-cache reuse, fact retention) run when `INFLIGHT_TEST_LLM_URL`
points at ../shared/local-llm.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from contextlib import ExitStack

from bench import (
    anthropic,
    cache,
    compaction,
    cost,
    cost_mode,
    facts,
    hot_path,
    latency,
    load,
    overhead,
    replicas,
    responses,
    retention,
    slow_clients,
    soak,
    summaries,
    summaries_load,
    token_accuracy,
)
from bench.litellm import ensure_installed, litellm_proxy
from bench.procs import bare_relay, bare_relay_process, fake_upstream, proxy, proxy_process
from inflight.proxy.upstream import POOL_SHARDS

SECTIONS = (
    "hot", "latency", "load", "tokens", "compaction", "summaries", "cost", "cache", "facts",
    "slow", "summaries-load", "replicas", "retention", "cost-mode", "soak",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("-n", type=int, default=300, help="requests per target and mode")
    parser.add_argument(
        "--passes",
        type=int,
        default=5,
        help="the hot path's passes per build (its ratios are the median pass's)",
    )
    parser.add_argument(
        "--soak-requests", type=int, default=40_000, help="the soak section's requests"
    )
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM comparison")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="run only these")
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="an earlier checkout of inflight (e.g. `git worktree add /tmp/before REF`): the "
        "hot path's before/after compares its build with this one (default: this build with "
        "the replay cache off)",
    )
    args = parser.parse_args()
    only = set(args.only or SECTIONS)
    print(f"# inflight benchmark (Python {platform.python_version()}, {os.cpu_count()} cores)\n")
    if "hot" in only:
        with ExitStack() as stack:
            upstream = stack.enter_context(fake_upstream())
            targets = {
                "direct": upstream,
                "bare relay": stack.enter_context(bare_relay(upstream)),
            }
            env = {"INFLIGHT_DATABASE_URL": "none", "INFLIGHT_CONTEXT_LIMIT": "131072"}
            before = proxy(upstream, env, root=args.before, replays=args.before is not None)
            targets["inflight before"] = stack.enter_context(before)
            targets["inflight"] = stack.enter_context(proxy(upstream, env))
            print("## The hot path: inflight against a bare relay as conversations grow\n")
            print(
                hot_path.added_latency(targets, n=args.n, earlier=args.before, rounds=args.passes)
                + "\n"
            )
            print(hot_path.http_clients(upstream) + "\n")
        print(hot_path.own_work(args.before) + "\n")
        print(hot_path.plan_work() + "\n")
        print(hot_path.cold_counting() + "\n")
        print(hot_path.event_plan_times() + "\n")
    if "latency" in only:
        litellm = None if args.no_litellm else ensure_installed()
        with ExitStack() as stack:
            upstream = stack.enter_context(fake_upstream())
            targets = {
                "bare relay (FastAPI + httpx)": stack.enter_context(bare_relay(upstream)),
                "inflight": stack.enter_context(proxy(upstream)),
            }
            if litellm is not None:
                targets["litellm"] = stack.enter_context(litellm_proxy(upstream, litellm))
            results = latency.measure(upstream, targets, n=args.n)
        print("## Added latency on loopback (fake upstream, 20-chunk streams)\n")
        print(latency.report(results) + "\n")
        print(overhead.report() + "\n")
    if "load" in only:
        with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
            upstream = stack.enter_context(fake_upstream())
            stored, pid = stack.enter_context(
                proxy_process(upstream, {"INFLIGHT_DATABASE_URL": f"sqlite:///{tmp}/usage.db"})
            )
            unrecorded, off_pid = stack.enter_context(
                proxy_process(upstream, {"INFLIGHT_DATABASE_URL": "none"})
            )
            relay, relay_pid = stack.enter_context(bare_relay_process(upstream))
            pooled, pooled_pid = stack.enter_context(
                bare_relay_process(upstream, pools=POOL_SHARDS)
            )
            print("## Throughput, and the cost of recording usage\n")
            many = f"bare relay, {POOL_SHARDS} pools as inflight's"
            targets = {
                "direct": upstream,
                "bare relay (FastAPI + httpx)": relay,
                many: pooled,
                "inflight (usage in SQLite)": stored,
                "inflight (recording off)": unrecorded,
            }
            pids = {
                "bare relay (FastAPI + httpx)": relay_pid,
                many: pooled_pid,
                "inflight (usage in SQLite)": pid,
                "inflight (recording off)": off_pid,
            }
            print(load.throughput_report(targets, pids=pids) + "\n")
            print("## Streaming\n")
            print(load.chunk_delay_report({"direct": upstream, "inflight": stored}) + "\n")
            print(load.memory_report(stored, pid) + "\n")
    if "slow" in only:
        with fake_upstream() as upstream:
            print("## Slow clients: slowloris and streams nobody reads\n")
            print(slow_clients.slow_clients_report(upstream, n=args.n // 3 or 1) + "\n")
    if "soak" in only:
        with fake_upstream() as upstream:
            print("## Soak: memory and latency over many growing conversations\n")
            print(soak.report(upstream, args.soak_requests) + "\n")
    if "tokens" in only:
        print("## Token counts: estimate vs exact o200k (model `gpt-4o`)\n")
        print(token_accuracy.openai_report() + "\n")
        llm = os.environ.get("INFLIGHT_TEST_LLM_URL")
        if llm:
            print("## Token counts: estimate vs the llama.cpp server (Qwen2.5 tokenizer)\n")
            print(token_accuracy.llama_report(llm) + "\n")
        print("## Counting cost\n")
        print(token_accuracy.cost_report() + "\n")
    if "compaction" in only:
        print("## Prefix reuse on transcript replays (auto vs re-trimming every request)\n")
        print(compaction.prefix_reuse_report() + "\n")
        print("## Prefix reuse as Responses API requests, beside chat completions\n")
        print(responses.prefix_reuse_report() + "\n")
        print("## Prefix reuse as Anthropic Messages requests (Claude Code's shape), beside chat\n")
        print(anthropic.prefix_reuse_report() + "\n")
        print("## Planning cost\n")
        print(compaction.planning_cost_report() + "\n")
        print(compaction.scaling_report() + "\n")
        print(compaction.middle_out_report() + "\n")
    if "summaries" in only:
        print("## Summaries off the request path: waiting for each vs in the background\n")
        print(summaries.report() + "\n")
    if "summaries-load" in only:
        print("## Summaries under sustained load: the idle gate as a wall vs a bounded wait\n")
        print(summaries_load.report() + "\n")
    if "replicas" in only:
        print("## Replicas round robin against one proxy (transcripts, shared state in Redis)\n")
        print(replicas.report() + "\n")
    if "cost" in only:
        print("## Dollars on transcript replays: inflight vs uncompacted, caching counted\n")
        print(cost.report() + "\n")
    if "cost-mode" in only:
        print("## Compaction that pays: cost mode off and on (transcripts, 200k window)\n")
        print(cost_mode.report() + "\n")
    if "retention" in only:
        print("## Facts survive: reference retention per strategy (fake summariser)\n")
        print(retention.report() + "\n")
    llm = os.environ.get("INFLIGHT_TEST_LLM_URL")
    if "retention" in only and llm:
        print("## Facts survive: reference retention with the real model (llama.cpp)\n")
        print(retention.llm_report(llm) + "\n")
    if "cache" in only and llm:
        print("## Prompt-cache reuse on a real server (llama.cpp)\n")
        print(cache.report(llm) + "\n")
    if "facts" in only and llm:
        print("## Fact retention: summarize vs trim (real model)\n")
        print(facts.retention(llm) + "\n")
        print("## Facts answered: trim, summarize, each with and without restore (real model)\n")
        print(facts.answers(llm) + "\n")


if __name__ == "__main__":
    main()
