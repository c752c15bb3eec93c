"""The fast counting paths give exactly the figures of their straightforward definitions:
the heuristic's bit counts equal its regexes, and exact counts equal tiktoken's own."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.tokens import heuristic as h
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import EncodingSet, load_encodings
from inflight.tokens.heuristic import heuristic_tokens_by_regex
from tests.support import load_traces
from tests.unit.tokens.test_tokens import reference_count


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in [k, *_texts(v)]]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    return []


@pytest.fixture(scope="module")
def encodings(tmp_path_factory: pytest.TempPathFactory) -> EncodingSet:
    return load_encodings(tmp_path_factory.mktemp("tiktoken"))


def test_heuristic_equals_its_regexes_on_the_transcripts() -> None:
    for name, messages in load_traces():
        for text in _texts(messages):
            assert h.heuristic_tokens(text) == heuristic_tokens_by_regex(text), (name, text[:80])


# runs that meet at every boundary the counts look at: words of 6 and 7 letters, blanks,
# newlines, digits, punctuation, non-ASCII letters, CJK, emoji, a lone surrogate, NUL
PIECES = ["a", "Zz", "abcdef", "abcdefg", " ", "\t", "  ", "\n", "\n\n", "\r", "7", "(", "==",
          "é", "ж", "中", "😀", "\ud800", "\0", "\x7f"]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40) | st.text(max_size=80))
def test_heuristic_equals_its_regexes(text: str | list[str]) -> None:
    text = text if isinstance(text, str) else "".join(text)
    assert h.heuristic_tokens(text) == heuristic_tokens_by_regex(text)


@pytest.mark.parametrize("piece", ["abcdefghijklmn", "    ", "\n\n\n", "a1 b2", "x\t\t\ty"])
def test_heuristic_equals_its_regexes_across_chunks(piece: str) -> None:
    """Texts longer than a chunk: a word, a run of blanks or newlines straddling a boundary
    (at every offset) is counted once, as the regexes count it."""
    for offset in range(len(piece) + 8):
        for filler in (".", "a", " ", "é"):
            head = filler * ((h._CHUNK - offset) // len(filler.encode()))
            text = head + piece + filler * 10
            assert h.heuristic_tokens(text) == heuristic_tokens_by_regex(text), (
                piece,
                offset,
                filler,
            )
    rnd = random.Random(len(piece))
    text = "".join(rnd.choices(PIECES, k=200_000))  # several boundaries, anything across them
    assert h.heuristic_tokens(text) == heuristic_tokens_by_regex(text)


@pytest.mark.parametrize(("model", "name"), [("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base")])
def test_exact_counts_equal_tiktoken_on_the_transcripts(
    encodings: EncodingSet, model: str, name: str
) -> None:
    """Every transcript, counted cold, is exactly the cookbook count with tiktoken."""
    enc = encodings.get(name)
    for trace, messages in load_traces():
        counter = ChatTokenCounter(encodings)
        assert counter.count_request(model, {"messages": messages}) == reference_count(
            enc, messages
        ), trace


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_the_ascii_counter_loaded_and_is_what_the_counter_uses(
    encodings: EncodingSet, name: str
) -> None:
    """quicktok (the `fast` extra, which the test extra installs) loads, passes its checks,
    and counts ASCII text."""
    pytest.importorskip("quicktok", reason="the fast extra is not installed")
    fast = encodings.ascii_counter(name)
    assert fast is not None
    calls: list[str] = []
    spy = ChatTokenCounter(
        EncodingSet(
            encodings.encodings,
            encodings.missing,
            {name: lambda t: calls.append(t) or fast(t)},
            encodings.text_counters,
        )
    )
    model = "gpt-4o" if name == "o200k_base" else "gpt-4"
    spy.count_text(model, "plain ASCII")
    spy.count_text(model, "not ASCII: é")
    assert calls == ["plain ASCII"]


ASCII = st.text(alphabet=st.characters(max_codepoint=127), max_size=200)
WORDY = st.lists(
    st.sampled_from(["'s", "'T", "'ll", " ", "  ", "\n", "\r\n", "\t", "123", "4567", "ab", "CD",
                     "Ef", "(", ")", "!!", "<|endoftext|>", "\x00", "\x0b", "x" * 30]),
    max_size=60,
).map("".join)  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(ASCII | WORDY, st.sampled_from(["o200k_base", "cl100k_base"]))
def test_the_ascii_counter_equals_tiktoken(encodings: EncodingSet, text: str, name: str) -> None:
    pytest.importorskip("quicktok", reason="the fast extra is not installed")
    fast = encodings.ascii_counter(name)
    assert fast is not None
    assert fast(text) == len(encodings.get(name).encode_ordinary(text))


def test_a_disagreeing_ascii_counter_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check at load: a tokenizer whose counts differ from tiktoken's is left out."""
    quicktok = pytest.importorskip("quicktok", reason="the fast extra is not installed")

    class Off:
        def __init__(self, name: str, data: str) -> None:
            self._real = quicktok.Tokenizer(name, data)
            self.n_vocab = self._real.n_vocab
            self.decode_single_token_bytes = self._real.decode_single_token_bytes

        def count(self, text: str) -> int:
            return int(self._real.count(text)) + (" " in text)

    monkeypatch.setattr(quicktok, "Tokenizer", Off)
    loaded = load_encodings()
    assert loaded.ascii_counter("o200k_base") is None
    assert loaded.get("o200k_base") is not None


