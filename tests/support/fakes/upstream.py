"""`FakeUpstream`: the fake provider (a Starlette app) behind the proxy in ASGI and end-to-end
tests. One set of knobs and records for every API; the request's path picks the API part
(`chat`, `responses`, `anthropic`) that counts, checks and answers in that API's own format.

Every request is recorded (path, headers, raw body). A request is then refused with `error` if
set, with a 400 in the API's envelope if it breaks the API's rules, with the API's overflow
error if its prompt (the fake's own count, not the proxy's) exceeds `context_window`; else it is
answered in JSON or as the API's event stream, which `pacing` can hold after its first chunk so
tests observe incremental delivery and disconnects without sleeping.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"

SummaryFailure = Literal["status", "garbage", "empty", "stall", "slow"]


@dataclass
class Recorded:
    """One request the fake received; `summary` when it was the proxy's own summary call."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    summary: bool = False

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Pacing:
    """Hold a stream after its first chunk until `release` is set; `closed` is set when the
    upstream's generator ends for any reason (completion or the proxy hanging up)."""

    release: threading.Event = field(default_factory=threading.Event)
    first_sent: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)


class Api(Protocol):
    """What one API contributes to the fake: its count, rules, errors and answer formats."""

    reply: str  # the answer's text unless `reply_text` says otherwise

    def is_summary(self, body: Any) -> bool: ...  # the proxy's own summary call

    def problem(self, fake: FakeUpstream, body: Any, summary: bool) -> str | None:
        """The first of the API's rules `body` breaks (None: none)."""

    def prompt(self, body: Any) -> int: ...  # the fake's own count, apart from the proxy's

    def reserve(self, body: Any) -> int: ...  # the output the window must also hold

    def refuse(self, message: str) -> Response: ...  # a 400 in the API's envelope

    def overflow(self, fake: FakeUpstream, body: Any, prompt: int) -> tuple[str, Response]:
        """The API's overflow error: its message and the answer that carries it."""

    def usage_prompt(self, fake: FakeUpstream, body: Any, summary: bool) -> int:
        """The prompt usage states (`prompt_tokens`, else the API's default)."""

    def summary_text(self, calls: int) -> str: ...

    def answer(self, fake: FakeUpstream, body: Any, text: str, prompt: int) -> dict[str, Any]: ...

    def stream(
        self, fake: FakeUpstream, body: Any, answer: dict[str, Any]
    ) -> AsyncIterator[bytes]: ...


