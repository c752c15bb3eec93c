"""The hostile-field fuzz of tests/asgi/test_hostile.py, run longer: `python -m bench.fuzz_fields
--examples N` sends N requests for each route × restore × stream (fields of the well-formed
body set to null, numbers, strings, objects, arrays, booleans, huge ints; small windows) and
prints every distinct problem (anything but the upstream's answer or a 400 in the route's
envelope) with a count and its smallest body; it exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from tests.support.hostile_fields import SWITCHES, Case, cases, fuzzed_proxy, problem, send


def draw_cases(examples: int, seed: int) -> list[Case]:
    """`examples` cases for each switch, drawn by hypothesis (no shrinking: nothing fails)."""
    drawn: list[Case] = []
    for route, restore, stream in SWITCHES:

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=seed == 0,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases(route, restore, stream))
        def collect(case: Case) -> None:
            drawn.append(case)

        collect()
    return drawn


async def run(drawn: list[Case]) -> tuple[Counter[str], dict[str, Case]]:
    """Each case through one proxy; the problems found, counted, with their smallest case."""
    found: Counter[str] = Counter()
    smallest: dict[str, Case] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with fuzzed_proxy(Path(tmp)) as client:
            for case in drawn:
                what = problem(case, await send(client, case))
                if what is None:
                    continue
                key = f"{case.route} restore={'on' if case.restore else 'off'}: {what[:160]}"
                found[key] += 1
                size = len(json.dumps(case.body))
                if key not in smallest or size < len(json.dumps(smallest[key].body)):
                    smallest[key] = case
    return found, smallest


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_fields")
    parser.add_argument("--examples", type=int, default=500, help="requests per switch")
    parser.add_argument("--seed", type=int, default=1, help="0: the same cases every run")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the proxy logs every 500 it answers
    drawn = draw_cases(args.examples, args.seed)
    found, smallest = asyncio.run(run(drawn))
    print(f"{len(drawn)} requests over {len(SWITCHES)} route × restore × stream switches")
    for key, count in found.most_common():
        case = smallest[key]
        print(f"\n{count} × {key}\n  stream={case.stream} limit={case.limit}")
        print("  " + json.dumps(case.body)[:2000])
    print(f"\n{sum(found.values())} problems, {len(found)} distinct")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
