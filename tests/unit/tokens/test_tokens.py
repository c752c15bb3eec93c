"""Token counting: exact against an independent o200k/cl100k reference, the heuristic,
images, caching, calibration, and the model table's encoding seam."""

from __future__ import annotations

import base64
import random
import struct
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.tokens.calibration import CLIENT_REACH
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import EncodingSet, load_encodings
from inflight.tokens.heuristic import heuristic_tokens
from inflight.tokens.images import IMAGE_UNKNOWN_SIZE, image_tokens
from tests.support import load_traces

Body = dict[str, Any]


@pytest.fixture(scope="module")
def encodings(tmp_path_factory: pytest.TempPathFactory) -> EncodingSet:
    return load_encodings(tmp_path_factory.mktemp("tiktoken"))


@pytest.fixture
def counter(encodings: EncodingSet) -> ChatTokenCounter:
    return ChatTokenCounter(encodings)


def reference_count(enc: Any, messages: list[dict[str, Any]]) -> int:
    """OpenAI cookbook accounting, written independently of inflight.tokens."""
    total = 3
    for m in messages:
        total += 3 + len(enc.encode_ordinary(m["role"]))
        total += len(enc.encode_ordinary(m.get("content") or ""))
        if "name" in m:
            total += 1 + len(enc.encode_ordinary(m["name"]))
        for call in m.get("tool_calls") or []:
            total += 7  # framing of one call (inflight.tokens.raw_counts.PER_TOOL_CALL)
            total += len(enc.encode_ordinary(call["function"]["name"]))
            total += len(enc.encode_ordinary(call["function"]["arguments"]))
        if m.get("tool_call_id"):
            total += len(enc.encode_ordinary(m["tool_call_id"]))
    return total


@pytest.mark.parametrize(("model", "name"), [("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base")])
def test_exact_count_matches_reference(
    counter: ChatTokenCounter, encodings: EncodingSet, model: str, name: str
) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi <|endoftext|> there", "name": "bob"},
        {"role": "assistant", "content": "Hello! 123456 ünïcödé 漢字"},
    ]
    assert counter.count_request(model, {"messages": messages}) == reference_count(
        encodings.get(name), messages
    )
    assert counter.is_exact(model)
    assert counter.encoding_name(model) == name
    assert not counter.is_exact("llama-3")
    assert counter.encoding_name("llama-3") is None


def test_real_transcripts_within_2_percent_of_exact_o200k(
    counter: ChatTokenCounter, encodings: EncodingSet
) -> None:
    for name, messages in load_traces():
        ours = counter.count_request("gpt-4o", {"messages": messages})
        ref = reference_count(encodings.get("o200k_base"), messages)
        assert abs(ours - ref) / ref < 0.02, name


def test_heuristic_errs_high_on_real_transcripts(encodings: EncodingSet) -> None:
    """Conservative: on the agent transcripts it never reads lower than o200k."""
    enc = encodings.get("o200k_base")
    for name, messages in load_traces():
        texts = [m.get("content") or "" for m in messages]
        exact = sum(len(enc.encode_ordinary(t)) for t in texts)
        estimate = sum(heuristic_tokens(t) for t in texts)
        assert exact <= estimate <= 1.35 * exact, name


def test_long_text_is_counted_in_pieces(counter: ChatTokenCounter, encodings: EncodingSet) -> None:
    text = "line of text number 12345\n" * 20_000  # 520k chars: more than one piece
    exact = len(encodings.get("o200k_base").encode_ordinary(text))
    assert counter.count_text("gpt-4o", text) == exact


def test_tools_reasoning_and_unknown_fields_count(counter: ChatTokenCounter) -> None:
    base = {"role": "user", "content": "look"}
    plain = counter.count_message("gpt-4o", base)
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"q":1}'}}
        ],
    }
    assert counter.count_message("gpt-4o", call) > 7
    legacy = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "f", "arguments": "{}"},
    }
    assert counter.count_message("gpt-4o", legacy) > 7
    answer = {"role": "tool", "tool_call_id": "call_abcdef123456", "content": "ok"}
    assert counter.count_message("gpt-4o", answer) > counter.count_message(
        "gpt-4o", {"role": "tool", "content": "ok"}
    )
    for field in ("reasoning_content", "reasoning"):
        thinking = {"role": "assistant", "content": "ok", field: "long thought " * 50}
        assert counter.count_message("gpt-4o", thinking) > 100
    blocks = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm " * 40, "signature": "x"},
            {"type": "redacted_thinking", "data": "opaque" * 100},
            {"type": "text", "text": "done"},
        ],
    }
    assert 40 < counter.count_message("gpt-4o", blocks) < 100
    unknown = {**base, "x_meta": {"trace": "abc " * 30}}
    assert counter.count_message("gpt-4o", unknown) > plain + 30


