"""OpenAI Responses API (`POST /v1/responses`): an `Api` through `ResponsesFormat`.

Its own points: the body is an object naming its model (`input` is the adapter's to check); usage is
in the JSON answer and in a stream's `response.completed` whether asked for or not, so a stream is
never asked for it; errors use OpenAI's envelope (the default).
"""

from __future__ import annotations

from inflight.apis.responses.events import EVENTS
from inflight.apis.responses.format import ResponsesFormat
from inflight.apis.responses.restore import ResponsesDialect
from inflight.proxy.api import Api
from inflight.proxy.body import check_model_rest, parse_streamable_body

API = Api(
    route="/v1/responses",
    upstream_path="/responses",
    wire=ResponsesFormat(),
    events=EVENTS,
    parse_body=parse_streamable_body,
    check_rest=check_model_rest,
    restore=ResponsesDialect(),
)
