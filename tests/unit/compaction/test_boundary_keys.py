"""Boundary keys resumed from a conversation's last request (issue 16): the keys of a span are
a hash of everything in it, so a long conversation hashed them all again on every request; the
keys of the last request are now resumed where its messages are the very objects a reused
parse hands on (app/proxy/reuse.py). They are always the keys hashed from scratch: for growing
conversations, retries, edits (new objects), and other conversations."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inflight.compaction.summary.rolling as rolling
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.summary.prompt import SummaryPrompt
from inflight.compaction.summary.rolling import KeyChains, boundary_keys
from inflight.strategies import StrategyName
from tests.support.conversations import agent_session, conversations, simple_count

PROMPT = SummaryPrompt("{transcript}{previous_summary}", "v1")
PIPELINE: tuple[StrategyName, ...] = ("truncate", "prune", "summarize")


def fresh(messages: list[dict[str, Any]], the_plan: Any, end: int | None = None) -> Any:
    """The keys hashed from scratch (no chain to resume)."""
    return boundary_keys(copy.deepcopy(messages), the_plan, "m", PROMPT, end)


@given(conversations(), st.data())
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
def test_resumed_keys_are_the_keys_from_scratch(
    messages: list[dict[str, Any]], data: st.DataObject
) -> None:
    budget = Budget(window=4096, reserve=512, threshold=0.8, target=0.5)
    chains = KeyChains()
    shared = copy.deepcopy(messages)  # one conversation's objects, as reused parses hand on
    end = 1
    while end < len(shared):
        end = min(len(shared), end + data.draw(st.integers(1, 4)))
        request = shared[:end]
        if data.draw(st.integers(0, 4)) == 0:  # an edit: new objects from some message on
            i = data.draw(st.integers(0, end - 1))
            request = [*request[:i], *copy.deepcopy(request[i:])]
            request[i] = {**request[i], "content": "edited"}
            shared[i:end] = request[i:end]
        the_plan = plan(request, PIPELINE, budget, simple_count, 0, 200)
        upto = data.draw(st.one_of(st.none(), st.integers(the_plan.head, len(the_plan.units))))
        resumed = boundary_keys(request, the_plan, "m", PROMPT, upto, chains)
        assert resumed == fresh(request, the_plan, upto)


def test_a_growing_conversation_hashes_only_what_it_adds(monkeypatch: Any) -> None:
    budget = Budget(window=16_384, reserve=1024, threshold=0.8, target=0.5)
    messages = agent_session(200, words=40)
    chains = KeyChains()
    hashed: list[int] = []
    real = rolling.orjson.dumps

    def dumps(value: Any, **kwargs: Any) -> bytes:
        hashed.append(1)
        return real(value, **kwargs)

    monkeypatch.setattr(rolling.orjson, "dumps", dumps)
    per_request = []
    for end in range(300, 360, 2):
        request = messages[:end]  # the same objects, as a reused parse hands them on
        the_plan = plan(request, PIPELINE, budget, simple_count, 0, 200)
        hashed.clear()
        keys = boundary_keys(request, the_plan, "m", PROMPT, len(the_plan.units) - 1, chains)
        per_request.append(len(hashed))
        assert len(keys) > 100
    assert per_request[0] > 200
    assert max(per_request[1:]) <= 8, per_request
