"""Identifiers in text, found without a tokenizer: the exact details a compaction must keep
reachable (DESIGN.md §14) — paths, URLs, ids and hashes, numbers with units, error codes and
exception names, quoted strings, function and class names — and the summary's exact-fact
guard, which appends, verbatim and bounded, those of a span that a summary's text lost.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal[
    "url", "path", "uuid", "hash", "ticket", "issue", "number", "version", "quantity",
    "error", "exception", "call", "snake", "camel", "dotted", "quoted",
]  # fmt: skip

# Errno names (POSIX and the common socket ones): a list, since "E" + capitals is also a word.
ERRNO = (
    "E2BIG|EACCES|EADDRINUSE|EADDRNOTAVAIL|EAGAIN|EALREADY|EBADF|EBUSY|ECANCELED|ECHILD|"
    "ECONNABORTED|ECONNREFUSED|ECONNRESET|EDEADLK|EDESTADDRREQ|EDOM|EDQUOT|EEXIST|EFAULT|"
    "EFBIG|EHOSTDOWN|EHOSTUNREACH|EINPROGRESS|EINTR|EINVAL|EIO|EISCONN|EISDIR|ELOOP|EMFILE|"
    "EMLINK|EMSGSIZE|ENAMETOOLONG|ENETDOWN|ENETRESET|ENETUNREACH|ENFILE|ENOBUFS|ENODEV|ENOENT|"
    "ENOEXEC|ENOLCK|ENOMEM|ENOSPC|ENOSYS|ENOTCONN|ENOTDIR|ENOTEMPTY|ENOTSOCK|ENOTSUP|ENOTTY|"
    "ENXIO|EOVERFLOW|EPERM|EPIPE|ERANGE|EROFS|ESPIPE|ESRCH|ETIMEDOUT|ETXTBSY|EWOULDBLOCK|EXDEV"
)
# Capitals-dash-digits that are names of standards, not tickets.
NOT_TICKETS = frozenset({"UTF", "SHA", "ISO", "GPT", "MD", "AES", "COVID", "IPV", "X", "TLS"})
NOT_DOTTED = frozenset({"e.g", "i.e", "a.m", "p.m", "etc", "vs", "U.S", "Mr", "Dr"})
UNITS = (
    r"ms|µs|us|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?|days?|"
    r"[KMGTP]i?B|[kKMGT]b|kB|B|bytes?|%|px|em|rem|[kMG]?Hz|°[CF]|tokens?|req/s|rps|qps|"
    r"k|K|M|x|cores?|threads?|GPUs?"
)
QUOTED_CHARS = (2, 80)  # a quoted string's length bounds (its inner text)
LONGEST = 200  # an identifier longer than this is not one (a blob, a data URL)

_PATTERNS: tuple[tuple[Kind, str], ...] = (
    ("url", r"\b(?:https?|wss?|ftp|file)://[^\s<>\"'`\\|{}]+"),
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    ("error", r"\bHTTP(?:/\d(?:\.\d)?)?[ ]\d{3}\b"),
    ("error", r"\b(?:" + ERRNO + r")\b"),
    ("error", r"\b(?:[EWCF]\d{3,5}|TS\d{4}|SQLSTATE[ ]?\w{5})\b"),
    (
        "exception",
        r"\b(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Warning|Exit|Interrupt|Fault)\b"
        r"|\b(?:StopIteration|StopAsyncIteration)\b",
    ),
    (
        "path",
        r"(?<![\w/:.~-])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w@+-][\w.@+-]*"
        r"|\b[A-Za-z]:\\(?:[\w.@+ -]+\\)*[\w.@+-]+"
        r"|\b(?:[\w.@+-]+/)+[\w@+-]+\.[A-Za-z0-9]{1,8}\b",
    ),
    ("quantity", r"\b\d+/(?:tcp|udp)\b"),
    ("quantity", r"\$\d[\d,]*(?:\.\d+)?|\b\d[\d,]*(?:\.\d+)?[ ]?(?:" + UNITS + r")(?![\w/])"),
    ("version", r"\bv?\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.]+)?\b"),
    ("issue", r"(?<![\w&#])#[A-Za-z]{0,3}\d{2,}\b"),
    ("ticket", r"\b[A-Z][A-Z0-9]{0,9}-(?:\d{1,7}|(?=[0-9a-z]*\d)[0-9a-z]{4,16})\b"),
    ("hash", r"\b0x[0-9a-fA-F]{4,}\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b"),
    ("hash", r"\b(?=[0-9A-F]*\d)(?=[0-9A-F]*[A-F])[0-9A-F]{7,64}\b"),
    ("number", r"(?<![\d.,])\d{6,}(?![\d.,]\d)"),
    ("call", r"\b[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*(?=\()"),
    ("dotted", r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\b"),
    ("snake", r"\b_{0,2}[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+_{0,2}\b|\b__\w+__\b"),
    ("camel", r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b"),
)
_COMBINED = re.compile("|".join(f"(?P<k{i}>{p})" for i, (_, p) in enumerate(_PATTERNS)))
# Every quoted string of a line, in pairs (a JSON key is matched, then left out: `_quoted`).
_QUOTED = re.compile(r"\"((?:[^\"\\\n]|\\.)*)\"|(?<!\w)'([^'\n]*)'(?!\w)|`([^`\n]*)`")
_ESCAPES = re.compile(r"\\[nrt]")
_KEY = re.compile(r"\s*:")
_TRAILING = ".,;:!?)]}>'\""
_SHORT_CALLS = frozenset({"if", "for", "while", "print", "len", "str", "int", "list", "dict"})


@dataclass(frozen=True, slots=True)
class Identifier:
    """One identifier found in a text, verbatim, with its kind and where it starts."""

    text: str
    kind: Kind
    start: int


def _keep(kind: Kind, text: str) -> bool:
    """Whether a pattern's match is an identifier (the cases a regex alone cannot say)."""
    if len(text) > LONGEST or len(text) < 2:
        return False
    if kind == "ticket":
        return text.split("-", 1)[0] not in NOT_TICKETS
    if kind == "dotted":
        return text not in NOT_DOTTED and len(text) >= 5 and not text.endswith(".")
    if kind == "call":
        return len(text) >= 3 and text not in _SHORT_CALLS
    if kind == "path":
        return any(c.isalpha() for c in text) and text.strip("/.~") != ""
    return True