def test_without_quicktok_tiktoken_counts_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default install (no `fast` extra): nothing to import, the same exact counts."""
    import sys

    monkeypatch.setitem(sys.modules, "quicktok", None)  # `import quicktok` raises ImportError
    loaded = load_encodings()
    assert loaded.ascii_counter("o200k_base") is None
    enc = loaded.get("o200k_base")
    for trace, messages in load_traces()[:3]:
        counted = ChatTokenCounter(loaded).count_request("gpt-4o", {"messages": messages})
        assert counted == reference_count(enc, messages), trace


# -- rs_bpe: any valid text (a default dependency where it has wheels) --------------------------

UNICODE_PIECES = ["é", "É", "ß", "ǅ", "İ", "ς", "Σ", "日本", "ｱ", "ー", "😀", "👍🏽", "🇫🇷", "\u0301",
                  "\u0308", "Ⅻ", "١٢", "\u00a0", "\u2028", "\u0085", "\u200b", "\u3000", "ﬁ",
                  "𝔘", "ʼ", "'s", "'LL", " ", "  ", "\n", "\r\n", "\t", "123", "4567", "ab", "CD",
                  "(", "!!", "<|endoftext|>", "\x00", "\x0b"]  # fmt: skip
UNICODE = st.lists(st.sampled_from(UNICODE_PIECES), max_size=50).map("".join)
VALID = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=120)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_the_text_counter_loaded_and_is_what_the_counter_uses(
    encodings: EncodingSet, name: str
) -> None:
    """rs_bpe (installed with inflight where it has a wheel) passes its checks and counts
    the text quicktok does not take: non-ASCII text, or all text without quicktok."""
    pytest.importorskip("rs_bpe.bpe", reason="rs_bpe has no wheel for this platform")
    fast = encodings.text_counter(name)
    assert fast is not None
    calls: list[str] = []
    spy_counter = lambda t: calls.append(t) or fast(t)  # noqa: E731
    model = "gpt-4o" if name == "o200k_base" else "gpt-4"
    with_ascii = ChatTokenCounter(
        EncodingSet(
            encodings.encodings, encodings.missing, encodings.ascii_counters, {name: spy_counter}
        )
    )
    with_ascii.count_text(model, "plain ASCII")
    with_ascii.count_text(model, "not ASCII: é")
    assert calls == (
        ["not ASCII: é"] if encodings.ascii_counter(name) else ["plain ASCII", "not ASCII: é"]
    )
    alone = ChatTokenCounter(
        EncodingSet(encodings.encodings, encodings.missing, {}, {name: spy_counter})
    )
    calls.clear()
    assert alone.count_text(model, "plain ASCII") == len(
        encodings.get(name).encode_ordinary("plain ASCII")
    )
    assert calls == ["plain ASCII"]


@settings(max_examples=800, deadline=None)
@given(UNICODE | VALID | WORDY, st.sampled_from(["o200k_base", "cl100k_base"]))
def test_the_text_counter_equals_tiktoken(encodings: EncodingSet, text: str, name: str) -> None:
    pytest.importorskip("rs_bpe.bpe", reason="rs_bpe has no wheel for this platform")
    fast = encodings.text_counter(name)
    assert fast is not None
    assert fast(text) == len(encodings.get(name).encode_ordinary(text))


@pytest.mark.parametrize("text", ["a\ud800b", "\udfff", "emoji 😀 then \ud83d alone"])
def test_a_lone_surrogate_is_counted_by_tiktoken(encodings: EncodingSet, text: str) -> None:
    """rs_bpe refuses text that is not valid Unicode; tiktoken counts it (as U+FFFD), and so
    does the counter, with or without the faster counters."""
    enc = encodings.get("o200k_base")
    count = encodings.counter("o200k_base")
    assert count is not None
    assert count(text) == len(enc.encode_ordinary(text))
    assert ChatTokenCounter(encodings).count_text("gpt-4o", text) == ChatTokenCounter(
        EncodingSet(encodings.encodings, encodings.missing)
    ).count_text("gpt-4o", text)


def test_a_disagreeing_text_counter_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check at load: an rs_bpe whose counts differ from tiktoken's beyond ASCII (where
    quicktok is not asked) is left out, and tiktoken counts that text."""
    rs_openai = pytest.importorskip(
        "rs_bpe.bpe", reason="rs_bpe has no wheel for this platform"
    ).openai

    class Off:
        def __init__(self) -> None:
            self._real = rs_openai.o200k_base()

        def count(self, text: str) -> int:
            return int(self._real.count(text)) + ("é" in text)

    monkeypatch.setattr(rs_openai, "o200k_base", Off)
    loaded = load_encodings()
    assert loaded.text_counter("o200k_base") is None
    assert loaded.text_counter("cl100k_base") is not None
    count = loaded.counter("o200k_base")
    assert count is not None
    assert count("Café") == len(loaded.get("o200k_base").encode_ordinary("Café"))


