"""A reused parse (app/proxy/reuse.py) against `orjson.loads`, differentially: on any bytes sent
after any earlier bodies, the body is the same value, keys in the same order, or both refuse
it. Bodies come from hypothesis and from the shipped transcripts, mutated where a reuse could
go wrong: duplicate keys at every level, trailing commas, cut-off bodies, reordered keys,
escapes, whitespace, number forms, stray bytes."""

from __future__ import annotations

import json
import random
from functools import cache
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from inflight.proxy.body import body_owner
from inflight.proxy.reuse import ParsedBodies
from tests.support import load_traces

pytestmark = pytest.mark.filterwarnings(
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)

REFUSED = object()  # what a full parse gives for bytes that are not JSON
OWNERS = (b"client-a", b"client-b")
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
GAPS = (b"", b"", b"", b" ", b"\n", b"\t ", b"\r\n")
TOKENS = (b",", b" ", b"]", b"}", b"{", b'"', b"\\", b"0", b"-", b"e", b",]", b",}", b"[")
KEYS_AGAIN = (b'"model":"evil",', b',"model":"evil"', b'"messages":[],', b',"input":[]', b"}{}")


@cache
def trace_histories() -> tuple[tuple[dict[str, Any], ...], ...]:
    """The first 40 messages of every shipped transcript."""
    return tuple(tuple(messages[:40]) for _, messages in load_traces())


class Writer:
    """JSON text of a value, canonical (orjson's) but where `rng` picks another form: keys
    reordered or repeated, whitespace, trailing commas, escapes, number forms (some of them
    not JSON at all: what matters is what `orjson.loads` makes of them)."""

    def __init__(self, rng: random.Random, odd: float) -> None:
        self.rng, self.odd = rng, odd

    def value(self, value: Any) -> bytes:
        if not self.odd:
            return orjson.dumps(value)
        if self.rng.random() >= self.odd:
            if isinstance(value, dict):
                return self.object(list(value.items()))
            if isinstance(value, list):
                return self.array([self.value(v) for v in value])
            return orjson.dumps(value)
        if isinstance(value, dict):
            pairs = list(value.items())
            if pairs and self.rng.random() < 0.5:  # a key twice, either value last
                name, kept = self.rng.choice(pairs)
                other = self.rng.choice([None, "dup", 0, [], {"x": 1}, kept])
                at = self.rng.randrange(len(pairs) + 1)
                pairs.insert(at, (name, other))
            if self.rng.random() < 0.3:
                self.rng.shuffle(pairs)
            return self.object(pairs)
        if isinstance(value, list):
            return self.array([self.value(v) for v in value])
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, bool) or value is None:
            return self.rng.choice([orjson.dumps(value), b" " + orjson.dumps(value)])
        if isinstance(value, int):
            forms = [f"{value}.0", f"{value}e0", f"{value}E+0", "-0", str(value) + "0" * 20]
            if self.rng.random() < 0.1:  # not JSON
                forms = [f"0{value}", f"{value}.", f"+{value}"]
            return self.rng.choice(forms).encode()
        assert isinstance(value, float)
        return self.rng.choice([repr(value), f"{value:.17g}", f"{value:e}", "1e400"]).encode()

    def string(self, text: str) -> bytes:
        form = self.rng.randrange(3) if self.rng.random() < 0.97 else 3
        if form == 0:
            return json.dumps(text, ensure_ascii=True).encode()
        if form == 1:
            return orjson.dumps(text).replace(b"/", b"\\/")
        if form == 2 and text:
            i = self.rng.randrange(len(text))
            head = orjson.dumps(text[:i])[:-1]
            escape = f"\\u{ord(text[i]):04x}".encode() if ord(text[i]) < 0xD800 else b"\\ud800"
            return head + escape + orjson.dumps(text[i + 1 :])[1:]
        return orjson.dumps(text)[:-1] + self.rng.choice([b"\\", b"\\x", b"\x00", b"\xff"]) + b'"'

    def gap(self) -> bytes:
        return self.rng.choice(GAPS) if self.rng.random() < self.odd else b""

    def comma(self) -> bytes:
        return b"," if self.rng.random() < self.odd / 10 else b""

    def object(self, pairs: list[tuple[str, Any]]) -> bytes:
        parts = [
            self.gap() + self.string_key(k) + self.gap() + b":" + self.gap() + self.value(v)
            for k, v in pairs
        ]
        return b"{" + b",".join(parts) + (self.comma() if parts else b"") + self.gap() + b"}"

    def string_key(self, key: str) -> bytes:
        return self.string(key) if self.rng.random() < self.odd / 2 else orjson.dumps(key)

    def array(self, items: list[bytes]) -> bytes:
        inner = b",".join(self.gap() + item for item in items)
        return b"[" + inner + (self.comma() if items else b"") + self.gap() + b"]"