def test_fixed_part(counter: ChatTokenCounter) -> None:
    assert counter.count_fixed("gpt-4o", {"messages": []}) == 3
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert counter.count_fixed("gpt-4o", {"tools": tools}) > 3 + 8
    assert counter.count_fixed("gpt-4o", {"functions": [tools[0]["function"]]}) > 3 + 8
    schema = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}
    assert counter.count_fixed("gpt-4o", {"response_format": schema}) > 3
    choice = {"type": "function", "function": {"name": "f"}}
    assert counter.count_fixed("gpt-4o", {"tool_choice": choice}) > 3
    assert counter.count_fixed("gpt-4o", {"tool_choice": "auto"}) == 3
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    assert counter.count_request("gpt-4o", body) == counter.count_fixed(
        "gpt-4o", body
    ) + counter.count_message("gpt-4o", body["messages"][0])


def _png(width: int, height: int) -> str:
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR"
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    blob = header + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return "data:image/png;base64," + base64.b64encode(blob).decode()


def _jpeg(width: int, height: int) -> str:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + bytes(9)
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + bytes(3)
    return "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8" + app0 + sof).decode()


def _gif(width: int, height: int) -> str:
    blob = b"GIF89a" + struct.pack("<HH", width, height) + bytes(3)
    return "data:image/gif;base64," + base64.b64encode(blob).decode()


def _image(url: str, detail: str | None = None) -> dict[str, Any]:
    image: dict[str, Any] = {"url": url}
    if detail:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


@pytest.mark.parametrize(
    ("part", "tokens"),
    [
        (_image("https://x/a.png", "low"), 85),
        (_image(_png(4000, 4000), "low"), 85),
        (_image(_png(1024, 1024), "high"), 765),  # OpenAI's worked example: 4 tiles
        (_image(_png(2048, 4096)), 1105),  # → 1024×2048 → 768×1536: 2×3 tiles
        (_image(_jpeg(512, 512)), 85 + 170),  # small images are not scaled up
        (_image(_gif(100, 100), "auto"), 85 + 170),
        (_image("https://x/a.png"), 85 + 170 * 6),  # unknown size: a 1920×1080 screenshot
        (_image("data:image/png;base64,!!!notbase64"), 1105),
    ],
)
def test_image_tokens(part: dict[str, Any], tokens: int) -> None:
    assert image_tokens(part, "gpt-4o") == tokens
    assert IMAGE_UNKNOWN_SIZE == (1920, 1080)


def test_image_parts_in_messages(counter: ChatTokenCounter) -> None:
    def message(detail: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "text", "text": "see"}, _image("u", detail)]}

    low, high = (
        counter.count_message("gpt-4o", message("low")),
        counter.count_message("gpt-4o", message("high")),
    )
    assert low < high
    assert counter.count_message("gpt-4o-mini", message("low")) > 2833  # mini's image rate
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "A" * 9}}]}
    assert counter.count_message("gpt-4o", audio) >= 1000


def test_heuristic_by_script(encodings: EncodingSet) -> None:
    enc = encodings.get("o200k_base")
    for text in (
        "The quick brown fox jumps over the lazy dog. " * 20,
        "def f(x: int) -> int:\n    return x * 2  # double\n" * 20,
        '{"id": 12345, "items": [1, 2, 3], "name": "flight"}' * 10,
        "Привет, как дела? Это тестовое сообщение на русском языке.",
        "这是一个用于测试的中文句子，我们看看分词器的表现。",
        "😀🎉 emoji party 🚀🚀",
    ):
        exact = len(enc.encode_ordinary(text))
        assert 0.9 * exact <= heuristic_tokens(text) <= 2 * exact, text[:20]
    assert heuristic_tokens("") == 0
    assert heuristic_tokens("漢字漢字") >= 4


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=200), min_size=1, max_size=8), st.text(max_size=200))
def test_adding_a_message_never_lowers_the_count_and_cache_agrees(
    encodings: EncodingSet, texts: list[str], extra: str
) -> None:
    for model in ("gpt-4o", "llama-3.1-8b"):
        counter = ChatTokenCounter(encodings)
        messages = [{"role": "user", "content": t} for t in texts]
        cold = counter.count_request(model, {"messages": messages})
        warm = counter.count_request(model, {"messages": messages})
        fresh = ChatTokenCounter(encodings, cache_size=1).count_request(
            model, {"messages": messages}
        )
        grown = counter.count_request(
            model, {"messages": [*messages, {"role": "assistant", "content": extra}]}
        )
        assert cold == warm == fresh
        assert grown > cold


