"""End-to-end: restore's loop through real uvicorn servers with the official `openai` and
`anthropic` clients — the scripted upstream calls `inflight_restore`; the client gets only the
final answer, JSON and stream, and the usage of every round; calls the proxy does not answer
never reach it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anthropic
import openai
import pytest

from inflight.factory import create_app
from inflight.proxy.restore import MAX_ROUNDS, NO_ANSWER, TOOL_NAME
from tests.asgi.test_restore_route import ANSWER, CHAT, SECRET
from tests.conftest import make_settings
from tests.support.fake_restore_upstream import FIRST_REF, Call, Reply, ScriptedUpstream
from tests.support.servers import WatchedStore, serve
from tests.unit.proxy.test_restore_stray import BODIES as STRAY_BODIES
from tests.unit.proxy.test_restore_stray import SEARCH

pytestmark = pytest.mark.e2e
MESSAGES_MODEL = "claude-sonnet-4-6"  # the SDK warns on deprecated names


@pytest.mark.parametrize("stream", [False, True])
def test_the_sdk_never_sees_the_restore_tool(tmp_path: Path, stream: bool) -> None:
    upstream = ScriptedUpstream([Reply(calls=(Call(TOOL_NAME, FIRST_REF),)), ANSWER])
    store = WatchedStore()
    with serve(upstream.app) as upstream_url:
        settings = make_settings(
            tmp_path, upstream_url=upstream_url + "/v1", restore=True, context_limit=8192
        )
        app = create_app(settings, store=store)
        with (
            serve(app) as url,
            openai.OpenAI(base_url=url + "/v1", api_key="sk", timeout=20, max_retries=0) as oai,
        ):
            if stream:
                chunks = list(
                    oai.chat.completions.create(
                        model="gpt-4o-mini",
                        messages=CHAT["messages"],
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert not [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
                usage = next(c.usage for c in chunks if c.usage is not None)
            else:
                result = oai.chat.completions.create(model="gpt-4o-mini", messages=CHAT["messages"])
                text = result.choices[0].message.content or ""
                assert result.choices[0].message.tool_calls is None
                usage = result.usage
            (record,) = store.wait_for(1)
    assert text.strip() == ANSWER.text
    assert usage is not None
    assert usage.prompt_tokens == 1000 + 1001  # both rounds
    assert record.prompt_tokens == 2001
    assert len(upstream.bodies) == 2
    assert SECRET in upstream.bodies[1]["messages"][-1]["content"]


# Every API through its official SDK: the answer parses (JSON and the SDK's stream
# accumulator), the tool never shows, and the usage the SDK reads is the sum of every round.
Seen = tuple[str, list[str], int, int]  # text, call names, prompt tokens, completion tokens


def chat_sdk(url: str, stream: bool) -> Seen:
    with openai.OpenAI(base_url=url + "/v1", api_key="sk", timeout=20, max_retries=0) as oai:
        body = {**STRAY_BODIES["/v1/chat/completions"], "stream": stream}
        if not stream:
            result = oai.chat.completions.create(**body)
            message = result.choices[0].message
            assert result.usage is not None
            names = [c.function.name for c in message.tool_calls or ()]  # type: ignore[union-attr]
            usage = result.usage
            return message.content or "", names, usage.prompt_tokens, usage.completion_tokens
        with oai.chat.completions.stream(
            **{k: v for k, v in body.items() if k != "stream"},
            stream_options={"include_usage": True},
        ) as events:
            for _ in events:
                pass
            final = events.get_final_completion()
    message = final.choices[0].message
    names = [c.function.name for c in message.tool_calls or ()]  # type: ignore[union-attr]
    assert final.usage is not None
    usage = final.usage
    return message.content or "", names, usage.prompt_tokens, usage.completion_tokens


def responses_sdk(url: str, stream: bool) -> Seen:
    body = STRAY_BODIES["/v1/responses"]
    with openai.OpenAI(base_url=url + "/v1", api_key="sk", timeout=20, max_retries=0) as oai:
        if stream:
            with oai.responses.stream(**body) as events:
                for _ in events:
                    pass
                result = events.get_final_response()
        else:
            result = oai.responses.create(**body)
    assert TOOL_NAME not in {getattr(t, "name", None) for t in result.tools}
    names = [i.name for i in result.output if i.type == "function_call"]
    assert result.usage is not None
    return result.output_text, names, result.usage.input_tokens, result.usage.output_tokens


def messages_sdk(url: str, stream: bool) -> Seen:
    body = {**STRAY_BODIES["/v1/messages"], "model": MESSAGES_MODEL}
    with anthropic.Anthropic(base_url=url, api_key="sk", timeout=20, max_retries=0) as claude:
        if stream:
            with claude.messages.stream(**body) as events:
                for _ in events:
                    pass
                message = events.get_final_message()
        else:
            message = claude.messages.create(**body)
    text = "".join(b.text for b in message.content if b.type == "text")
    names = [b.name for b in message.content if b.type == "tool_use"]
    return text, names, message.usage.input_tokens, message.usage.output_tokens


SDKS: dict[str, Callable[[str, bool], Seen]] = {
    "/v1/chat/completions": chat_sdk,
    "/v1/responses": responses_sdk,
    "/v1/messages": messages_sdk,
}
CALLING = Reply(calls=(Call(TOOL_NAME, FIRST_REF),))
SCENARIOS: dict[str, tuple[list[Reply], str, list[str]]] = {
    # replies, the text the client reads, its calls' names
    "one round": ([CALLING, ANSWER], ANSWER.text or "", []),
    "stray calls on the last round": ([CALLING] * MAX_ROUNDS, NO_ANSWER, []),
    "a client call beside a stray one": (
        [CALLING, CALLING, Reply(calls=(Call(TOOL_NAME, FIRST_REF), SEARCH))],
        "",
        ["search"],
    ),
}


@pytest.mark.parametrize("route", list(SDKS))
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_sdk_reads_the_final_answer_and_every_rounds_usage(
    tmp_path: Path, route: str, stream: bool, scenario: str
) -> None:
    replies, expected_text, expected_names = SCENARIOS[scenario]
    upstream = ScriptedUpstream(replies)
    store = WatchedStore()
    with serve(upstream.app) as upstream_url:
        settings = make_settings(
            tmp_path,
            upstream_url=upstream_url + "/v1",
            anthropic_upstream_url=upstream_url + "/v1",
            restore=True,
            context_limit=8192,
        )
        with serve(create_app(settings, store=store)) as url:
            text, names, prompt, completion = SDKS[route](url, stream)
            (record,) = store.wait_for(1)
    rounds = len(upstream.bodies)
    assert rounds == len(replies)
    assert (text.strip(), names) == (expected_text, expected_names)
    # the fake states 1000 + k prompt and 10 + k completion tokens for round k
    assert prompt == sum(1000 + k for k in range(rounds))
    assert completion == sum(10 + k for k in range(rounds))
    assert (record.prompt_tokens, record.completion_tokens) == (prompt, completion)


@pytest.mark.parametrize("route", list(SDKS))
def test_a_streamed_text_then_restore_call_reaches_every_sdk_without_the_call(
    tmp_path: Path, route: str
) -> None:
    first = Reply(text="Let me look that up.", calls=(Call(TOOL_NAME, FIRST_REF), SEARCH))
    upstream = ScriptedUpstream([first, ANSWER])
    with serve(upstream.app) as upstream_url:
        settings = make_settings(
            tmp_path,
            upstream_url=upstream_url + "/v1",
            anthropic_upstream_url=upstream_url + "/v1",
            restore=True,
            context_limit=8192,
        )
        with serve(create_app(settings, store=WatchedStore())) as url:
            text, names, prompt, _ = SDKS[route](url, True)
    assert (text.strip(), names) == ("Let me look that up.", ["search"])
    assert prompt == 1000
