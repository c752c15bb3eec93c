"""The API service: read, compact, forward, relay, record — for any compacting API.

`Api` and `Exchange` are defined in app/proxy/api.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from inflight.apis.anthropic.context_edits import CONTEXT_MANAGEMENT_BETA
from inflight.errors import ProxyError, UpstreamTimeout, UpstreamUnavailable
from inflight.proxy.api import Api, Exchange
from inflight.proxy.body import ClientGone, body_owner, read_body
from inflight.proxy.headers import filter_request_headers, filter_response_headers, without_beta
from inflight.proxy.relay import RelayResponse, RelayResult, buffered_response
from inflight.proxy.restore import (
    Receive,
    RestoreLoop,
    Send,
    offer,
    restore_headers,
    unless_hung_up,
)
from inflight.proxy.restore_stream import follow
from inflight.proxy.reuse import ParsedBodies, Reused
from inflight.proxy.sse_tap import Prefill, SSETap, Usage
from inflight.proxy.upstream import KEY_HEADERS, Upstream, read_all
from inflight.settings import Settings
from inflight.usage.records import Outcome

if TYPE_CHECKING:
    import httpx

    from inflight.compaction.service import CompactionService

logger = logging.getLogger(__name__)


ExchangeHook = Callable[[Exchange], Awaitable[None]]
SentHook = Callable[[Exchange], None]


def usage_from_json(
    content: bytes, read: Callable[[Any], Usage | None] = Usage.from_json
) -> Usage | None:
    """The usage of a JSON answer, read by the API's `read`, with llama.cpp's prefill `timings`;
    None when there is none."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    usage = read(data.get("usage")) if isinstance(data, dict) else None
    if usage is None or not isinstance(data, dict):
        return usage
    return replace(usage, prefill=Prefill.of(data.get("timings")))