def test_cache_is_bounded_and_per_instance(encodings: EncodingSet) -> None:
    small = ChatTokenCounter(encodings, cache_size=2)
    for i in range(5):
        small.count_message("gpt-4o", {"role": "user", "content": f"message {i}"})
    assert len(small._cache) == 2
    assert len(ChatTokenCounter(encodings)._cache) == 0


def test_calibration_converges_and_is_bounded(counter: ChatTokenCounter) -> None:
    bodies = [{"messages": [{"role": "user", "content": "word " * n}]} for n in (100, 400, 1600)]
    raw = [counter.count_request("llama-3", b) for b in bodies]
    for _ in range(10):
        for body, r in zip(bodies, raw, strict=True):
            counter.observe("llama-3", body, int(r * 1.2))
    for body, r in zip(bodies, raw, strict=True):  # the deadband: 2 %, or 5 tokens if short
        assert abs(counter.count_request("llama-3", body) - r * 1.2) <= max(r * 1.2, 256) * 0.025
    for _ in range(20):
        for body, r in zip(bodies, raw, strict=True):
            counter.observe("llama-3", body, r * 3)
    # one client's answers alone move the factor on content at most CLIENT_REACH ...
    assert counter.calibration_factors()["llama-3"] == 1.0 + CLIENT_REACH[0]
    for body, r in zip(bodies, raw, strict=True):  # ... unless an overflow error backs them
        counter.observe("llama-3", body, r * 3, overflowed=True)
    for _ in range(20):
        for body, r in zip(bodies, raw, strict=True):
            counter.observe("llama-3", body, r * 3)
    assert counter.calibration_factors()["llama-3"] == 2.0
    counted = [counter.count_request("llama-3", b) for b in bodies]
    for c, r in zip(counted, raw, strict=True):
        assert c <= r * 2 + 2048 + 256  # every part of the correction is bounded
    for _ in range(20):  # no correction within bounds comes near: not a prompt size, ignored
        counter.observe("llama-3", bodies[1], raw[1] * 100)
        counter.observe("llama-3", bodies[1], 11)
    assert [counter.count_request("llama-3", b) for b in bodies] == counted


