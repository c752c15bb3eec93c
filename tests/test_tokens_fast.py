"""The fast counting paths give exactly the figures of their straightforward definitions:
the heuristic's bit counts equal its regexes, and exact counts equal tiktoken's own."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.tokens import heuristic as h
from app.tokens.counter import ChatTokenCounter
from app.tokens.encodings import EncodingSet, load_encodings
from app.tokens.heuristic import heuristic_tokens_by_regex
from tests.support import load_traces
from tests.test_tokens import reference_count


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
    spy = ChatTokenCounter(encodings)
    spy._tokenizers[name] = (encodings.get(name), lambda t: calls.append(t) or fast(t))
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

    from app.tokens import encodings as encodings_module

    class Off:
        def __init__(self, name: str, data: str) -> None:
            self._real = quicktok.Tokenizer(name, data)
            self.n_vocab = self._real.n_vocab
            self.decode_single_token_bytes = self._real.decode_single_token_bytes

        def count(self, text: str) -> int:
            return int(self._real.count(text)) + (" " in text)

    monkeypatch.setattr(quicktok, "Tokenizer", Off)
    monkeypatch.setattr(encodings_module, "_ascii_counters", {})
    loaded = load_encodings()
    assert loaded.ascii_counter("o200k_base") is None
    assert loaded.get("o200k_base") is not None


def test_without_quicktok_tiktoken_counts_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default install (no `fast` extra): nothing to import, the same exact counts."""
    import sys

    from app.tokens import encodings as encodings_module

    monkeypatch.setitem(sys.modules, "quicktok", None)  # `import quicktok` raises ImportError
    monkeypatch.setattr(encodings_module, "_ascii_counters", {})
    loaded = load_encodings()
    assert loaded.ascii_counter("o200k_base") is None
    enc = loaded.get("o200k_base")
    for trace, messages in load_traces()[:3]:
        counted = ChatTokenCounter(loaded).count_request("gpt-4o", {"messages": messages})
        assert counted == reference_count(enc, messages), trace