class ApiService:
    """Handles one compacting API's route end to end.

    One `ApiService` serves one route (`POST /v1/chat/completions`, `/v1/responses`,
    `/v1/messages`). What differs between the APIs is an `Api` value: its routes, the `WireFormat`
    adapter the compaction service plans through, how its body is checked, how usage and errors
    read, and whether a stream must be asked for usage. A new API adds an `Api` (a module beside
    `app/apis/chat/api.py`) and a route, not branches here.
    """

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        api: Api,
        compactor: CompactionService,
        *,
        on_done: ExchangeHook | None = None,
        on_sent: SentHook | None = None,
        on_answer: ExchangeHook | None = None,
        answer_first: bool = False,
    ) -> None:
        self.api = api
        self._settings = settings
        self._upstream = upstream
        self._compactor = compactor
        self._on_done = on_done
        self._on_sent = on_sent  # the response starts: its ledger row is queued (never waits)
        # what an answer taught (the counter calibrated on its usage; shared with replicas),
        # once per exchange: before its last bytes go when `answer_first` (replicas: the hook
        # bounds its wait), else when it ended, before `on_done`
        self._on_answer = on_answer
        self._answer_first = answer_first and on_answer is not None
        self._bodies = ParsedBodies(api.history) if api.check_rest is not None else None

    async def handle(self, request: Request, client_key_id: str | None = None) -> Response:
        started = time.perf_counter()
        try:
            limit, timeout = self._settings.max_body_bytes, self._settings.body_read_timeout
            raw = await read_body(request, limit, timeout)
            body = self._parse(raw, body_owner(request))
        except ProxyError as exc:
            await self.reject(exc, client_key_id, started)
            raise
        exchange = Exchange(
            self.api,
            model=body["model"],
            stream=body.get("stream") is True,
            raw=raw,
            body=body,
            request_headers=request.headers,
            client_key_id=client_key_id,
            started=started,
        )
        try:
            return await self._forward(request, exchange)
        except ProxyError as exc:
            if not exchange.status:  # not recorded yet: refused by the proxy, or upstream broke
                exchange.status = exc.status_code
                upstream_failed = isinstance(exc, UpstreamTimeout | UpstreamUnavailable)
                exchange.outcome = "upstream_error" if upstream_failed else "rejected"
                await self._finish(exchange)
            raise

    def _parse(self, raw: bytes, owner: bytes) -> dict[str, Any]:
        """The body, parsed only where it is not the remembered body of an earlier request of
        the same `owner` (`body_owner`) it extends (app/proxy/reuse.py), checked as
        `parse_body` checks it."""
        bodies, check = self._bodies, self.api.check_rest
        if bodies is None or check is None:
            return self.api.parse_body(raw)
        reused = bodies.parse(raw, owner)
        if reused is None:
            body = self.api.parse_body(raw)
        else:
            check(reused)
            body = reused.body
            if self.api.history_is_view:  # the history's text: in `raw` already
                texts = self._compactor.texts
                texts.known(body[bodies.key], reused.history_text(raw), self._extends(reused))
        bodies.remember(raw, body, owner, reused)
        return body

    def _extends(self, reused: Reused) -> tuple[bytes, int] | None:
        """The earlier history text the new one is known to begin with, and for how many
        bytes: the bodies' bytes were compared up to the end of the last item reused, and
        both histories start where the bodies' shared bytes put them."""
        assert self._bodies is not None
        earlier = self._compactor.texts.text_of(reused.entry.body[self._bodies.key])
        if earlier is None or not reused.reused:
            return None
        return earlier, reused.ends[reused.reused - 1] - (reused.opened - 1)

    async def reject(
        self, error: ProxyError, client_key_id: str | None, started: float | None = None
    ) -> None:
        """Record a request refused before its body was read (401, 408, 413, bad JSON or
        shape), or whose client hung up before sending it all."""
        gone = isinstance(error, ClientGone)
        await self._finish(
            Exchange(
                self.api,
                model="",
                stream=False,
                raw=b"",
                body={},
                client_key_id=client_key_id,
                status=error.status_code,
                outcome="client_disconnected" if gone else "rejected",
                started=started if started is not None else time.perf_counter(),
            )
        )

    async def _forward(self, request: Request, exchange: Exchange) -> Response:
        """Compact, send (retrying once after an overflow the compactor recovers), relay."""
        route = self._upstream.route(exchange.model, self.api.provider)
        wire = self.api.wire
        self._edit(exchange, route.base_url)
        exchange.compacted = await self._compactor.prepare(
            wire, exchange.request_headers, exchange.body, route.base_url
        )
        restoring = self._restoring(exchange)
        headers = filter_request_headers(
            request.headers.items(),
            api_key=route.api_key,
            identity=True,
            key_header=KEY_HEADERS[self.api.provider],
        )
        if exchange.context_management is not None:
            headers = without_beta(headers, CONTEXT_MANAGEMENT_BETA)
        url = self._upstream.url(
            route, self.api.upstream_path, request.scope.get("query_string", b"")
        )

        async def send_round(body: dict[str, Any]) -> httpx.Response:  # restore's next round
            content = orjson.dumps(body)
            if exchange.stream and self.api.stream_usage is not None:
                content = self.api.stream_usage(content, body)[0]
            return await self._upstream.send("POST", url, headers, content)

        while True:
            forward, tap = self._with_stream_usage(exchange)
            upstream = await self._upstream.send("POST", url, headers, forward)
            if upstream.status_code < 400 and restoring is not None:
                client = (send_round, request.receive)
                return await self._restored(
                    exchange, restoring, (upstream, tap), client, route.base_url
                )
            if upstream.status_code < 400 and tap is not None:
                return self._relay_stream(exchange, upstream, tap, route.base_url)
            content = await read_all(upstream)
            if upstream.status_code >= 400 and not exchange.retried:
                retry = await self._compactor.recover(
                    wire,
                    exchange.request_headers,
                    exchange.body,
                    exchange.compacted,
                    (route.base_url, upstream.status_code, content),
                )
                if retry is not None:
                    exchange.compacted = retry
                    exchange.retried = True
                    restoring = self._restoring(exchange)
                    continue
            return await self._buffered(exchange, upstream, content)

    def _edit(self, exchange: Exchange, base_url: str) -> None:
        """Apply the client's own context editing when it is the proxy's to apply (DESIGN.md
        §13): from here on the request is the edited body, without the field."""
        editing = self.api.context_edits
        if editing is None:
            return
        edited = editing.apply(exchange.body, base_url, self._settings.context_edits)
        if edited is not None:
            exchange.body, exchange.raw = edited.body, orjson.dumps(edited.body)
            exchange.context_management = edited.report()

    def _restoring(self, exchange: Exchange) -> RestoreLoop | None:
        """Restore's loop when it is on and has something to offer on this API (DESIGN.md
        §11); the forwarded body then offers the tool."""
        if exchange.compacted is None or self.api.restore is None:
            return None
        offered = offer(exchange.compacted, self.api.restore)
        if offered is None:
            return None
        loop, exchange.compacted = offered
        return loop

    async def _restored(
        self,
        exchange: Exchange,
        loop: RestoreLoop,
        first: tuple[httpx.Response, SSETap | None],
        client: tuple[Send, Receive],
        base_url: str,
    ) -> Response:
        """Run restore's rounds on a first answer that succeeded, then relay the last one.
        The usage of the rounds before a failing one is the request's (it was spent); a
        client that hangs up meanwhile stops them at once (recorded, nothing to answer)."""
        upstream, tap = first
        send, receive = client
        rounds = partial(follow, loop, upstream, stream=tap is not None)
        try:
            done = await unless_hung_up(receive, upstream, send, rounds)
        finally:
            exchange.rounds, exchange.usage = loop.rounds, loop.usage
        if done is None:
            exchange.status, exchange.outcome = ClientGone.status_code, "client_disconnected"
            await self._finish(exchange)
            return Response(status_code=ClientGone.status_code)
        held = done[0]
        upstream = held.upstream
        if exchange.compacted is not None and loop.rounds > 1:
            report = {**exchange.compacted.headers, **restore_headers(loop)}
            exchange.compacted = replace(exchange.compacted, headers=report)
        if tap is None:
            return await self._buffered(exchange, upstream, held.head)
        loop.prepare(tap)
        if upstream.status_code >= 400:
            return await self._buffered(exchange, upstream, await read_all(upstream))
        return self._relay_stream(exchange, upstream, tap, base_url, (held.head, held.rest))

    async def _buffered(
        self, exchange: Exchange, upstream: httpx.Response, content: bytes
    ) -> Response:
        """A complete answer (or an upstream error), recorded and relayed."""
        exchange.status = upstream.status_code
        exchange.ttfb = time.perf_counter() - exchange.started
        if upstream.status_code >= 400:
            exchange.outcome = "upstream_error"
        else:
            earlier, stated = exchange.usage, usage_from_json(content, self.api.usage)
            exchange.usage = stated or earlier
            if stated is not None and earlier is not None and exchange.rounds > 1:
                exchange.usage = earlier.plus(stated.after(earlier))  # restore: every round's
            base_url = self._upstream.route(exchange.model, self.api.provider).base_url
            self._check_truncation(exchange, base_url)
            editing, report = self.api.context_edits, exchange.context_management
            if editing is not None and report is not None:
                content = editing.answer(content, report)
        if self._answer_first:  # replicas: what it taught is shared before the client reads it
            await self._answered(exchange)
        self._sent(exchange)
        headers = self._response_headers(exchange, upstream)
        # recorded (and, on one replica, the counter calibrated) once the answer is on its way
        after = partial(self._finish, exchange, answered=self._answer_first)
        return buffered_response(content, upstream.status_code, headers, after)

    def _check_truncation(self, exchange: Exchange, base_url: str) -> None:
        """Whether the upstream silently cut what was sent, by the usage it reported: then the
        window is learned and logged, and a JSON answer says so (DESIGN.md §11)."""
        usage, sent = exchange.usage, exchange.compacted
        if usage is not None and sent is not None and exchange.rounds == 1:  # one prompt's usage
            exchange.upstream_truncated = self._compactor.upstream_truncated(
                exchange.model, sent, base_url, usage.prompt_tokens
            )

    def _sent(self, exchange: Exchange) -> None:
        if self._on_sent is not None:
            self._on_sent(exchange)

    def _with_stream_usage(self, exchange: Exchange) -> tuple[bytes, SSETap | None]:
        """The bytes to send, asking for stream usage when the API needs it (DESIGN.md §6)."""
        if not exchange.stream:
            return exchange.forward, None
        if self.api.stream_usage is None:
            return exchange.forward, SSETap(self.api.events)
        forward, strip = self.api.stream_usage(exchange.forward, exchange.sent)
        return forward, SSETap(self.api.events, strip_usage_chunk=strip)

    @staticmethod
    def _response_headers(exchange: Exchange, upstream: httpx.Response) -> list[tuple[str, str]]:
        relayed = [
            (k, v)
            for k, v in filter_response_headers(upstream.headers)
            if k.lower() != "content-encoding"
        ]
        truncated = (
            [("X-Compaction-Upstream-Truncated", "true")] if exchange.upstream_truncated else []
        )
        report = exchange.compacted.headers if exchange.compacted is not None else {}
        return relayed + list(report.items()) + truncated

    def _relay_stream(
        self,
        exchange: Exchange,
        upstream: httpx.Response,
        tap: SSETap,
        base_url: str,
        held: tuple[bytes, AsyncIterator[bytes]] | None = None,
    ) -> RelayResponse:
        exchange.status = upstream.status_code
        answered = False

        def taught(outcome: Outcome) -> None:
            # A stream that ended in an error event (Anthropic's `error`, a Responses
            # `response.failed` or `error`) failed upstream, whatever usage it reported first.
            exchange.outcome = "upstream_error" if tap.error is not None else outcome
            exchange.usage = tap.usage
            if outcome == "completed":  # learned and logged; the headers are gone
                self._check_truncation(exchange, base_url)
            if tap.error is not None and exchange.compacted is not None:
                # An overflow the stream reported once started (OpenAI's Responses API does) is
                # too late to retry; what it teaches holds for the next request.
                failure = (base_url, 400, orjson.dumps({"error": tap.error}))
                self._compactor.learn(self.api.wire, exchange.body, exchange.compacted, failure)

        async def before_final() -> None:  # replicas: the final event waits for the publish
            nonlocal answered
            answered = True
            taught("completed")
            await self._answered(exchange)

        async def on_end(result: RelayResult) -> None:
            if not answered:
                taught(result.outcome)
            elif result.outcome != "completed":  # the final event never reached the client
                exchange.outcome = "upstream_error" if tap.error is not None else result.outcome
            exchange.ttfb = result.ttfb
            await self._finish(exchange, answered=answered)

        editing, report = self.api.context_edits, exchange.context_management
        if editing is not None and report is not None:
            tap.edit = editing.stream(report, tap.edit)
        self._sent(exchange)
        return RelayResponse(
            upstream,
            status_code=upstream.status_code,
            headers=self._response_headers(exchange, upstream),
            tap=tap,
            started=exchange.started,
            on_end=on_end,
            error_frame=self.api.error_frame,
            held=held,
            stall_timeout=self._settings.client_stall_timeout,
            before_final=before_final if self._answer_first else None,
        )

    async def _answered(self, exchange: Exchange) -> None:
        if self._on_answer is not None:
            await self._on_answer(exchange)

    async def _finish(self, exchange: Exchange, answered: bool = False) -> None:
        """The exchange ended (`answered`: what it taught was taken before its last bytes)."""
        compacted = exchange.compacted
        if compacted is not None and 0 < exchange.status < 400:
            compacted.after_answer.run()  # summaries ahead, a quiet request's plan for the cache
        if not answered:
            await self._answered(exchange)
        if self._on_done is not None:
            await self._on_done(exchange)
