"""OpenAPI documentation of the proxy's own routes, whose handlers read the raw body themselves."""

from __future__ import annotations

from typing import Any

from app.compaction.policy import MAX_CONTEXT_LIMIT, STRATEGIES

JSONSchema = dict[str, Any]

_NULLABLE_STRING: JSONSchema = {"type": ["string", "null"]}

ERROR_ENVELOPE: JSONSchema = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": _NULLABLE_STRING,
                "code": _NULLABLE_STRING,
            },
        }
    },
}

_ERROR_DESCRIPTIONS = {
    400: "Invalid request: malformed JSON, wrong chat shape or a bad compaction control",
    401: "Missing or invalid API key (only when INFLIGHT_API_KEYS is set)",
    404: "No ledger with this id for this client: unknown, expired, or another key's (alike)",
    413: "Request body larger than INFLIGHT_MAX_BODY_BYTES",
    502: "Upstream unreachable, reset, or broke its response",
    504: "Upstream timed out",
}

_NAMES = "|".join(STRATEGIES)
# Python's `str.strip` also strips \x1c-\x1f, which a JSON Schema `\s` does not match.
NON_BLANK = r"[^\s\x1c-\x1f]"
# `auto`, `none`, or a comma list of strategy names (what `parse_strategy` accepts).
STRATEGY_PATTERN = rf"^ *(auto|none|({_NAMES})( *, *({_NAMES}))*) *$"

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

COMPACTION: JSONSchema = {
    "description": "Per-request compaction controls; the X-Compaction-* headers win over these",
    "type": "object",
    "properties": {
        "strategy": {
            "oneOf": [
                {"type": "string", "pattern": STRATEGY_PATTERN},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "string", "enum": list(STRATEGIES)},
                },
                {"type": "null"},
            ]
        },
        "context_limit": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_CONTEXT_LIMIT,
        },
        "threshold": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
        "target": {
            "description": "Must not exceed `threshold` when both are given",
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": 1,
        },
        "summary_model": {"type": ["string", "null"], "pattern": NON_BLANK},
        "protect_tools": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "null"},
            ]
        },
        "restore": {"type": ["boolean", "null"]},
        "summary_wait": {"type": ["boolean", "null"]},
    },
    "additionalProperties": False,
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

_CONTROL_HEADERS: list[tuple[str, JSONSchema, str]] = [
    (
        "X-Compaction-Strategy",
        {"type": "string", "pattern": STRATEGY_PATTERN},
        "auto, none, or a comma list of " + ", ".join(STRATEGIES),
    ),
    (
        "X-Compaction-Context-Limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_CONTEXT_LIMIT},
        "Window in tokens",
    ),
    (
        "X-Compaction-Threshold",
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "Compact when the prompt passes this share of the budget",
    ),
    (
        "X-Compaction-Target",
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "Compact down to this share of the budget (not above the threshold)",
    ),
    (
        "X-Compaction-Summary-Model",
        {"type": "string", "pattern": NON_BLANK},
        "Model that writes summaries",
    ),
    (
        "X-Compaction-Protect-Tools",
        {"type": "string"},
        "Comma list of tool names whose outputs are never pruned or truncated",
    ),
    (
        "X-Compaction-Restore",
        {"type": "string", "enum": ["on", "off", "true", "false"]},
        "Offer the model the inflight_restore tool to read what was cut",
    ),
    (
        "X-Compaction-Summary-Wait",
        {"type": "string", "enum": ["true", "false", "on", "off"]},
        "Wait for a summary at a compaction event instead of serving at once",
    ),
]

CONTROL_HEADERS: list[JSONSchema] = [
    {"name": name, "in": "header", "required": False, "schema": schema, "description": text}
    for name, schema, text in _CONTROL_HEADERS
]


def _json(schema: JSONSchema) -> JSONSchema:
    return {"application/json": {"schema": schema}}


def errors(*statuses: int) -> dict[str, JSONSchema]:
    """Response entries rendering the proxy's own errors in OpenAI's envelope."""
    return {
        str(status): {"description": _ERROR_DESCRIPTIONS[status], "content": _json(ERROR_ENVELOPE)}
        for status in statuses
    }


