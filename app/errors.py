"""The proxy's own error tree and the OpenAI envelope each error renders as (no web imports).

Errors that the upstream itself returns are not ProxyErrors: they are relayed verbatim.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson


class ProxyError(Exception):
    """An error produced by the proxy itself, rendered as `{"error": {...}}`.

    ProxyError
     ├── BadRequest (400, invalid_request_error)
     │    ├── InvalidJSON            code=invalid_json
     │    ├── InvalidControl         code=invalid_compaction_control (bad X-Compaction-*/body value)
     │    └── ContextLengthExceeded  code=context_length_exceeded (ON_OVERFLOW=reject)
     ├── Unauthorized (401, invalid_api_key)
     ├── NotFound (404, not_found: e.g. a ledger id that is not the caller's)
     ├── PayloadTooLarge (413)
     ├── UpstreamUnavailable (502: refused, reset, broken body)
     ├── UpstreamTimeout (504)
     └── StoreUnavailable (503, store_unavailable: the usage store is down; writes are spilled)
    """

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def sse_frame(self) -> bytes:
        """The error as a final SSE event, for a stream that already started."""
        return b"event: error\ndata: " + orjson.dumps(self.body()) + b"\n\n"


class BadRequest(ProxyError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class InvalidJSON(BadRequest):
    code = "invalid_json"


class InvalidControl(BadRequest):
    code = "invalid_compaction_control"


class ContextLengthExceeded(BadRequest):
    code = "context_length_exceeded"


class Unauthorized(ProxyError):
    status_code = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class NotFound(ProxyError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


class PayloadTooLarge(ProxyError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class UpstreamUnavailable(ProxyError):
    status_code = 502
    error_type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamTimeout(ProxyError):
    status_code = 504
    error_type = "upstream_error"
    code = "upstream_timeout"


class StoreUnavailable(ProxyError):
    """The usage store cannot be reached right now (a database restarting, a locked or full
    disk): `/stats` and the ledger answer 503 until it is back; writes are retried and spilled
    by the queue."""

    status_code = 503
    error_type = "server_error"
    code = "store_unavailable"