def _quoted(inner: str) -> bool:
    """Whether a quoted string's inner text is kept: bounded, not blank, not padded."""
    low, high = QUOTED_CHARS
    return low <= len(inner) <= high and inner == inner.strip() and bool(inner)


def _clean(kind: Kind, text: str) -> str:
    if kind in ("url", "path"):
        text = text.rstrip(_TRAILING)
        if kind == "url" and text.count("(") < text.count(")"):
            text = text.rstrip(")")
    return text


def identifiers(text: str) -> list[Identifier]:
    """The identifiers in `text`, in order of appearance. Structured ones never overlap (at
    one place the first pattern that matches wins: a URL over the path in it); quoted strings
    are found besides them (their inner text, and what is inside counts too)."""
    found: list[Identifier] = []
    # JSON escapes (a call's arguments) would glue their letter to the next word: blanked,
    # keeping every position
    text = _ESCAPES.sub("  ", text)
    for match in _COMBINED.finditer(text):
        name = match.lastgroup or ""
        kind = _PATTERNS[int(name[1:])][0]
        word = _clean(kind, match.group(name))
        if _keep(kind, word):
            found.append(Identifier(word, kind, match.start()))
    for match in _QUOTED.finditer(text):
        inner = next(g for g in match.groups() if g is not None)
        if _quoted(inner) and not _KEY.match(text, match.end()):
            found.append(Identifier(inner, "quoted", match.start() + 1))
    found.sort(key=lambda i: i.start)
    return found


def identifier_set(text: str) -> set[str]:
    """The distinct identifiers of `text`."""
    return {i.text for i in identifiers(text)}