def test_without_rs_bpe_tiktoken_counts_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform without an rs_bpe wheel (Python 3.14, 32-bit Linux …), and no `fast`
    extra: nothing to import, the same exact counts."""
    import sys

    for module in ("rs_bpe", "rs_bpe.bpe", "quicktok"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    loaded = load_encodings()
    assert loaded.text_counter("o200k_base") is None
    assert loaded.ascii_counter("o200k_base") is None
    enc = loaded.get("o200k_base")
    for trace, messages in load_traces()[:3]:
        counted = ChatTokenCounter(loaded).count_request("gpt-4o", {"messages": messages})
        assert counted == reference_count(enc, messages), trace


def test_what_counts_each_encoding_is_shown(encodings: EncodingSet, tmp_path: Path) -> None:
    """`counters()` names what counts each encoding's text, in the order asked; /stats and
    the startup banner show it."""
    from inflight.banner import startup_facts
    from tests.conftest import make_settings

    expected = (
        *(["quicktok (ASCII)"] if encodings.ascii_counter("o200k_base") else []),
        *(["rs_bpe"] if encodings.text_counter("o200k_base") else []),
        "tiktoken",
    )
    assert encodings.counters()["o200k_base"] == expected
    assert EncodingSet(encodings.encodings).counters() == {
        "cl100k_base": ("tiktoken",),
        "o200k_base": ("tiktoken",),
    }
    facts = "\n".join(startup_facts(make_settings(tmp_path), (), encodings.counters()))
    assert f"o200k_base by {', '.join(expected)}" in facts


@pytest.mark.anyio
async def test_stats_shows_the_counters(client: Any) -> None:
    stats = (await client.get("/stats")).json()
    counting = stats["token_counting"]
    assert counting["exact_encodings_loaded"] is True
    assert set(counting["counters"]) == {"cl100k_base", "o200k_base"}
    assert counting["counters"]["o200k_base"][-1] == "tiktoken"
    assert ("rs_bpe" in counting["counters"]["o200k_base"]) == _has_rs_bpe()


def _has_rs_bpe() -> bool:
    try:
        from rs_bpe.bpe import openai  # noqa: F401
    except ImportError:
        return False
    return True
