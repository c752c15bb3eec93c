"""Chat completions (`POST /v1/chat/completions`): the first `Api`, through `ChatFormat`.

Its own points: the body shape (`parse_chat_body`), usage in a stream only when asked for
(`stream_options.include_usage`, which the proxy adds and then cuts from what the client sees),
and OpenAI's error envelope (the default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from inflight.apis.chat.events import EVENTS
from inflight.apis.chat.format import ChatFormat
from inflight.apis.chat.restore import ChatDialect
from inflight.proxy.api import Api
from inflight.proxy.body import add_include_usage, check_chat_rest, parse_chat_body


def ask_stream_usage(forward: bytes, body: Mapping[str, Any]) -> tuple[bytes, bool]:
    """`forward` asking for the stream's usage chunk when the client did not (DESIGN.md §6);
    the bool says the proxy asked, so the usage-only chunk is cut from the client's stream."""
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return forward, False
    spliced = add_include_usage(forward, body if isinstance(body, dict) else dict(body))
    if spliced is None:
        extra = options if isinstance(options, dict) else {}
        spliced = orjson.dumps({**body, "stream_options": {**extra, "include_usage": True}})
    return spliced, True


API = Api(
    route="/v1/chat/completions",
    upstream_path="/chat/completions",
    wire=ChatFormat(),
    events=EVENTS,
    parse_body=parse_chat_body,
    check_rest=check_chat_rest,
    history_is_view=True,
    stream_usage=ask_stream_usage,
    restore=ChatDialect(),
)