@dataclass(eq=False)
class FakeUpstream:
    """The fake provider, its knobs set as keywords or attributes; `app` is the ASGI app to
    serve or mount on a transport."""

    requests: list[Recorded] = field(default_factory=list, repr=False)
    rejected: list[str] = field(default_factory=list)  # the first problem of each refusal
    max_prompt_seen: int = 0
    # What the answers say.
    reply_text: str | None = None  # None: each API's own (`Api.reply`)
    prompt_tokens: int | None = None  # what usage states; None: `Api.usage_prompt`
    cached_tokens: int = 0  # the prompt's share read from the cache
    cache_write_tokens: int = 0  # the share written to it (Anthropic's usage states both)
    tool_calls: list[dict[str, Any]] | None = None  # chat: answer with these calls
    function_calls: list[dict[str, Any]] | None = None  # responses: output these calls
    # How requests fail.
    error: tuple[int, bytes, dict[str, str]] | None = None  # answer every request with this
    context_window: int | None = None
    advertised_window: int | None = None  # what /v1/models says (default: the real one)
    overflow_style: Literal["openai", "vllm"] = "openai"  # the Responses API's phrasing
    # A Responses stream over the window starts (200, `response.created`) and then fails with
    # an `error` event, as OpenAI's does; else the overflow is a 400 before any byte.
    overflow_in_stream: bool = False
    # Chat's rules are checked when asked (its tests send fragments); Responses' and
    # Anthropic's always are.
    enforce_pairs: bool = False
    require_alternation: bool = False
    # How streams go.
    pacing: Pacing | None = None
    break_stream_after_first: bool = False
    linger_after_done: float = 0.0  # seconds a stream stays open after its last event
    # The proxy's summary calls.
    summary_calls: int = 0
    summary_reply: str | None = None  # None: each API's own (`Api.summary_text`)
    summary_failure: SummaryFailure | None = None
    summary_pause: float = 0.3
    unstall: threading.Event = field(default_factory=threading.Event, repr=False)
    apis: dict[str, Api] = field(init=False, repr=False)
    app: Starlette = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from tests.support.fakes import anthropic, chat, responses

        self.apis = {
            CHAT_PATH: chat.API,
            RESPONSES_PATH: responses.API,
            MESSAGES_PATH: anthropic.API,
        }
        self.app = Starlette(
            routes=[
                *(Route(path, self._serve, methods=["POST"]) for path in self.apis),
                Route(COUNT_TOKENS_PATH, self._count_tokens, methods=["POST"]),
                Route("/v1/{path:path}", self._echo, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )

    def _client_requests(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.path == path and not r.summary]

    @property
    def chat_requests(self) -> list[Recorded]:
        """The chat completions the client sent (summaries aside)."""
        return self._client_requests(CHAT_PATH)

    @property
    def responses_requests(self) -> list[Recorded]:
        return self._client_requests(RESPONSES_PATH)

    @property
    def messages_requests(self) -> list[Recorded]:
        """The Anthropic messages the client sent (summaries and `count_tokens` aside)."""
        return self._client_requests(MESSAGES_PATH)

    @property
    def summary_requests(self) -> list[Recorded]:
        """The proxy's own summary calls, on whichever API."""
        return [r for r in self.requests if r.summary]

    async def _record(self, request: Request) -> Recorded:
        rec = Recorded(
            request.method,
            request.url.path,
            request.url.query,
            {k.lower(): v for k, v in request.headers.items()},
            await request.body(),
        )
        self.requests.append(rec)
        return rec

    async def _echo(self, request: Request) -> Response:
        rec = await self._record(request)
        if rec.path == "/v1/models":
            entry: dict[str, Any] = {"id": "fake-model"}
            advertised = self.advertised_window or self.context_window
            if advertised is not None:
                entry["max_model_len"] = advertised
            return JSONResponse({"object": "list", "data": [entry]})
        return JSONResponse(
            {"method": rec.method, "path": rec.path, "query": rec.query, "size": len(rec.body)},
            headers={"x-upstream": "yes", "set-cookie": "a=1"},
        )

    async def _count_tokens(self, request: Request) -> Response:
        from tests.support.fakes.anthropic import prompt_tokens

        rec = await self._record(request)
        return JSONResponse({"input_tokens": prompt_tokens(rec.json())})

    async def _serve(self, request: Request) -> Response:
        api = self.apis[request.url.path]
        rec = await self._record(request)
        if self.error is not None:
            status, content, headers = self.error
            return Response(content, status, headers=headers, media_type="application/json")
        body = rec.json()
        rec.summary = summary = api.is_summary(body)
        problem = api.problem(self, body, summary)
        if problem is not None:
            self.rejected.append(problem)
            return api.refuse(problem)
        if self.context_window is not None:
            prompt = api.prompt(body)
            self.max_prompt_seen = max(self.max_prompt_seen, prompt)
            if prompt + api.reserve(body) > self.context_window:
                message, refusal = api.overflow(self, body, prompt)
                self.rejected.append(message)
                return refusal
        if summary:
            self.summary_calls += 1
            failed = await self._summary_failure()
            if failed is not None:
                return failed
            empty = self.summary_failure == "empty"
            text = "   " if empty else self.summary_reply or api.summary_text(self.summary_calls)
        else:
            text = api.reply if self.reply_text is None else self.reply_text
        answer = api.answer(self, body, text, api.usage_prompt(self, body, summary))
        if body.get("stream") is not True:
            return JSONResponse(answer)
        return StreamingResponse(
            self._streamed(api.stream(self, body, answer)), media_type="text/event-stream"
        )

    async def _summary_failure(self) -> Response | None:
        """The failing answer `summary_failure` asks for (None: answer, maybe after a wait)."""
        if self.summary_failure == "status":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if self.summary_failure == "garbage":
            return Response(b"<html>not json", media_type="text/html")
        if self.summary_failure == "slow":  # each call answers, but takes a while
            await anyio.sleep(self.summary_pause)
        if self.summary_failure == "stall":
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not self.unstall.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.01)
        return None

    async def _streamed(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """An API's event stream, lingering after its end; `pacing.closed` once it is over."""
        pacing = self.pacing
        try:
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for chunk in events:
                    yield chunk
            if self.linger_after_done:  # like servers that close the stream a while later
                await anyio.sleep(self.linger_after_done)
        finally:
            if pacing is not None:
                pacing.closed.set()

    async def after_first_chunk(self, body: Any) -> None:
        """What a stream does after its first chunk of text: hold until the proxy hangs up
        (`x_test_hold` in the request, an unknown field forwarded untouched), break, or wait
        for `pacing.release`."""
        if body.get("x_test_hold") is True:  # until the proxy cancels us, bounded
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        if self.break_stream_after_first:
            raise RuntimeError("upstream broke mid-stream")
        pacing = self.pacing
        if pacing is not None:
            pacing.first_sent.set()
            deadline = time.monotonic() + 20
            # `release` is set from the test's thread: poll it, bounded.
            while not pacing.release.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110
                await anyio.sleep(0.005)
