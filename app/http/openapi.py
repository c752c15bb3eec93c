"""OpenAPI documentation of the proxy's own routes, whose handlers read the raw body themselves:
the pieces every API's documentation shares (the error envelope, the compaction controls in a
body and in headers) and the operational routes. Each API's own schema is its package's
`openapi.py` (app/apis/); the compaction endpoints' are in openapi_compaction.py."""

from __future__ import annotations

from typing import Any

from inflight.compaction.policy import MAX_CONTEXT_LIMIT
from inflight.strategies import STRATEGIES

JSONSchema = dict[str, Any]

NULLABLE_STRING: JSONSchema = {"type": ["string", "null"]}

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
                "param": NULLABLE_STRING,
                "code": NULLABLE_STRING,
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


def json_content(schema: JSONSchema) -> JSONSchema:
    return {"application/json": {"schema": schema}}


def errors(*statuses: int) -> dict[str, JSONSchema]:
    """Response entries rendering the proxy's own errors in OpenAI's envelope."""
    return {
        str(status): {
            "description": _ERROR_DESCRIPTIONS[status],
            "content": json_content(ERROR_ENVELOPE),
        }
        for status in statuses
    }


_READINESS: JSONSchema = {
    "type": "object",
    "required": ["ready", "store", "upstream"],
    "properties": {
        **{name: {"type": "boolean"} for name in ("ready", "store", "upstream", "cache")},
        "age": {"type": "number", "description": "seconds since the background probe ended"},
    },
}
READYZ: JSONSchema = {
    "responses": {
        "200": {"description": "Store and upstream reachable", "content": json_content(_READINESS)},
        "503": {
            "description": "Store or upstream unreachable",
            "content": json_content(_READINESS),
        },
    }
}
STATS: JSONSchema = {"responses": errors(401)}
METRICS: JSONSchema = {
    "responses": {
        "200": {"description": "Prometheus text exposition", "content": {"text/plain": {}}},
        **errors(401),
    }
}
