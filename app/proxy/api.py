"""What a compacting API is (`Api`: its routes, wire format and every point where APIs
differ) and what one request through it turned into (`Exchange`: for the response headers and
the usage record)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from inflight.errors import ProxyError
from inflight.proxy.restore import Dialect
from inflight.proxy.reuse import Reused
from inflight.proxy.sse_tap import EventEdit, EventReader, Usage
from inflight.proxy.upstream import Provider
from inflight.settings import ContextEditsMode
from inflight.usage.records import Outcome

if TYPE_CHECKING:
    from inflight.apis.anthropic.context_edits import EditedBody
    from inflight.compaction.compacted import Compacted
    from inflight.compaction.wire import WireFormat

# (bytes to forward, the parsed body) -> (bytes asking for stream usage, cut the usage chunk)
StreamUsage = Callable[[bytes, Mapping[str, Any]], tuple[bytes, bool]]


class ContextEditing(Protocol):
    """A client's own context-management request, honoured by the proxy where the upstream
    would ignore it (DESIGN.md §13): applied to the body, and reported on the answer."""

    def apply(
        self, body: dict[str, Any], base_url: str, mode: ContextEditsMode
    ) -> EditedBody | None:
        """The body with the edits applied (None: not the proxy's to apply)."""
        ...

    def answer(self, content: bytes, report: dict[str, Any]) -> bytes:
        """A JSON answer stating `report`."""
        ...

    def stream(self, report: dict[str, Any], inner: EventEdit | None) -> EventEdit:
        """The stream edit stating `report` (after `inner`, restore's)."""
        ...


def openai_error_body(error: ProxyError) -> dict[str, Any]:
    """OpenAI's error envelope `{"error": {message, type, param, code}}`."""
    return error.body()


@dataclass(frozen=True, slots=True)
class Api:
    """One compacting API: its wire format and each point where APIs differ."""

    route: str  # the client's path, e.g. `/v1/chat/completions` (the usage record's route)
    upstream_path: str  # joined to the upstream's base URL, e.g. `/chat/completions`
    wire: WireFormat  # the adapter the compaction service plans and renders through
    events: EventReader  # what its streams state: usage, errors, their end
    parse_body: Callable[[bytes], dict[str, Any]]  # parse and check the shape (400 naming why)
    # The checks `parse_body` makes on a body parsed from a remembered one (app/proxy/reuse.py:
    # the next request of a conversation extends the history), of what was parsed now.
    check_rest: Callable[[Reused], None] | None = None
    history_is_view: bool = False  # the adapter plans on that very list (chat)
    usage: Callable[[Any], Usage | None] = Usage.from_json  # a JSON answer's `usage` value
    stream_usage: StreamUsage | None = None  # ask a stream for usage (None: it always has it)
    error_body: Callable[[ProxyError], dict[str, Any]] = openai_error_body  # the error envelope
    provider: Provider = "openai"  # whose API: its default upstream and key header
    restore: Dialect | None = None  # how restore offers its tool here (None: not offered)
    context_edits: ContextEditing | None = None  # the client's own context editing (§13)

    @property
    def history(self) -> str:
        """The history array a conversation's next request extends."""
        return self.wire.history

    def error_frame(self, error: ProxyError) -> bytes:
        """`error` as a final SSE event, for a stream that already started."""
        return b"event: error\ndata: " + orjson.dumps(self.error_body(error)) + b"\n\n"


@dataclass(slots=True)
class Exchange:
    """What one request turned into, for the response headers and the usage record."""

    api: Api
    model: str
    stream: bool
    raw: bytes
    body: dict[str, Any]  # the body as the client sent it, parsed (the cost baseline)
    request_headers: Mapping[str, str] = field(default_factory=dict)
    client_key_id: str | None = None
    compacted: Compacted | None = None  # what the compaction service decided to forward
    status: int = 0
    usage: Usage | None = None
    outcome: Outcome = "completed"
    ttfb: float | None = None
    started: float = field(default_factory=time.perf_counter)
    retried: bool = False
    upstream_truncated: bool = False  # the upstream cut the prompt silently (DESIGN.md §11)
    rounds: int = 1  # upstream requests restore made for it (usage is their sum)
    # the `context_management` report of edits the proxy applied, added to the answer
    context_management: dict[str, Any] | None = None

    @property
    def route(self) -> str:
        return self.api.route

    @property
    def forward(self) -> bytes:
        """The bytes that go upstream (the client's own when nothing changed)."""
        if self.compacted is None or self.compacted.forward is None:
            return self.raw
        return self.compacted.forward

    @property
    def sent(self) -> Mapping[str, Any]:
        """The body that goes upstream, parsed."""
        return self.body if self.compacted is None else self.compacted.body

    @property
    def view(self) -> Mapping[str, Any] | None:
        """The chat-shaped view of what was sent (for calibrating the counter), if compacted
        and sent once (restore's rounds sum several prompts' usage)."""
        return None if self.compacted is None or self.rounds > 1 else self.compacted.view