def _chat_operation(
    success: dict[str, JSONSchema], statuses: tuple[int, ...], request: JSONSchema = CHAT_REQUEST
) -> JSONSchema:
    return {
        "requestBody": {"required": True, "content": _json(request)},
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

CHAT_COMPLETIONS = _chat_operation(
    {
        "200": {
            "description": "The upstream's completion, relayed (SSE when `stream` is true)",
            "content": {
                **_json({"type": "object"}),
                "text/event-stream": {"schema": SSE_EVENT},
            },
        },
        "default": {"description": "An upstream error, relayed verbatim"},
    },
    (400, 401, 413, 502, 504),
)

RESPONSES: JSONSchema = {
    "requestBody": {"required": True, "content": _json(RESPONSES_REQUEST)},
    "parameters": CONTROL_HEADERS,
    "responses": {
        "200": {
            "description": "The upstream's response, relayed (its event stream when `stream`)",
            "content": {**_json({"type": "object"}), "text/event-stream": {"schema": SSE_EVENT}},
        },
        "default": {"description": "An upstream error, relayed verbatim"},
        **errors(400, 401, 413, 502, 504),
    },
}

_REPORT_FIELDS: JSONSchema = {
    "context_limit": {"type": "integer"},
    "limit_source": {
        "type": "string",
        "enum": ["header", "setting", "learned", "discovered", "table", "fallback"],
    },
    "output_reserve": {"type": "integer"},
    "exact": {"type": "boolean"},
    "encoding": _NULLABLE_STRING,
}

# `/v1/compaction/*` take a body of any compacting API: `X-Compaction-Format` names it, else
# `input` means Responses (DESIGN.md §8); the preview answers with that API's history field.
COMPACTION_REQUEST: JSONSchema = {
    "anyOf": [CHAT_REQUEST, {**RESPONSES_REQUEST, "required": ["model", "input"]}],
}

PREVIEW_RESPONSE: JSONSchema = {
    "type": "object",
    "required": ["report"],
    "anyOf": [{"required": ["messages"]}, {"required": ["input"]}],
    "properties": {
        "messages": {"type": "array", "items": {"type": "object"}},
        "input": {"type": ["array", "string", "null"], "items": {"type": "object"}},
        "report": {
            "type": "object",
            "required": ["applied", "tokens_before", "tokens_after", *_REPORT_FIELDS],
            "properties": {
                "applied": {"type": "array", "items": {"type": "string"}},
                "tokens_before": {"type": "integer"},
                "tokens_after": {"type": "integer"},
                "messages_before": {"type": "integer"},
                "messages_after": {"type": "integer"},
                "budget": {"type": "integer"},
                "over_budget": {"type": "boolean"},
                "pinned_head_units": {"type": "integer"},
                "units": {"type": "integer"},
                "compaction_events": {"type": "integer"},
                **_REPORT_FIELDS,
            },
        },
    },
}

COUNT_RESPONSE: JSONSchema = {
    "type": "object",
    "required": ["model", "prompt_tokens", "usage_ratio", *_REPORT_FIELDS],
    "properties": {
        "model": {"type": "string"},
        "prompt_tokens": {"type": "integer"},
        "usage_ratio": {"type": "number"},
        **_REPORT_FIELDS,
    },
}

# Preview and count never forward the request; a failed summary falls back to trimming.
PREVIEW = _chat_operation(
    {
        "200": {
            "description": "The compacted messages and a report",
            "content": _json(PREVIEW_RESPONSE),
        }
    },
    (400, 401, 413),
    COMPACTION_REQUEST,
)
COUNT = _chat_operation(
    {"200": {"description": "Prompt tokens against the window", "content": _json(COUNT_RESPONSE)}},
    (400, 401, 413),
    COMPACTION_REQUEST,
)

_READINESS: JSONSchema = {
    "type": "object",
    "required": ["ready", "store", "upstream"],
    "properties": {name: {"type": "boolean"} for name in ("ready", "store", "upstream")},
}
READYZ: JSONSchema = {
    "responses": {
        "200": {"description": "Store and upstream reachable", "content": _json(_READINESS)},
        "503": {"description": "Store or upstream unreachable", "content": _json(_READINESS)},
    }
}
STATS: JSONSchema = {"responses": errors(401)}
METRICS: JSONSchema = {
    "responses": {
        "200": {"description": "Prometheus text exposition", "content": {"text/plain": {}}},
        **errors(401),
    }
}

_CUT: JSONSchema = {
    "type": "object",
    "required": ["position", "items", "role", "tool", "kind", "tokens", "sha256", "ref"],
    "properties": {
        "position": {"type": "integer", "description": "Index in the chat-shaped view"},
        "items": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "Indices in the request's own `messages` or `input`",
        },
        "role": {"type": "string"},
        "tool": _NULLABLE_STRING,
        "kind": {
            "type": "string",
            "enum": ["truncated", "pruned", "trimmed", "summarized", "dropped"],
        },
        "tokens": {"type": "integer"},
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "ref": {"type": "string", "pattern": "^[A-Za-z0-9_-]{6,32}$"},
        "content": {"description": "The original content (INFLIGHT_LEDGER=full only)"},
        "calls": {"type": "array", "items": {"type": "object"}},
    },
}
LEDGER_DOCUMENT: JSONSchema = {
    "title": "CompactionLedger",
    "type": "object",
    "required": ["id", "created", "expires", "mode", "route", "model", "applied", "cuts"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "const": "compaction.ledger"},
        "created": {"type": "number"},
        "expires": {"type": "number"},
        "mode": {"type": "string", "enum": ["meta", "full"]},
        "route": {"type": "string"},
        "model": {"type": "string"},
        "applied": {"type": "array", "items": {"type": "string"}},
        "tokens_before": {"type": "integer"},
        "tokens_after": {"type": "integer"},
        "context_limit": {"type": "integer"},
        "cuts": {"type": "array", "items": _CUT},
    },
}
LEDGER: JSONSchema = {
    "summary": "What one compacted request cut (its X-Compaction-Id)",
    "responses": {
        "200": {"description": "The ledger row", "content": _json(LEDGER_DOCUMENT)},
        **errors(401, 404),
    },
}
