"""The token estimate for model families whose tokenizer inflight does not have."""

from __future__ import annotations

import math
import re

# Weights fitted by least squares on the agent transcripts in ../shared/traces against Qwen2.5's
# tokenizer (llama.cpp /tokenize), then rounded up, so the estimate errs on the side of compacting
# early; per-model calibration (app/tokens/calibration.py) corrects it from the upstream's counts.
_DENSE = (  # scripts of about one token per character or worse: CJK, kana, hangul, Greek, Indic…
    "\u0370-\u03ff\u0590-\u1fff\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff00-\uffef"
)
_WORD = re.compile(r"[A-Za-z]+")  # about one token, plus a little per letter past six
_LONG_WORD = re.compile(r"[A-Za-z]{7,}")
_DIGIT = re.compile(r"[0-9]")  # Qwen, Gemma, Mistral split numbers into single digits
_NEWLINES = re.compile(r"\n+")
_SPACE_RUN = re.compile(r"[ \t]{2,}")  # indentation; single spaces merge into the next word
_SYMBOL = re.compile(r"[!-/:-@\[-`{-~]")  # ASCII punctuation: pairs often merge ("()", "==")
_DENSE_CHAR = re.compile(f"[{_DENSE}]")
_ALPHA_RUN = re.compile(f"[^\\W\\d_A-Za-z{_DENSE}]+")  # accented Latin, Cyrillic: ~3 chars/token
_OTHER_SYMBOL = re.compile(f"[^\\w\\s{_DENSE}!-/:-@\\[-`{{-~]")  # emoji and the like
W_WORD, W_LONG_LETTER, W_DIGIT, W_NEWLINES, W_SPACE_RUN, W_SYMBOL = 1.1, 0.07, 1.4, 0.6, 1.0, 0.6
W_DENSE, W_ALPHA_RUN, W_ALPHA_CHAR, W_OTHER_SYMBOL = 1.0, 1.0, 1 / 3, 2.0


# Each ASCII byte's feature as one bit (non-ASCII bytes have none), for the counts below.
_LETTER, _NEWLINE, _BLANK, _DIGIT_BIT, _SYMBOL_BIT = 1, 2, 4, 8, 16
_CLASSES = bytes(
    _LETTER * bool(_WORD.fullmatch(chr(b)))
    | _NEWLINE * (b == 0x0A)
    | _BLANK * (b in (0x20, 0x09))
    | _DIGIT_BIT * bool(_DIGIT.fullmatch(chr(b)))
    | _SYMBOL_BIT * bool(_SYMBOL.fullmatch(chr(b)))
    for b in range(256)
)
_CHUNK = 65_536  # bytes counted at a time; longer texts in pieces (the masks are this long)
_LOOKBACK = 8  # a feature at a byte depends on at most the 6 bytes before it
_MASKS = {
    bit: int.from_bytes(bytes([bit]) * (_CHUNK + _LOOKBACK), "big")
    for bit in (_LETTER, _NEWLINE, _BLANK, _DIGIT_BIT, _SYMBOL_BIT)
}


def _features(data: bytes) -> tuple[int, int, int, int, int, int]:
    """Counts of the bytes of `data` (at most _CHUNK + _LOOKBACK) that start a word, are a
    word's seventh letter or later, are a digit, start a run of newlines, are the second of a
    run of blanks, are ASCII punctuation — what the regexes above find, as one bit per byte of
    a big integer (the previous byte's bit is the integer shifted right by 8)."""
    x = int.from_bytes(data.translate(_CLASSES), "big")
    letters, newlines, blanks = (x & _MASKS[b] for b in (_LETTER, _NEWLINE, _BLANK))
    pairs = letters & (letters >> 8)
    fours = pairs & (pairs >> 16)
    two_blanks = blanks & (blanks >> 8)
    return (
        (letters & ~(letters >> 8)).bit_count(),
        (fours & (fours >> 24)).bit_count(),  # seven letters in a row end here
        (x & _MASKS[_DIGIT_BIT]).bit_count(),
        (newlines & ~(newlines >> 8)).bit_count(),
        (two_blanks & ~(blanks >> 16)).bit_count(),
        (x & _MASKS[_SYMBOL_BIT]).bit_count(),
    )


def _ascii_features(data: bytes) -> tuple[int, ...]:
    """`_features` of any length of `data`: chunk by chunk, each counted with the bytes before
    it and less what those bytes count on their own.

    The ASCII features are counted at C speed rather than with one regex pass each: the UTF-8 bytes
    are mapped to one bit per feature (`bytes.translate`), read as one big integer, and counted with
    shifts, masks and `int.bit_count`. A non-ASCII character is non-ASCII bytes in UTF-8, so it
    separates ASCII runs exactly as the character does. The figures are those of the regexes above,
    which say what is counted (tests check that both agree).
    """
    if len(data) <= _CHUNK:
        return _features(data)
    counts = [0] * 6
    for start in range(0, len(data), _CHUNK):
        head = max(0, start - _LOOKBACK)
        found = _features(data[head : start + _CHUNK])
        before = _features(data[head:start]) if head < start else (0,) * 6
        counts = [c + f - b for c, f, b in zip(counts, found, before, strict=True)]
    return tuple(counts)


def heuristic_tokens(text: str) -> int:
    """Estimate BPE tokens of `text` without a tokenizer, from counts of words, digits,
    symbols, whitespace runs and non-Latin characters (see the weights above)."""
    if not text:
        return 0
    words, long_letters, digits, newlines, blanks, symbols = _ascii_features(
        text.encode("utf-8", "surrogatepass")
    )
    total = (
        W_WORD * words
        + W_LONG_LETTER * long_letters
        + W_DIGIT * digits
        + W_NEWLINES * newlines
        + W_SPACE_RUN * blanks
        + W_SYMBOL * symbols
    )
    return max(1, math.ceil(total + non_ascii_tokens(text)))


def heuristic_tokens_by_regex(text: str) -> int:
    """`heuristic_tokens` counted as the regexes define it, one pass per feature: the former
    code, slower (kept for the tests and the bench to compare)."""
    if not text:
        return 0
    longs = _LONG_WORD.findall(text)
    total = (
        W_WORD * len(_WORD.findall(text))
        + W_LONG_LETTER * (sum(map(len, longs)) - 6 * len(longs))
        + W_DIGIT * len(_DIGIT.findall(text))
        + W_NEWLINES * len(_NEWLINES.findall(text))
        + W_SPACE_RUN * len(_SPACE_RUN.findall(text))
        + W_SYMBOL * len(_SYMBOL.findall(text))
    )
    return max(1, math.ceil(total + non_ascii_tokens(text)))


def non_ascii_tokens(text: str) -> float:
    """The estimate's share for non-ASCII characters: dense scripts, runs of other letters
    (accented Latin, Cyrillic…) and other symbols."""
    if text.isascii():
        return 0.0
    runs = _ALPHA_RUN.findall(text)
    return (
        W_DENSE * len(_DENSE_CHAR.findall(text))
        + W_ALPHA_RUN * len(runs)
        + W_ALPHA_CHAR * sum(map(len, runs))
        + W_OTHER_SYMBOL * len(_OTHER_SYMBOL.findall(text))
    )
