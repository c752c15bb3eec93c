"""Summary requests through the upstream client: a `Completer` for a chat client's summaries
and one for a Messages client's (sent to Anthropic's API and read back as a chat completion)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import orjson

from app.errors import UpstreamTimeout, UpstreamUnavailable
from app.proxy.headers import filter_request_headers
from app.proxy.sse_tap import Usage
from app.proxy.upstream import Upstream, read_all
from app.windows.table import Route

_SUMMARY_HEADERS = frozenset(
    {"authorization", "api-key", "x-api-key", "openai-organization", "openai-project"}
)


def summary_completer(
    upstream: Upstream,
    model: str,
    client_headers: Mapping[str, str],
    deadline: float,
    route: Route | None = None,
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    """A `Completer` for summary requests: the model's route (or `route`: the summary upstream),
    the client's credentials (or the configured upstream key), a bounded deadline; transport
    failures become `SummaryFailed`."""
    route = route or upstream.route(model)
    headers = filter_request_headers(
        [(k, v) for k, v in client_headers.items() if k.lower() in _SUMMARY_HEADERS],
        api_key=route.api_key,
        identity=True,
    )
    url = upstream.url(route, "/chat/completions")
    return _completer(upstream, url, headers, deadline, lambda status, content: content)


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
    route = upstream.route(model, anthropic=True)
    headers = filter_request_headers(
        [(k, v) for k, v in client_headers.items() if k.lower() in _ANTHROPIC_HEADERS],
        api_key=route.api_key,
        identity=True,
        key_header="x-api-key",
    )
    if not any(k.lower() == "anthropic-version" for k, _ in headers):
        headers.append(("anthropic-version", ANTHROPIC_VERSION))
    url = upstream.url(route, "/messages")
    return _completer(upstream, url, headers, deadline, _as_chat_completion)


def _as_chat_completion(status: int, content: bytes) -> bytes:
    """An Anthropic message as a chat completion (its text, its usage); errors as they are."""
    if status >= 400:
        return content
    try:
        message = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    blocks = message.get("content") if isinstance(message, dict) else None
    if not isinstance(blocks, list):
        return content
    text = "".join(
        b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)
    )
    usage = Usage.from_anthropic(message.get("usage")) or Usage()
    return orjson.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": text}}],
            "usage": {
                "prompt_tokens": usage.prompt_tokens or 0,
                "completion_tokens": usage.completion_tokens or 0,
            },
        }
    )


def _completer(
    upstream: Upstream,
    url: str,
    headers: list[tuple[str, str]],
    deadline: float,
    convert: Callable[[int, bytes], bytes],
) -> Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]:
    from app.compaction.summary.prompt import SummaryFailed

    headers = [*headers, ("content-type", "application/json")]

    async def complete(body: dict[str, Any]) -> tuple[int, bytes]:
        try:
            with anyio.fail_after(deadline):  # a total deadline, not per read
                response = await upstream.send(
                    "POST", url, headers, orjson.dumps(body), deadline=deadline, client=False
                )
                status = response.status_code
                return status, convert(status, await read_all(response))
        except TimeoutError as exc:
            raise SummaryFailed(f"summariser took longer than {deadline:g}s") from exc
        except (UpstreamTimeout, UpstreamUnavailable) as exc:
            raise SummaryFailed(exc.message) from exc

    return complete
