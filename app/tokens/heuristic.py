"""The token estimate for model families whose tokenizer inflight does not have.

Weights were fitted by least squares on the agent transcripts in ../shared/traces against
Qwen2.5's tokenizer (llama.cpp /tokenize), then rounded up, so it errs on the side of compacting
early; per-model calibration (app/tokens.py) corrects it from the upstream's own counts.
"""

from __future__ import annotations

import math
import re

# By script: it reads 0–12 % high against Qwen2.5 and 0–25 % high against o200k.
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


def heuristic_tokens(text: str) -> int:
    """Estimate BPE tokens of `text` without a tokenizer, from counts of words, digits,
    symbols, whitespace runs and non-Latin characters (see the weights above)."""
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
    if not text.isascii():
        runs = _ALPHA_RUN.findall(text)
        total += (
            W_DENSE * len(_DENSE_CHAR.findall(text))
            + W_ALPHA_RUN * len(runs)
            + W_ALPHA_CHAR * sum(map(len, runs))
            + W_OTHER_SYMBOL * len(_OTHER_SYMBOL.findall(text))
        )
    return max(1, math.ceil(total))