def body_text(
    body: dict[str, Any], key: str, writer: Writer, odd_from: int, tail_odd: float
) -> bytes:
    """`body`'s text: its history items before `odd_from` canonical, the rest and its other
    keys (the odds of `tail_odd`) as `writer` picks."""
    odd = writer.odd
    parts = []
    for name, value in body.items():
        writer.odd = tail_odd
        if name != key:
            parts.append(writer.string_key(name) + b":" + writer.value(value))
            continue
        items = []
        for i, item in enumerate(value):
            writer.odd = tail_odd if i >= odd_from else 0.0
            items.append(writer.value(item))
        writer.odd = tail_odd
        parts.append(
            orjson.dumps(name) + b":" + writer.array(items) if items else b'"%s":[]' % key.encode()
        )
    writer.odd = odd
    return b"{" + b",".join(parts) + b"}"


def mangled(raw: bytes, rng: random.Random, shared: int) -> bytes:
    """`raw` with one byte-level edit, mostly past its first `shared` bytes (where a reuse
    stops comparing): cut short, a token put in, a span taken out, a byte changed."""
    at = rng.randrange(shared, len(raw) + 1) if rng.random() < 0.8 else rng.randrange(len(raw) + 1)
    edit = rng.randrange(4)
    if edit == 0:
        return raw[:at]
    if edit == 1:
        token = rng.choice([*TOKENS, *KEYS_AGAIN, b"\xc3"])
        return raw[:at] + token + raw[at:]
    if edit == 2:
        return raw[:at] + raw[at + rng.randrange(1, 40) :]
    return raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1 :]


def full_parse(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return REFUSED


def through_reuse(bodies: ParsedBodies, raw: bytes, owner: bytes) -> tuple[Any, int]:
    """As the API service parses: from a remembered body when it can, else in full; a JSON
    object with its history remembered. Also how many items were reused."""
    reused = bodies.parse(raw, owner)
    if reused is None:
        body = full_parse(raw)
        if isinstance(body, dict):
            bodies.remember(raw, body, owner)
        return body, 0
    assert reused.entry.owner == owner  # never another client's
    bodies.remember(raw, reused.body, owner, reused)
    return reused.body, reused.reused


def same(got: Any, expected: Any) -> bool:
    """The same value with the keys in the same order, or both refused."""
    if expected is REFUSED or got is REFUSED:
        return got is expected
    return bool(got == expected) and orjson.dumps(got) == orjson.dumps(expected)


MESSAGES = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.text(max_size=40)},
    optional={"tool_call_id": st.text(max_size=4), "name": st.text(max_size=4)},
)


@st.composite
def histories(draw: st.DrawFn) -> list[Any]:
    """A transcript's first messages, or generated items (any JSON value: the reuse does not
    read them) after a system prompt long enough to be remembered."""
    if draw(st.booleans()):
        return list(draw(st.sampled_from(trace_histories())))
    system = {"role": "system", "content": "You are an agent. " * 40 + draw(st.text(max_size=20))}
    items = draw(st.lists(MESSAGES | JSON_VALUES, min_size=1, max_size=12))
    return [system, *items]


