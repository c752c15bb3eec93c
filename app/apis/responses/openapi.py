"""OpenAPI documentation of `POST /v1/responses` (OpenAI's Responses API)."""

from __future__ import annotations

from inflight.apis.chat.openapi import SSE_EVENT
from inflight.http.openapi import COMPACTION, CONTROL_HEADERS, JSONSchema, errors, json_content

RESPONSES_ITEM: JSONSchema = {
    "description": "An input item: a message (`role`, `type` optional) or a typed item",
    "type": "object",
    "properties": {"type": {"type": "string"}, "role": {"type": "string"}},
    "anyOf": [
        {"required": ["role"]},
        {"required": ["type"], "properties": {"type": {"not": {"const": "message"}}}},
    ],
    "additionalProperties": True,
}

RESPONSES_REQUEST: JSONSchema = {
    "title": "ResponsesRequest",
    "description": "An OpenAI Responses API request; unknown fields are forwarded untouched",
    "type": "object",
    "required": ["model"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {
            "description": "A prompt (never compacted) or a list of items",
            "oneOf": [{"type": "string"}, {"type": "array", "items": RESPONSES_ITEM}],
        },
        "instructions": {"type": ["string", "null"]},
        "previous_response_id": {"type": ["string", "null"]},
        "stream": {"type": ["boolean", "null"]},
        "max_output_tokens": {"type": "integer"},
        "tools": {"type": "array", "items": {"type": "object"}},
        "compaction": COMPACTION,
    },
    "additionalProperties": True,
}

RESPONSES: JSONSchema = {
    "requestBody": {"required": True, "content": json_content(RESPONSES_REQUEST)},
    "parameters": CONTROL_HEADERS,
    "responses": {
        "200": {
            "description": "The upstream's response, relayed (its event stream when `stream`)",
            "content": {
                **json_content({"type": "object"}),
                "text/event-stream": {"schema": SSE_EVENT},
            },
        },
        "default": {"description": "An upstream error, relayed verbatim"},
        **errors(400, 401, 413, 502, 504),
    },
}
