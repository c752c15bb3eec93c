"""Which spans the next compaction event will cut, predicted before it happens (pure).

Summaries of these spans, made in the background, are the summary the event needs, or the prefix of
it that a rolling update extends (`bench/ahead.py` measures how often, offline).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inflight.compaction.rendering import Plan
from inflight.compaction.unit_costs import MessageCounter

# The plan of a history priced by a count function, with every other input of the request's
# own plan (so that the prediction is the plan the event will get, and resumes the replay the
# request's plan left in the replay cache).
Replan = Callable[[Sequence[Mapping[str, Any]], MessageCounter], Plan]

MAX_TURNS = 16  # turns a prediction grows the conversation by, at the most


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


def last_turn_tokens(messages: Sequence[Mapping[str, Any]], count: MessageCounter) -> int:
    """What the client's last turn (as `next_turn` shapes it) cost: the size of the turns a
    prediction grows the conversation by (at least a token a message)."""
    shape = next_turn(messages)
    start = max(0, len(messages) - len(shape))
    return max(len(shape), sum(count(m) for m in messages[start:]))


def next_event(
    messages: Sequence[Mapping[str, Any]],
    current: Plan,
    replan: Replan,
    trigger: int,
    count: MessageCounter,
    over: int = 0,
) -> Plan | None:
    """The plan of `messages` grown by turns like the last one until one triggers a compaction
    event (`current` is the plan of `messages`), when that event moves the cut; else None.
    `over`: tokens the turn that crosses the threshold adds on top (a bigger turn than the last).

    A session's turns tend to be alike, and the event's cut depends on how far past the
    threshold the turn that triggers it goes: so the prediction is the same at each request
    on the way to the threshold (the summary started at the first is the one the event needs),
    and the cut is at least what the smallest turn crossing the threshold would make."""
    last_turn = last_turn_tokens(messages, count)
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
    costs[id(grown[-1])] += over

    def cost(message: Mapping[str, Any]) -> int:
        found = costs.get(id(message))
        return count(message) if found is None else found

    nxt = replan([*messages, *grown], cost)
    if nxt.cut <= current.cut or not nxt.summarize or nxt.units[nxt.cut - 1].end > len(messages):
        return None  # no event, or one that would cut what the client has not sent yet
    return nxt


def next_events(
    messages: Sequence[Mapping[str, Any]],
    current: Plan,
    replan: Replan,
    trigger: int,
    count: MessageCounter,
    cuts: int,
) -> list[Plan]:
    """Up to `cuts` plans of the next event, each cutting elsewhere, the likeliest first: the
    turn that crosses the threshold going past it by 0, ½, 1 or 2 times the last turn (`over`).

    The cut of the next event depends on how far past the threshold the turn that triggers it
    goes, which the history does not tell; a bigger turn cuts further, by whole units.
    Summarising the few cuts a plausible overshoot gives covers more events than one
    (bench/ahead.py). Each is a pure function of the history, so every replica predicts the
    same spans (single-flight keeps one summary each)."""
    last_turn = last_turn_tokens(messages, count)
    found: list[Plan] = []
    for over in (0, last_turn // 2, last_turn, 2 * last_turn):
        nxt = next_event(messages, current, replan, trigger, count, over)
        if nxt is not None and all(nxt.cut != other.cut for other in found):
            found.append(nxt)
        if len(found) >= cuts:
            break
    return found
