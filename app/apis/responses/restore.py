"""Restore's dialect for OpenAI's Responses API: the tool as a flat `function` tool, calls as
`function_call` output items (answered by `call_id`), answers as `function_call_output` input
items, and the events of a stream. The API echoes the request's `tools` in every response
object, so the proxy's tool is taken out of what the client sees (JSON and stream events)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inflight.proxy.restore import (
    DESCRIPTION,
    NO_ANSWER,
    PARAMETERS,
    TOOL_NAME,
    Kind,
    dicts_in,
    names_tool,
)
from inflight.proxy.sse_tap import Usage, without_tool

CARRIED = ("reasoning",)  # output items a restore turn passes back with its calls


class ResponsesDialect:
    """`POST /v1/responses`."""

    history = "input"
    call_key = "call_id"

    def tool(self) -> dict[str, Any]:
        return {
            "type": "function",
            "name": TOOL_NAME,
            "description": DESCRIPTION,
            "parameters": PARAMETERS,
        }

    def forbids(self, body: Mapping[str, Any]) -> bool:
        """`tool_choice: none`, or a client tool of that name."""
        return body.get("tool_choice") == "none" or names_tool(
            body.get("tools"), lambda t: t.get("name")
        )

    def calls(self, answer: Any) -> list[dict[str, Any]]:
        return [
            i
            for i in dicts_in(answer, "output")
            if i.get("type") == "function_call" and i.get("name") == TOOL_NAME
        ]

    def arguments(self, call: Mapping[str, Any]) -> Any:
        return call.get("arguments")

    def turn(self, answer: Any, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The answer's reasoning items (a reasoning model needs them with its calls) and the
        restore calls."""
        return [*(i for i in dicts_in(answer, "output") if i.get("type") in CARRIED), *calls]

    def lead(self, answer: Any) -> list[dict[str, Any]]:
        return []  # a reasoning item goes with the item after it, which the client never sees

    def led(self, answer: dict[str, Any], lead: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return answer

    def replies(self, answers: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [
            {"type": "function_call_output", "call_id": i, "output": text} for i, text in answers
        ]

    def usage(self, answer: Any) -> Usage | None:
        return Usage.from_json(answer.get("usage")) if isinstance(answer, dict) else None

    def with_usage(self, answer: dict[str, Any], total: Usage) -> dict[str, Any]:
        return {**answer, "usage": total.as_responses(answer.get("usage"))}

    def visible(self, answer: dict[str, Any]) -> dict[str, Any] | None:
        return without_tool(answer, TOOL_NAME)

    def kind(self, event: dict[str, Any]) -> Kind | None:
        kind = event.get("type")
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                return "tools"
            return None
        if kind == "response.output_text.delta":
            return "text" if event.get("delta") else None
        return "text" if kind in ("response.completed", "response.failed") else None

    def assemble(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """The response object of the final event (it holds every output item and usage)."""
        for event in reversed(events):
            response = event.get("response")
            kind = event.get("type")
            if isinstance(response, dict) and str(kind).startswith("response."):
                return response
        return {}

    def without_calls(self, answer: dict[str, Any]) -> dict[str, Any]:
        """The output without the calls; a `NO_ANSWER` message when no message or call is
        left."""
        output = [i for i in dicts_in(answer, "output") if not _restore_call(i)]
        if not any(i.get("type") in ANSWERING for i in output):
            output.append(no_answer(len(output)))
        return {**answer, "output": output}

    def stray(self, lead: Sequence[dict[str, Any]] = ()) -> StrayItems:
        return StrayItems()


ANSWERING = ("message", "function_call")  # output items that are an answer (not reasoning)


def _restore_call(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("name") == TOOL_NAME
    )


def no_answer(at: int) -> dict[str, Any]:
    """The message item that says the answer was nothing but restore calls."""
    text = {"type": "output_text", "text": NO_ANSWER, "annotations": []}
    return {"type": "message", "id": f"msg_inflight_{at}", "role": "assistant",
            "status": "completed", "content": [text]}  # fmt: skip


class StrayItems:
    """A Responses stream without `inflight_restore` calls: the events of those output items
    are dropped, the later items renumbered (`output_index`), and the response objects the
    events carry list only the rest; when no message or call is left, `response.completed`
    comes after a `NO_ANSWER` message item (its `added` and `done` events). From the first
    event dropped on, every event is renumbered (`sequence_number`: contiguous, as clients
    check)."""

    def __init__(self) -> None:
        self.index: dict[Any, int | None] = {}  # output index -> new index, None: dropped
        self.answering = False  # a message or client call item has been added
        self.seq: int | None = None  # once renumbering: the next event's sequence_number

    @property
    def _dropped(self) -> bool:
        return None in self.index.values()

    def _kept(self) -> int:
        return sum(v is not None for v in self.index.values())

    def wants(self, payload: bytes) -> bool:
        return (
            TOOL_NAME.encode() in payload
            or b"response.output_item.added" in payload
            or (
                self._dropped and (b'"output_index"' in payload or b"response.completed" in payload)
            )
            or (self.seq is not None and b'"sequence_number"' in payload)
        )

    def apply(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._edited(event)
        number = event.get("sequence_number")
        if self.seq is None and len(out) != 1 and isinstance(number, int):
            self.seq = number  # the first event dropped (or added): the rest take its number
        if self.seq is None:
            return out
        numbered = []
        for each in out:
            if each.get("sequence_number") != self.seq:
                each = {**each, "sequence_number": self.seq}
            numbered.append(each)
            self.seq += 1
        return numbered

    def _edited(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        at = event.get("output_index")
        if event.get("type") == "response.output_item.added" and at not in self.index:
            item = event.get("item")
            if _restore_call(item):
                self.index[at] = None
            else:
                self.answering |= isinstance(item, dict) and item.get("type") in ANSWERING
                self.index[at] = self._kept()
        if "output_index" in event:
            new = self.index.get(at, at)
            if new is None:
                return []
            event = event if new == at else {**event, "output_index": new}
        response = event.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("output"), list):
            return [event]
        output = [i for i in response["output"] if not _restore_call(i)]
        if event.get("type") != "response.completed" or self.answering or not self._dropped:
            if len(output) == len(response["output"]):
                return [event]
            return [{**event, "response": {**response, "output": output}}]
        item = no_answer(len(output))
        added = {"type": "response.output_item.added", "output_index": len(output), "item": item}
        done = {**added, "type": "response.output_item.done"}
        completed = {**event, "response": {**response, "output": [*output, item]}}
        return [added, done, completed]
