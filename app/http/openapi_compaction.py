"""OpenAPI documentation of `/v1/compaction/*`: preview and count (a body of any compacting
API) and the ledger of what one compacted request cut."""

from __future__ import annotations

from inflight.apis.chat.openapi import CHAT_REQUEST, chat_operation
from inflight.apis.responses.openapi import RESPONSES_REQUEST
from inflight.http.openapi import NULLABLE_STRING, JSONSchema, errors, json_content

_REPORT_FIELDS: JSONSchema = {
    "context_limit": {"type": "integer"},
    "limit_source": {
        "type": "string",
        "enum": ["header", "setting", "learned", "discovered", "table", "fallback"],
    },
    "output_reserve": {"type": "integer"},
    "exact": {"type": "boolean"},
    "encoding": NULLABLE_STRING,
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
PREVIEW = chat_operation(
    {
        "200": {
            "description": "The compacted messages and a report",
            "content": json_content(PREVIEW_RESPONSE),
        }
    },
    (400, 401, 413),
    COMPACTION_REQUEST,
)
COUNT = chat_operation(
    {
        "200": {
            "description": "Prompt tokens against the window",
            "content": json_content(COUNT_RESPONSE),
        }
    },
    (400, 401, 413),
    COMPACTION_REQUEST,
)

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
        "tool": NULLABLE_STRING,
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
        "200": {"description": "The ledger row", "content": json_content(LEDGER_DOCUMENT)},
        **errors(401, 404),
    },
}
