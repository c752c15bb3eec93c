"""OpenAPI documentation of `POST /v1/chat/completions`: the request, and the operation a
compacting route documents (its body, the control headers, its answers and errors)."""

from __future__ import annotations

from inflight.http.openapi import COMPACTION, CONTROL_HEADERS, JSONSchema, errors, json_content

MESSAGE: JSONSchema = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {
            "type": "string",
            "enum": ["system", "developer", "user", "assistant", "tool", "function"],
        },
        "content": {
            "description": "Text, an array of content parts, or null",
            "type": ["string", "array", "null"],
        },
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
    },
    "additionalProperties": True,
}

CHAT_REQUEST: JSONSchema = {
    "title": "ChatCompletionRequest",
    "description": "An OpenAI chat completions request; unknown fields are forwarded untouched",
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "minItems": 1, "maxItems": 100_000, "items": MESSAGE},
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {"type": "object"},
        "max_tokens": {"type": "integer"},
        "max_completion_tokens": {"type": "integer"},
        "tools": {"type": "array", "items": {"type": "object"}},
        "compaction": COMPACTION,
        "transforms": {
            "description": "OpenRouter's: [] disables compaction, ['middle-out'] asks for it",
            "type": "array",
            "items": {"type": "string", "enum": ["middle-out"]},
        },
    },
    "additionalProperties": True,
}


def chat_operation(
    success: dict[str, JSONSchema], statuses: tuple[int, ...], request: JSONSchema = CHAT_REQUEST
) -> JSONSchema:
    return {
        "requestBody": {"required": True, "content": json_content(request)},
        "parameters": CONTROL_HEADERS,
        "responses": {**success, **errors(*statuses)},
    }


SSE_EVENT: JSONSchema = {
    "description": "One server-sent event: a chat.completion.chunk as JSON, then `[DONE]`",
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}

CHAT_COMPLETIONS = chat_operation(
    {
        "200": {
            "description": "The upstream's completion, relayed (SSE when `stream` is true)",
            "content": {
                **json_content({"type": "object"}),
                "text/event-stream": {"schema": SSE_EVENT},
            },
        },
        "default": {"description": "An upstream error, relayed verbatim"},
    },
    (400, 401, 413, 502, 504),
)
