"""Which span the next compaction event will cut, predicted before it happens (pure).

Plans are a pure function of the history, so the next event's cut can be computed before the
event: it is the cut of the conversation grown by the smallest turn that crosses the threshold.
The real event comes with a real turn, usually bigger, so it cuts at least as far (often
exactly as far); a summary of the predicted span, made in the background, is then the summary
the event needs, or the prefix of it that a rolling update extends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.compaction.planner import MessageCounter, Plan

# The plan of a history priced by a count function, with every other input of the request's
# own plan (so that the prediction is the plan the event will get, and resumes the replay the
# request's plan left in the replay cache).
Replan = Callable[[Sequence[Mapping[str, Any]], MessageCounter], Plan]

MAX_TURNS = 64  # turns a prediction grows the conversation by, at the most


def next_turn(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A stand-in for the turn the client sends next, shaped like its last one (from its last
    assistant message on: a tool round, or an answer and the user's reply) so that role order
    and pairing stay what they would be, with next to no content (nothing to truncate)."""
    last = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"),
        None,
    )
    if last is None:
        return [{"role": "assistant", "content": "."}, {"role": "user", "content": "."}]
    turn: list[dict[str, Any]] = []
    for message in messages[last:]:
        stub: dict[str, Any] = {**message, "content": "."}
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            stub["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": "{}"}}
                if isinstance(call, dict) and isinstance(call.get("function"), dict)
                else call
                for call in calls
            ]
        turn.append(stub)
    return turn


def next_event(
    messages: Sequence[Mapping[str, Any]],
    current: Plan,
    replan: Replan,
    trigger: int,
    count: MessageCounter,
) -> Plan | None:
    """The plan of `messages` grown by turns like the last one until one triggers a compaction
    event (`current` is the plan of `messages`), when that event moves the cut; else None.

    A session's turns tend to be alike, and the event's cut depends on how far past the
    threshold the turn that triggers it goes: so the prediction is the same at each request
    on the way to the threshold (the summary started at the first is the one the event needs),
    and the cut is at least what the smallest turn crossing the threshold would make."""
    shape = next_turn(messages)
    start = max(0, len(messages) - len(shape))
    last_turn = max(len(shape), sum(count(m) for m in messages[start:]))
    need = max(1, trigger - current.tokens_after + 1)
    turns = min(MAX_TURNS, -(-need // last_turn))  # ceil
    grown: list[dict[str, Any]] = []
    costs: dict[int, int] = {}
    for _ in range(turns):
        turn = next_turn(messages)
        for stub in turn:
            costs[id(stub)] = 1
        costs[id(turn[-1])] = last_turn - len(turn) + 1
        grown += turn
    if turns * last_turn < need:  # the turns would stop short: the last one goes over
        costs[id(grown[-1])] += need - turns * last_turn

    def cost(message: Mapping[str, Any]) -> int:
        found = costs.get(id(message))
        return count(message) if found is None else found

    nxt = replan([*messages, *grown], cost)
    return nxt if nxt.cut > current.cut and nxt.summarize else None
