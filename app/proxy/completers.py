"""Summary requests through the upstream client, each asked through the API of the request it
serves (chat, Responses, Messages) in the shape its model family accepts, and read back as the
chat completion the summariser parses (DESIGN.md §12)."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import anyio
import orjson

from inflight.compaction.summary.stats import SummaryStats
from inflight.errors import UpstreamTimeout, UpstreamUnavailable
from inflight.lru import BoundedLRU
from inflight.proxy.headers import filter_request_headers
from inflight.proxy.sse_tap import Usage
from inflight.proxy.upstream import Upstream, read_all
from inflight.windows.table import Route

logger = logging.getLogger(__name__)

Shape = Literal["classic", "reasoning"]
SHAPES: tuple[Shape, ...] = ("classic", "reasoning")
# OpenAI's reasoning families reject `temperature` and chat's `max_tokens`; their hidden
# reasoning counts against the output limit, so they get this many tokens more.
_REASONING = re.compile(r"^(o\d|gpt-5|codex)", re.IGNORECASE)
REASONING_ALLOWANCE = 4096
_REJECTED = frozenset({400, 422})  # what an upstream answers a request of the wrong shape


def reasoning_model(model: str) -> bool:
    """Whether `model` (`openai/o3-mini`, `gpt-5-codex`, …) is of an OpenAI reasoning family."""
    return bool(_REASONING.match(model.rsplit("/", 1)[-1]))


class SummaryShapes:
    """Which shape a summary request to (URL, model) takes: its family's first; once the
    upstream rejected a shape for its form (400/422), never that one again for that model —
    the rejection logged once with the upstream's message and counted (`rejected_shape`)."""

    def __init__(self, stats: SummaryStats, capacity: int = 1024) -> None:
        self._stats = stats
        self._rejected: BoundedLRU[tuple[str, str], frozenset[Shape]] = BoundedLRU(capacity)

    def order(self, url: str, model: str) -> list[Shape]:
        """The shapes still to try, the likeliest first."""
        first: Shape = "reasoning" if reasoning_model(model) else "classic"
        ordered = [first, *(shape for shape in SHAPES if shape != first)]
        rejected = self._rejected.get((url, model)) or frozenset()
        return [shape for shape in ordered if shape not in rejected]

    def reject(self, url: str, model: str, shape: Shape, status: int, content: bytes) -> None:
        key = (url, model)
        self._rejected.put(key, (self._rejected.get(key) or frozenset()) | {shape})
        self._stats.failed("rejected_shape")
        message = content[:300].decode("utf-8", "replace")
        logger.warning(
            "summary request in the %s shape rejected by %s for %s (HTTP %d): %s; not sent "
            "in that shape again", shape, url, model, status, message,
        )  # fmt: skip


_SUMMARY_HEADERS = frozenset(
    {"authorization", "api-key", "x-api-key", "openai-organization", "openai-project"}
)