def test_exact_models_stay_near_one(counter: ChatTokenCounter) -> None:
    body = {"messages": [{"role": "user", "content": "word " * 400}]}
    for _ in range(20):
        counter.observe("gpt-4o", body, 10)
        counter.observe("gpt-4o", body, 100)
    assert counter.calibration_factors().get("gpt-4o", 1.0) == 1.0
    for _ in range(20):
        counter.observe("gpt-4o", body, counter.count_request("gpt-4o", body) * 3 // 2)
    assert 1.09 <= counter.calibration_factors()["gpt-4o"] <= 1.1


class _Table:
    def encoding_for(self, model: str) -> str | None:
        return "cl100k_base" if model.startswith("my-llama") else None


def test_model_table_names_the_encoding(encodings: EncodingSet) -> None:
    counter = ChatTokenCounter(encodings, _Table())
    assert counter.encoding_name("my-llama-3") == "cl100k_base"
    assert counter.encoding_name("gpt-4o") == "o200k_base"  # the built-in families still apply
    assert counter.encoding_name("other") is None


def test_calibration_moves_in_steps_so_plans_stay_put(counter: ChatTokenCounter) -> None:
    """Small response-to-response noise must not change counts (and so compaction cuts)."""
    body = {"messages": [{"role": "user", "content": "word " * 400}]}
    raw = counter.count_request("qwen3", body)
    counter.observe("qwen3", body, int(raw * 1.2))
    settled = counter.count_request("qwen3", body)
    for k in range(40):
        counter.observe("qwen3", body, int(raw * (1.2 + (0.01 if k % 2 else -0.01))))
        assert counter.count_request("qwen3", body) == settled
    for _ in range(25):  # recent responses weigh most: a new level takes over within ~20
        counter.observe("qwen3", body, int(raw * 1.3))
    assert abs(counter.count_request("qwen3", body) / (raw * 1.3) - 1) < 0.03


# -- calibration against an upstream whose chat template has fixed costs ----------------------
_TEXT = (
    "the build failed because a test in the parser module raised an error on line seven when "
    "its input was empty so we patched it and reran everything twice"
)
_WORDS = _TEXT.split()


def _conversation(rnd: random.Random, messages: int, words: int, system: bool = True) -> Body:
    out: list[dict[str, Any]] = (
        [{"role": "system", "content": "You are a coding agent."}] if system else []
    )
    for k in range(messages):
        text = " ".join(rnd.choice(_WORDS) for _ in range(words))
        out.append({"role": "user" if k % 2 == 0 else "assistant", "content": text})
    return {"model": "llama-3", "messages": out}


def _fixed_cost_upstream(body: Body) -> int:
    """A tokenizer reading content 10 % denser than the heuristic, and a chat template costing
    4 tokens per message and 25 per request whatever the content."""
    messages = body["messages"]
    content = sum(heuristic_tokens(m["content"]) for m in messages)
    return round(1.1 * content + 4 * len(messages) + 25)


def _short(rnd: random.Random) -> Body:
    return _conversation(rnd, rnd.randint(1, 3), rnd.randint(5, 60), system=rnd.random() < 0.5)


def _long(rnd: random.Random) -> Body:
    return _conversation(rnd, rnd.randint(20, 60), rnd.randint(30, 200))


def _worst_error(counter: ChatTokenCounter, bodies: list[Body]) -> float:
    return max(
        abs(counter.count_request("llama-3", b) - _fixed_cost_upstream(b)) / _fixed_cost_upstream(b)
        for b in bodies
    )


def test_fixed_template_costs_short_and_long_prompts_both_right(
    counter: ChatTokenCounter,
) -> None:
    """After a mix of short and long requests, prompts of either kind that the counter has
    never seen are estimated within a few per cent (DESIGN.md §5 "Calibration")."""
    rnd = random.Random(7)
    for i in range(30):
        body = _long(rnd) if i % 3 == 0 else _short(rnd)
        counter.observe("llama-3", body, _fixed_cost_upstream(body))
    assert _worst_error(counter, [_long(rnd) for _ in range(30)]) < 0.025
    assert _worst_error(counter, [_short(rnd) for _ in range(30)]) < 0.06


def test_short_requests_first_do_not_inflate_a_long_one(counter: ChatTokenCounter) -> None:
    """The drift real clients hit: a factor learned on short prompts, which are mostly template
    overhead, once multiplied long prompts by ~1.3 (and compacted at half the real window)."""
    rnd = random.Random(11)
    for _ in range(30):
        body = _conversation(rnd, rnd.randint(1, 3), rnd.randint(40, 120))
        counter.observe("llama-3", body, _fixed_cost_upstream(body))
    long_prompts = [_long(rnd) for _ in range(10)]
    assert _worst_error(counter, long_prompts) < 0.05
    body = long_prompts[0]
    counter.observe("llama-3", body, _fixed_cost_upstream(body))
    assert _worst_error(counter, long_prompts[1:]) < 0.03


def test_a_tool_preamble_is_not_read_as_content(counter: ChatTokenCounter) -> None:
    """Short agent requests carry tool definitions, and the template puts a long preamble
    before them: that is a cost per request with tools, not a factor on every token."""
    tools = [
        {"type": "function", "function": {"name": f"tool_{k}", "parameters": {"type": "object"}}}
        for k in range(3)
    ]
    rnd = random.Random(5)
    for i in range(24):
        body = _conversation(rnd, rnd.randint(1, 3), rnd.randint(20, 120))
        preamble = 0
        if i % 2:
            body["tools"] = tools
            preamble = 150 + counter.raw_fixed(None, {"tools": tools})
        counter.observe("llama-3", body, _fixed_cost_upstream(body) + preamble)
    assert _worst_error(counter, [_long(rnd) for _ in range(10)]) < 0.05
    assert counter.calibration()["llama-3"]["with_tools"] > 100


def test_an_overflow_count_recalibrates_at_once(counter: ChatTokenCounter) -> None:
    """An overflow error that states the prompt's size corrects the counter at once (no
    deadband), so a retry planned with it differs from what failed (DESIGN.md §8)."""
    rnd = random.Random(3)
    for _ in range(10):
        body = _long(rnd)
        counter.observe("llama-3", body, _fixed_cost_upstream(body))
    failed = _long(rnd)
    before = counter.count_request("llama-3", failed)
    stated = int(before * 1.015)  # within the deadband: a plain observation would not move
    counter.observe("llama-3", failed, stated)
    assert counter.count_request("llama-3", failed) == before
    counter.observe("llama-3", failed, stated, overflowed=True)
    assert counter.count_request("llama-3", failed) >= stated


def test_calibration_reports_every_part(counter: ChatTokenCounter) -> None:
    body = {"messages": [{"role": "user", "content": "word " * 400}]}
    for _ in range(5):
        counter.observe("qwen3", body, 500)
    detail = counter.calibration()["qwen3"]
    assert set(detail) == {"content", "per_message", "per_request", "without_system", "with_tools"}
    assert counter.calibration_factors() == {"qwen3": detail["content"]}