@given(histories(), st.sampled_from(["messages", "input"]), st.data())
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
def test_the_reuse_parses_every_byte_string_as_orjson_does(
    history: list[Any], key: str, data: st.DataObject
) -> None:
    """A few bodies of one conversation (growing, retried, some not canonical, from two
    clients), then more, mutated: every one parses to what `orjson.loads` gives."""
    rng = random.Random(data.draw(st.integers(0, 2**64)))  # uniform (hypothesis's favour edges)
    before = data.draw(
        st.dictionaries(
            st.sampled_from(["model", "stream", "system", "n"]), JSON_VALUES, max_size=3
        )
    )
    after = data.draw(
        st.dictionaries(
            st.sampled_from(["model", "stream", "tools", "temperature"]), JSON_VALUES, max_size=3
        )
    )
    bodies = ParsedBodies(key, entries=data.draw(st.sampled_from([1, 3, 64])))
    writer = Writer(rng, 0.0)
    length = 1
    for _ in range(data.draw(st.integers(2, 8))):  # growing, retried, or branching off
        length = max(1, min(len(history), length + data.draw(st.integers(-2, 4))))
        body = {**before, key: history[:length], **after}
        odd = rng.choice([0.0, 0.0, 0.0, 0.05, 0.3])
        odd_from = rng.randint(max(0, length - 3), length) if rng.random() < 0.7 else 0
        raw = body_text(body, key, writer, odd_from, odd)
        if rng.random() < 0.25:  # the first finding: a key again, after the history
            raw = raw[:-1] + b',"' + rng.choice([*before, "model"]).encode()
            raw += b'":"evil-model"}'
        if rng.random() < 0.2:
            raw = mangled(raw, rng, len(raw) // 2)
        owner = OWNERS[rng.random() < 0.2]
        got, _ = through_reuse(bodies, raw, owner)
        assert same(got, full_parse(raw)), raw
    assert bodies.intact()


def mutations(raw: bytes, ends: list[int]) -> list[bytes]:
    """Bytes near `raw` (a canonical body whose history items end at `ends`) that a reuse of
    a remembered prefix must not get wrong."""
    last = ends[-1]
    close = raw.index(b"]", last)
    out = [
        raw[:last] + b",]" + raw[close + 1 :],  # a trailing comma in the history
        raw[:-1] + b",}",  # a trailing comma in the body
        raw[:-1] + b',"model":"evil-model"}',  # a key again, after the history
        raw[:-1] + b',"messages":[]}',  # the history again
        raw[:-1] + b"} ",  # whitespace after the body
        raw[:-1] + b"}x",  # bytes after the body
        raw[:last] + b" ]" + raw[close + 1 :],
        raw[:last] + b',{"role":"user","content":"x","role":"system"}' + raw[close:],
        raw[:last] + b',{"role":"user","content":"x",}' + raw[close:],
        raw[:last] + b',{"role":"user","content":"\\u0078"}' + raw[close:],
        raw[:last] + b',{"role":"user","content":"x","n":1.0}' + raw[close:],
        raw[:last] + b',{"role":"user","content":"x","n":01}' + raw[close:],
        raw[:last] + b',{"role":"user","content":"x","n":1e400}' + raw[close:],
        raw[:last] + b",," + raw[last + 1 :],
        raw[:last] + b"," + raw[close:],
    ]
    for end in ends[-4:]:
        out += [raw[:end], raw[: end + 1], raw[: end - 1], raw[:end] + b"]", raw[:end] + b"]}"]
    return out


@pytest.mark.parametrize("trace", range(len(trace_histories())))
def test_mutations_of_each_transcript_parse_as_orjson_does(trace: int) -> None:
    """Every transcript's conversation, request after request, each followed by bytes near
    it (remembered or not): duplicates, trailing commas, cut-off bodies, escapes, numbers."""
    history = list(trace_histories()[trace])
    bodies = ParsedBodies("messages")
    for length in range(2, len(history) + 1, 3):
        body = {"model": "gpt-4o", "messages": history[:length]}
        raw = orjson.dumps(body)
        got, _ = through_reuse(bodies, raw, OWNERS[0])
        assert same(got, body)
        ends = [
            len(orjson.dumps({"model": "gpt-4o", "messages": history[: i + 1]})) - 2
            for i in range(length)
        ]
        for near in mutations(raw, ends):
            got, _ = through_reuse(bodies, near, OWNERS[0])
            assert same(got, full_parse(near)), near[-200:]
    assert bodies.intact()


def test_a_repeated_key_in_one_body_never_reaches_another() -> None:
    """Finding 1, in the parser: a body whose bytes repeat a key after the history is not
    remembered as reusable, so a later canonical body keeps its own keys."""
    system = {"role": "system", "content": "s" * 600}
    bodies = ParsedBodies("messages")
    first = orjson.dumps({"model": "gpt-4o", "messages": [system]})
    through_reuse(bodies, first, OWNERS[0])
    poisoned = orjson.dumps(
        {"model": "gpt-4o", "messages": [system, {"role": "user", "content": "x"}]}
    )
    poisoned = poisoned[:-1] + b',"model":"evil-model"}'
    assert through_reuse(bodies, poisoned, OWNERS[0])[0]["model"] == "evil-model"
    history = [system, {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    clean = orjson.dumps({"model": "gpt-4o", "messages": history})
    for owner in OWNERS:
        assert through_reuse(bodies, clean, owner)[0] == orjson.loads(clean)


def test_a_trailing_comma_after_a_remembered_body_is_refused() -> None:
    """Finding 2, in the parser: `…"a"},]}` is not JSON, however much of it was seen before."""
    messages = [{"role": "system", "content": "s" * 600}, {"role": "user", "content": "a"}]
    bodies = ParsedBodies("messages")
    raw = orjson.dumps({"model": "gpt-4o", "messages": messages})
    through_reuse(bodies, raw, OWNERS[0])
    assert bodies.parse(raw[:-2] + b",]}", OWNERS[0]) is None
    assert through_reuse(bodies, raw[:-2] + b",]}", OWNERS[0])[0] is REFUSED


def test_a_growing_conversation_is_still_reused() -> None:
    """What the reuse is for: each canonical request of a growing conversation parses only
    the items it adds, for its own client only."""
    history = list(trace_histories()[1])
    bodies = ParsedBodies("messages")
    counts = []
    for length in range(5, len(history)):
        raw = orjson.dumps({"model": "gpt-4o", "messages": history[:length], "stream": False})
        counts.append(through_reuse(bodies, raw, OWNERS[0])[1])
    assert counts[1:] == list(range(5, len(history) - 1))
    raw = orjson.dumps({"model": "gpt-4o", "messages": history, "stream": False})
    assert through_reuse(bodies, raw, OWNERS[1])[1] == 0  # another client: parsed in full


def test_a_body_is_owned_by_every_credential_sent_and_the_route() -> None:
    """`body_owner`: the same credentials, the same owner; any other header or value,
    or another route, another."""

    def identity(path: str, *headers: tuple[bytes, bytes]) -> bytes:
        scope = {"type": "http", "method": "POST", "path": path, "headers": list(headers)}
        return body_owner(Request(scope))

    chat = "/v1/chat/completions"
    a = identity(chat, (b"authorization", b"Bearer key-a"), (b"content-type", b"x"))
    assert a == identity(chat, (b"authorization", b"Bearer key-a"))
    assert a == identity(chat, (b"Authorization", b"Bearer key-a"))
    others = [
        identity(chat),
        identity(chat, (b"authorization", b"Bearer key-b")),
        identity(chat, (b"authorization", b"Basic key-a")),
        identity(chat, (b"x-api-key", b"Bearer key-a")),
        identity(chat, (b"api-key", b"Bearer key-a")),
        identity(chat, (b"authorization", b"Bearer key-a"), (b"x-api-key", b"k")),
        identity("/v1/responses", (b"authorization", b"Bearer key-a")),
    ]
    assert len({a, *others}) == len(others) + 1