def summary_completer(
    upstream: Upstream,
    model: str,
    client_headers: Mapping[str, str],
    deadline: float,
    route: Route | None = None,
    shapes: SummaryShapes | None = None,
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    """A `Completer` for a chat client's summaries (`/chat/completions`): the model's route (or
    `route`: the summary upstream), the client's credentials (or the route's key), a bounded
    deadline; transport failures become `SummaryFailed`."""
    route = route or upstream.route(model)
    url = upstream.url(route, "/chat/completions")
    send = _sender(upstream, url, _openai_headers(route, client_headers), deadline)
    return _shaped(send, url, model, shapes, _chat_body, lambda status, content: content)


def responses_summary_completer(
    upstream: Upstream,
    model: str,
    client_headers: Mapping[str, str],
    deadline: float,
    shapes: SummaryShapes | None = None,
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    """A `Completer` for a Responses client's summaries, asked of `/responses` (models such as
    `gpt-5-codex` are served there alone): `instructions`-free `input`, `max_output_tokens`,
    `store: false`; the answer read back as a chat completion."""
    route = upstream.route(model)
    url = upstream.url(route, "/responses")
    send = _sender(upstream, url, _openai_headers(route, client_headers), deadline)
    return _shaped(send, url, model, shapes, _responses_body, _response_as_chat_completion)


def _openai_headers(route: Route, client_headers: Mapping[str, str]) -> list[tuple[str, str]]:
    return filter_request_headers(
        [(k, v) for k, v in client_headers.items() if k.lower() in _SUMMARY_HEADERS],
        api_key=route.api_key,
        identity=True,
    )


def _chat_body(body: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """The summariser's chat body in `shape`: as built (`max_tokens`, `temperature`), or for a
    reasoning model (`max_completion_tokens` with room to reason, no `temperature`)."""
    if shape == "classic":
        return body
    shaped = {k: v for k, v in body.items() if k not in ("max_tokens", "temperature")}
    shaped["max_completion_tokens"] = int(body.get("max_tokens") or 0) + REASONING_ALLOWANCE
    return shaped


def _responses_body(body: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """The summariser's chat body as a Responses request in `shape`."""
    limit = int(body.get("max_tokens") or 0)
    shaped: dict[str, Any] = {
        "model": body["model"],
        "input": [{"role": m["role"], "content": m["content"]} for m in body.get("messages", [])],
        "store": False,
        "stream": False,
    }
    if shape == "classic":
        shaped["max_output_tokens"] = limit
        shaped["temperature"] = body.get("temperature", 0)
    else:
        shaped["max_output_tokens"] = limit + REASONING_ALLOWANCE
    return shaped


def _response_as_chat_completion(status: int, content: bytes) -> bytes:
    """A Responses answer as a chat completion (its output text, its usage); errors as they
    are. An answer with no output text stays as it is, and the summariser rejects it."""
    response = _answer_of(status, content)
    output = response.get("output") if response is not None else None
    if response is None or not isinstance(output, list):
        return content
    parts = [
        part
        for item in output
        if isinstance(item, dict) and item.get("type") == "message"
        for part in _list(item.get("content"))
    ]
    texts = [part.get("text") for part in parts if isinstance(part, dict)]
    text = "".join(t for t in texts if isinstance(t, str))
    usage = Usage.from_json(response.get("usage")) or Usage()
    return _chat_completion(text, usage)


_ANTHROPIC_HEADERS = frozenset(
    {"authorization", "x-api-key", "anthropic-version", "anthropic-beta"}
)
ANTHROPIC_VERSION = "2023-06-01"  # sent when the client named none (the API requires one)


def anthropic_summary_completer(
    upstream: Upstream, model: str, client_headers: Mapping[str, str], deadline: float
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    """A `Completer` for a Messages client's summaries: the summary request (a valid Messages
    body as it is) goes to the model's Anthropic route with the client's `x-api-key` (or
    `INFLIGHT_ANTHROPIC_API_KEY`) and `anthropic-version`; the answer is read back as the chat
    completion the summariser parses (text, and usage with cache reads and writes)."""
    route = upstream.route(model, "anthropic")
    headers = filter_request_headers(
        [(k, v) for k, v in client_headers.items() if k.lower() in _ANTHROPIC_HEADERS],
        api_key=route.api_key,
        identity=True,
        key_header="x-api-key",
    )
    if not any(k.lower() == "anthropic-version" for k, _ in headers):
        headers.append(("anthropic-version", ANTHROPIC_VERSION))
    url = upstream.url(route, "/messages")
    send = _sender(upstream, url, headers, deadline)
    return _shaped(send, url, model, None, lambda body, shape: body, _as_chat_completion)


def _as_chat_completion(status: int, content: bytes) -> bytes:
    """An Anthropic message as a chat completion (its text, its usage); errors as they are."""
    message = _answer_of(status, content)
    blocks = message.get("content") if message is not None else None
    if message is None or not isinstance(blocks, list):
        return content
    text = "".join(
        b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)
    )
    usage = Usage.from_anthropic(message.get("usage")) or Usage()
    return _chat_completion(text, usage)


def _answer_of(status: int, content: bytes) -> dict[str, Any] | None:
    """A 2xx answer's JSON object, to be read back as a chat completion (None: an error or not
    an object, passed on as it is for the summariser to reject)."""
    if status >= 400:
        return None
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return answer if isinstance(answer, dict) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _chat_completion(text: str, usage: Usage) -> bytes:
    return orjson.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": text}}],
            "usage": {
                "prompt_tokens": usage.prompt_tokens or 0,
                "completion_tokens": usage.completion_tokens or 0,
            },
        }
    )


Send = Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]


def _shaped(
    send: Send,
    url: str,
    model: str,
    shapes: SummaryShapes | None,
    shape_body: Callable[[dict[str, Any], Shape], dict[str, Any]],
    convert: Callable[[int, bytes], bytes],
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    """A completer that sends the summariser's body in the first shape the upstream has not
    rejected for `model`, and on a rejection for its form (400/422) at once in the next."""

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        order = shapes.order(url, model) if shapes is not None else list(SHAPES[:1])
        status, content = 0, b""
        for shape in order or list(SHAPES[:1]):
            status, content = await send(shape_body(body, shape))
            if status not in _REJECTED or shapes is None or not order:
                break
            shapes.reject(url, model, shape, status, content)
        return status, convert(status, content)

    return complete


def _sender(upstream: Upstream, url: str, headers: list[tuple[str, str]], deadline: float) -> Send:
    """One bounded POST of a JSON body: (status, body bytes); transport failures and the
    deadline become `SummaryFailed`."""
    from inflight.compaction.summary.prompt import SummaryFailed

    headers = [*headers, ("content-type", "application/json")]

    async def send(body: dict[str, Any]) -> tuple[int, bytes]:
        try:
            with anyio.fail_after(deadline):  # a total deadline, not per read
                response = await upstream.send(
                    "POST", url, headers, orjson.dumps(body), deadline=deadline, client=False
                )
                return response.status_code, await read_all(response)
        except TimeoutError as exc:
            raise SummaryFailed(f"summariser took longer than {deadline:g}s") from exc
        except (UpstreamTimeout, UpstreamUnavailable) as exc:
            raise SummaryFailed(exc.message) from exc

    return send