def message_text(message: Mapping[str, Any]) -> str:
    """What a chat message says, as one text: its content (text parts), the calls it makes
    (names and arguments)."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(f"{function.get('name')}({function.get('arguments')})")
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        parts.append(f"{legacy.get('name')}({legacy.get('arguments')})")
    return "\n".join(parts)


Fate = Literal["retained", "restorable", "lost"]


def whole_positions(
    messages: Sequence[Mapping[str, Any]],
    out: Sequence[Mapping[str, Any]],
    sources: Sequence[int | None],
) -> set[int]:
    """Positions of the input `messages` that the compacted `out` (with its `sources`, the
    input index of each) forwards whole: the very message, or a copy whose text holds all of
    the original's (a summary folded into the head)."""
    whole: set[int] = set()
    for shown, source in zip(out, sources, strict=True):
        if source is None:
            continue
        original = messages[source]
        if shown is original or message_text(original) in message_text(shown):
            whole.add(source)
    return whole


def fate(reference: str, prompt: str, refs: Mapping[str, str], named: Sequence[str]) -> Fate:
    """Where `reference` went: `retained` (in the forwarded `prompt` text), `restorable` (in
    the original behind one of the refs `named` in it) or `lost`."""
    if reference in prompt:
        return "retained"
    if any(reference in refs.get(ref, "") for ref in named):
        return "restorable"
    return "lost"


RECENT = 16  # the last texts of a span, whose identifiers a session most often uses again


def ranked(texts: Iterable[str]) -> list[str]:
    """The distinct identifiers of `texts` in a deterministic order of what is likeliest to
    be needed again: those mentioned in the last `RECENT` texts first, then those mentioned in
    more than one text, then the most recently mentioned, then by first appearance. (Measured
    on the transcripts, bench/RESULTS.md "Facts survive": recency predicts reuse best, then
    repetition; an identifier's kind hardly does.)"""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    texts_with: Counter[str] = Counter()
    n = -1
    for n, text in enumerate(texts):
        for ident in identifiers(text):
            counts[ident.text] += 1
            first.setdefault(ident.text, len(first))
            if last.get(ident.text) != n:
                texts_with[ident.text] += 1
            last[ident.text] = n
    end = n

    def order(t: str) -> tuple[bool, bool, int, int]:
        return (end - last[t] >= RECENT, texts_with[t] < 2, end - last[t], first[t])

    return sorted(first, key=order)


FACTS_HEADING = "Facts kept (verbatim from the summarised turns):"
SEPARATOR = " ; "


def facts_kept(
    span: Sequence[Mapping[str, Any]],
    summary: str,
    max_tokens: int,
    count: Callable[[str], int],
    known: str = "",
) -> str:
    """The exact-fact guard's list for a summary of `span`: its identifiers neither the
    `summary` nor `known` (text the prompt holds beside the summary: its head, the turns kept
    after the cut) contains verbatim, ranked (`ranked`), after `FACTS_HEADING`, separated by
    `SEPARATOR`, as many as fit `max_tokens` by `count`; empty when none is lost or none fits.
    An identifier a listed one contains is not listed apart (a longer one takes its place and
    its room). A pure function of its arguments, so a summary stays cache-stable."""
    kept: dict[str, int] = {}  # listed identifier -> its size
    used = count(FACTS_HEADING)
    for ident in ranked(message_text(m) for m in span):
        if ident in summary or any(ident in other for other in kept):
            continue
        covered = [other for other in kept if other in ident]
        size = count(SEPARATOR + ident) - sum(kept[other] for other in covered)
        if used + size > max_tokens:
            if max_tokens - used < 4:
                break
            continue  # a shorter one further down may still fit
        if ident in known:  # last: `known` may be long (the kept turns)
            continue
        for other in covered:
            del kept[other]
        kept[ident] = count(SEPARATOR + ident)
        used += size
    return FACTS_HEADING + " " + SEPARATOR.join(kept) if kept else ""


def guarded(
    summary: str,
    span: Sequence[Mapping[str, Any]],
    max_tokens: int,
    count: Callable[[str], int],
    known: str = "",
) -> str:
    """`summary` with the exact-fact guard's list appended (DESIGN.md §14), bounded by
    `max_tokens` for the whole text, leaving out what `known` holds; the summary itself is
    never changed."""
    room = max_tokens - count(summary) - 2
    block = facts_kept(span, summary, room, count, known) if room > 0 else ""
    return f"{summary}\n\n{block}" if block else summary
