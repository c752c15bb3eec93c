"""Restore's dialect for OpenAI's Responses API: the tool as a flat `function` tool, calls as
`function_call` output items (answered by `call_id`), answers as `function_call_output` input
items, and the events of a stream. The API echoes the request's `tools` in every response
object, so the proxy's tool is taken out of what the client sees (JSON and stream events)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.proxy.restore import DESCRIPTION, PARAMETERS, TOOL_NAME, Kind, dicts_in, names_tool
from app.proxy.sse_tap import Usage, without_tool

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
            if isinstance(response, dict) and event.get("type", "").startswith("response."):
                return response
        return {}
