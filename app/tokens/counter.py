"""Token counting for chat requests: tiktoken where exact, a calibrated heuristic elsewhere.

Counts follow OpenAI's accounting (3 tokens per message, 1 per name, 3 to prime the reply),
with tool calls, tool definitions, `response_format` schemas, images by `detail` and the
reasoning fields clients send back. Only `encode_ordinary` is used: user text may contain
`<|endoftext|>` and must be counted as text. ASCII text is counted by quicktok where it
loaded (app/tokens/encodings.py: the same counts, checked at load, several times faster).
Per-message raw counts are cached by content hash in a bounded LRU owned by the counter, so a
growing conversation costs only its new messages.
Model families without a tokenizer in tiktoken (Llama, Qwen, Mistral, Claude, Gemini …) use
`heuristic_tokens`. Every model is corrected by the upstream's own `usage.prompt_tokens`
(app/calibration.py: a factor on content plus the chat template's fixed cost per request and
per message, fitted from recent responses, bounded, moving in steps).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import struct
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from app.jsontext import messages_text
from app.tokens.calibration import (
    EXACT_BOUNDS,
    HEURISTIC_BOUNDS,
    Calibration,
    Correction,
    Observation,
)
from app.tokens.encodings import EncodingSet, bare_model, family_encoding
from app.tokens.heuristic import heuristic_tokens

PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
PER_TOOL_CALL = 7  # framing of one call in the prompt (id, type, function wrapper)
PER_TOOL_DEFINITION = 8
PER_OPAQUE_PART = 1000  # audio or file parts: their size in tokens is not knowable here
# Images (OpenAI's rule): `low` costs the base; `high`/`auto` the base plus one tile per 512 px
# square after fitting into 2048 px and scaling the short side to 768 px. The size is read from
# a data: URL's PNG/GIF/JPEG header; for a remote URL it is unknown and a 1920×1080 screenshot
# (6 tiles, 1105 tokens) is assumed — the common large case, so the estimate errs high.
IMAGE_BASE, IMAGE_TILE = 85, 170
IMAGE_BASE_MINI, IMAGE_TILE_MINI = 2833, 5667  # gpt-4o-mini counts images at these rates
IMAGE_UNKNOWN_SIZE = (1920, 1080)

LONG_TEXT = 200_000  # longer texts are encoded in pieces (BPE cost grows faster than linear)


def _image_size(url: Any) -> tuple[int, int] | None:
    """Width and height from the header of a base64 data: URL (PNG, GIF, JPEG), else None."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url[:100]:
        return None
    head = url.split(",", 1)[1][:87_380]  # the first 64 KiB of the file: where JPEG says SOF
    try:
        data = base64.b64decode(head[: len(head) - len(head) % 4])
    except (binascii.Error, ValueError):
        return None
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return int(width), int(height)
    i = 2 if data[:2] == b"\xff\xd8" else len(data)
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return int(width), int(height)
        i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    return None


def image_tokens(part: Mapping[str, Any], model: str) -> int:
    """Tokens of one image content part, by `detail` and (when known) size."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image or part.get("url")
    detail = image.get("detail") if isinstance(image, dict) else part.get("detail")
    mini = bare_model(model).startswith("gpt-4o-mini")
    base, tile = (IMAGE_BASE_MINI, IMAGE_TILE_MINI) if mini else (IMAGE_BASE, IMAGE_TILE)
    if detail == "low":
        return base
    width, height = _image_size(url) or IMAGE_UNKNOWN_SIZE
    if width <= 0 or height <= 0:
        return base
    fit = min(1.0, 2048 / max(width, height))
    short = min(1.0, 768 / (min(width, height) * fit))
    w, h = width * fit * short, height * fit * short
    return base + tile * math.ceil(w / 512) * math.ceil(h / 512)


class ModelEncodings(Protocol):
    """Where a deployment's model table names a model's encoding (`models.toml` `encoding`)."""

    def encoding_for(self, model: str) -> str | None: ...


class TokenCounter(Protocol):
    """What the rest of the app needs from token counting."""

    def count_message(self, model: str, message: Mapping[str, Any]) -> int: ...

    def count_messages(self, model: str, messages: Sequence[Mapping[str, Any]]) -> list[int]: ...

    def count_fixed(self, model: str, body: Mapping[str, Any]) -> int: ...

    def count_request(self, model: str, body: Mapping[str, Any]) -> int: ...

    def count_text(self, model: str, text: str) -> int: ...

    def encoding_name(self, model: str) -> str | None: ...

    def is_exact(self, model: str) -> bool: ...

    def observe(
        self, model: str, sent: Mapping[str, Any], actual: int, *, overflowed: bool = False
    ) -> None: ...

    def calibration_factors(self) -> dict[str, float]: ...

    def counting(self, model: str) -> Hashable: ...


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a JSON value (keys of objects and scalars included)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for k, v in item.items():
                yield str(k)
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None and not isinstance(item, bool):
            yield str(item)


_KNOWN_KEYS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal"}
)
_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_OPAQUE_PARTS = frozenset({"input_audio", "file", "input_file"})
_MODEL_MEMO_SIZE = 1024


PREFIX_SLOTS = 8  # conversations whose last request is remembered (each its bytes and counts)
PREFIX_BYTES = 32 * 1024 * 1024  # at most this many bytes of them in all


@dataclass(frozen=True, slots=True)
class _Prefix:
    """A request's messages as one JSON text, where each message ends in it, and their raw
    counts, for one scope (encoding and model: images cost differ per model)."""

    scope: str
    text: bytes
    ends: tuple[int, ...]  # ends[i]: the offset just after message i's JSON in `text`
    raw: tuple[int, ...]
    fix: Correction | None = None  # the correction `counted` holds the raw counts under
    counted: tuple[int, ...] = ()  # of the leading messages (all, or fewer)

    def shared(self, scope: str, text: bytes) -> int:
        """How many leading messages `text` (a request's messages as one JSON text) has
        byte-identical to this one's. Messages are objects, so an object that starts where
        one of these starts and agrees with it up to its closing brace is that message."""
        if scope != self.scope or not self.ends or not text.startswith(self.text[: self.ends[0]]):
            return 0
        if text.startswith(self.text[: self.ends[-1]]):
            return len(self.ends)  # the common case: the conversation went on
        low, high = 1, len(self.ends) - 1  # ends[low - 1] is shared; ends[high] is not
        while low <= high:
            mid = (low + high) // 2
            if text.startswith(self.text[: self.ends[mid]]):
                low = mid + 1
            else:
                high = mid - 1
        return low


class _Prefixes:
    """The last requests of a few conversations, so the next one counts only what it adds.
    Bounded in entries and bytes; not thread-safe on its own (the counter's lock guards it)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[int, _Prefix] = OrderedDict()

    def longest(self, scope: str, text: bytes) -> tuple[_Prefix | None, int]:
        best: tuple[_Prefix | None, int] = (None, 0)
        for entry in self._entries.values():
            shared = entry.shared(scope, text)
            if shared > best[1]:
                best = (entry, shared)
        return best

    def replace(self, old: _Prefix | None, new: _Prefix) -> None:
        """Remember `new`, in place of `old` when it extends it (a conversation keeps one
        slot; another conversation sharing only its first messages keeps its own)."""
        if old is not None:
            self._entries.pop(id(old), None)
        self._entries[id(new)] = new
        total = sum(len(e.text) for e in self._entries.values())
        while len(self._entries) > PREFIX_SLOTS or total > PREFIX_BYTES:
            _, dropped = self._entries.popitem(last=False)
            total -= len(dropped.text)


class ChatTokenCounter:
    """The counter used by the proxy: exact where tiktoken knows the family, else heuristic.

    Thread-safe; all state (the per-message LRU, per-model encodings, calibration) is this
    instance's.
    """

    def __init__(
        self,
        encodings: EncodingSet,
        model_table: ModelEncodings | None = None,
        cache_size: int = 50_000,
    ) -> None:
        self._encodings = encodings
        self._tokenizers = {  # encoding name: tiktoken's, and the faster count for ASCII
            name: (enc, encodings.ascii_counter(name)) for name, enc in encodings.encodings.items()
        }
        self._table = model_table
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._cache_size = cache_size
        self._calibration = Calibration()
        self._families: dict[str, str | None] = {}
        self._prefixes = _Prefixes()
        self._lock = threading.Lock()

    # -- which tokenizer ---------------------------------------------------------------------
    def _family(self, model: str) -> str | None:
        """The encoding the model *should* use (table first, then OpenAI name prefixes)."""
        with self._lock:
            if model in self._families:
                return self._families[model]
        found = self._table.encoding_for(model) if self._table is not None else None
        family = found or family_encoding(model)
        with self._lock:
            if len(self._families) >= _MODEL_MEMO_SIZE:
                self._families.clear()
            self._families[model] = family
        return family

    def encoding_name(self, model: str) -> str | None:
        """The tiktoken encoding that counts `model` exactly, or None (heuristic)."""
        name = self._family(model)
        return name if name is not None and self._encodings.get(name) is not None else None

    def is_exact(self, model: str) -> bool:
        return self.encoding_name(model) is not None

    def heuristic_fallback(self, model: str) -> bool:
        """True when `model` has a tiktoken family whose file could not be loaded."""
        return self._family(model) is not None and not self.is_exact(model)

    @property
    def heuristic_used(self) -> bool:
        """True when some encoding is absent, so its families are estimated (/stats)."""
        return bool(self._encodings.missing)

    @property
    def missing_encodings(self) -> tuple[str, ...]:
        return self._encodings.missing

    # -- raw counts --------------------------------------------------------------------------
    def _text(self, encoding: str | None, text: str) -> int:
        if not text:
            return 0
        found = self._tokenizers.get(encoding or "")
        if found is None:
            return heuristic_tokens(text)
        enc, fast = found
        fast = fast if text.isascii() else None
        if len(text) <= LONG_TEXT:
            return fast(text) if fast is not None else len(enc.encode_ordinary(text))
        total, start = 0, 0
        while start < len(text):  # cut after a newline so the pieces tokenize as the whole
            end = min(len(text), start + LONG_TEXT)
            cut = text.rfind("\n", start, end) + 1 if end < len(text) else end
            end = cut if cut > start else end
            piece = text[start:end]
            total += fast(piece) if fast is not None else len(enc.encode_ordinary(piece))
            start = end
        return total

    def _value(self, encoding: str | None, value: Any) -> int:
        return sum(self._text(encoding, s) for s in _strings(value))

    def _part(self, encoding: str | None, model: str, part: Any) -> int:
        if not isinstance(part, dict):
            return self._value(encoding, part)
        kind = part.get("type")
        if kind in _IMAGE_PARTS:
            return image_tokens(part, model)
        if kind in _OPAQUE_PARTS:
            return PER_OPAQUE_PART
        for key in ("text", "thinking", "refusal"):
            if isinstance(part.get(key), str):
                return self._text(encoding, part[key])
        if kind == "redacted_thinking":
            return 0  # encrypted; providers drop it from the prompt
        return self._value(encoding, {k: v for k, v in part.items() if k != "type"})

    def _content(self, encoding: str | None, model: str, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self._text(encoding, content)
        if isinstance(content, list):
            return sum(self._part(encoding, model, part) for part in content)
        return self._value(encoding, content)

    def _message_key(
        self, encoding: str | None, model: str, message: Mapping[str, Any], data: bytes | None
    ) -> bytes:
        """The cache key of `message`: a hash of its JSON (`data`, when the caller has it)."""
        if data is None:
            try:
                data = orjson.dumps(message, option=orjson.OPT_NON_STR_KEYS)
            except TypeError:
                data = repr(message).encode()
        # Images cost differs per model family, so it is part of the key for image messages.
        scope = (encoding or "~") + ("|" + bare_model(model) if b'"image' in data else "")
        key = hashlib.blake2b(scope.encode() + b"\0", digest_size=16)
        key.update(data)
        return key.digest()

    def raw_message(self, encoding: str | None, message: Mapping[str, Any], model: str = "") -> int:
        """Uncalibrated tokens of one message (cached by content hash)."""
        return self._raw(encoding, message, model, None)

    def _raw(
        self, encoding: str | None, message: Mapping[str, Any], model: str, data: bytes | None
    ) -> int:
        """`raw_message`, given `message`'s JSON when the caller has serialised it already."""
        key = self._message_key(encoding, model, message, data)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        total = PER_MESSAGE + self._text(encoding, str(message.get("role", "")))
        total += self._content(encoding, model, message.get("content"))
        if message.get("name"):
            total += PER_NAME + self._text(encoding, str(message["name"]))
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            total += PER_TOOL_CALL
            fn = call.get("function") if isinstance(call, dict) else call
            if isinstance(fn, dict):
                total += self._text(encoding, str(fn.get("name", "")))
                total += self._text(encoding, str(fn.get("arguments", "")))
        legacy = message.get("function_call")
        if isinstance(legacy, dict):
            total += PER_TOOL_CALL + self._value(encoding, legacy)
        if message.get("tool_call_id"):
            total += self._text(encoding, str(message["tool_call_id"]))
        if message.get("refusal"):
            total += self._text(encoding, str(message["refusal"]))
        for extra, value in message.items():
            # reasoning_content / reasoning / thinking / reasoning_details and any unknown
            # field: counted, because some templates render them and overcounting is safe.
            if extra not in _KNOWN_KEYS and value is not None:
                total += self._value(encoding, value)
        with self._lock:
            self._cache[key] = total
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return total

    def raw_messages(
        self, encoding: str | None, messages: Sequence[Mapping[str, Any]], model: str = ""
    ) -> list[int]:
        """`raw_message` of each message. The leading messages byte-identical (as orjson
        writes them) to the last request of the same conversation take its counts: one
        serialisation of the whole list and a few prefix comparisons, not a key per message."""
        return self._counts(encoding, messages, model, None)

    def _counts(
        self,
        encoding: str | None,
        messages: Sequence[Mapping[str, Any]],
        model: str,
        fix: Correction | None,
    ) -> list[int]:
        """Raw counts (`fix` None) or counts calibrated with `fix`, taking those of the leading
        messages the conversation's last request had (calibrated too when `fix` is the same)."""
        listed = list(messages)
        # dict subclasses and other mappings are not serialised: counted one by one
        text = messages_text(messages) or b""
        if not text:
            raw = [self.raw_message(encoding, m, model) for m in listed]
            return raw if fix is None else [_whole(fix.content * r + fix.per_message) for r in raw]
        scope = f"{encoding or '~'}|{bare_model(model)}"
        calibrated = fix is not None
        with self._lock:
            known, shared = self._prefixes.longest(scope, text)
        entry = _Prefix(scope, text, (), ()) if known is None else known
        ends, raw = list(entry.ends[:shared]), list(entry.raw[:shared])
        for message in listed[shared:]:
            data = orjson.dumps(message)  # the bytes it has in `text`
            ends.append((ends[-1] if ends else 0) + 1 + len(data))
            raw.append(self._raw(encoding, message, model, data))
        if fix is None:  # raw counts: the calibrated ones known stay, for the next request
            fix, counted, changed = entry.fix, list(entry.counted[:shared]), False
        else:
            reused = min(shared, len(entry.counted)) if fix == entry.fix else 0
            counted = list(entry.counted[:reused])
            counted += [_whole(fix.content * r + fix.per_message) for r in raw[reused:]]
            changed = reused < len(listed)
        if shared < len(listed) or changed:
            extended = known if known is not None and shared == len(known.ends) else None
            new = _Prefix(scope, text, tuple(ends), tuple(raw), fix, tuple(counted))
            with self._lock:
                self._prefixes.replace(extended, new)
        return raw if not calibrated else counted

    def _json_text(self, encoding: str | None, value: Any) -> int:
        """Tokens of `value`'s JSON text (tool definitions, schemas): cached by content hash
        like messages, since an agent sends the same tools with every request."""
        data = orjson.dumps(value)
        key = hashlib.blake2b((encoding or "~").encode() + b"\1" + data, digest_size=16).digest()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        tokens = self._text(encoding, data.decode())
        with self._lock:
            self._cache[key] = tokens
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return tokens

    def raw_fixed(self, encoding: str | None, body: Mapping[str, Any]) -> int:
        """Uncalibrated tokens of the prompt that are not messages."""
        total = REPLY_PRIMING
        for field_name in ("tools", "functions"):
            definitions = body.get(field_name)
            if isinstance(definitions, list):
                for tool in definitions:
                    total += PER_TOOL_DEFINITION + self._json_text(encoding, tool)
        for field_name in ("response_format", "tool_choice"):
            value = body.get(field_name)
            if isinstance(value, dict):
                total += self._json_text(encoding, value)
            elif isinstance(value, str) and value not in ("auto", "none", "text"):
                total += self._text(encoding, value)
        for field_name in ("instructions", "system"):  # Responses and Messages: a system prompt
            value = body.get(field_name)
            if value:
                total += PER_MESSAGE + self._text(encoding, "system")
                total += self._content(encoding, "", value)
        return total

    def raw_request(self, model: str, body: Mapping[str, Any]) -> int:
        """Uncalibrated tokens of a whole request body."""
        encoding = self.encoding_name(model)
        counted = _messages_of(body)
        return self.raw_fixed(encoding, body) + sum(self.raw_messages(encoding, counted, model))

    # -- calibrated counts (the protocol) ----------------------------------------------------
    def _correction(self, model: str) -> Correction:
        return self._calibration.correction(model)

    def count_message(self, model: str, message: Mapping[str, Any]) -> int:
        raw = self.raw_message(self.encoding_name(model), message, model)
        fix = self._correction(model)
        return _whole(fix.content * raw + fix.per_message)

    def count_messages(self, model: str, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """`count_message` of each message, counting only what the conversation added."""
        return self._counts(self.encoding_name(model), messages, model, self._correction(model))

    def count_fixed(self, model: str, body: Mapping[str, Any]) -> int:
        """The prompt outside the messages, with the template's cost per request."""
        raw = self.raw_fixed(self.encoding_name(model), body)
        fix = self._correction(model)
        default_system = 0.0 if has_system(body) else fix.without_system
        preamble = fix.with_tools if has_tools(body) else 0.0
        # each message adds `per_message`; `per_request` already holds the first one's
        fixed = fix.per_request - fix.per_message + default_system + preamble
        return _whole(fix.content * raw + fixed)

    def count_request(self, model: str, body: Mapping[str, Any]) -> int:
        """sum(count_message) + count_fixed."""
        return self.count_fixed(model, body) + sum(self.count_messages(model, _messages_of(body)))

    def count_text(self, model: str, text: str) -> int:
        """Tokens of plain text for `model` (calibrated content, no framing)."""
        return _whole(self._text(self.encoding_name(model), text) * self._correction(model).content)

    # -- calibration -------------------------------------------------------------------------
    def observe(
        self, model: str, sent: Mapping[str, Any], actual: int, *, overflowed: bool = False
    ) -> None:
        """Calibrate on the upstream's count (`actual`) of the request body `sent` (recounted
        raw, cheap through the cache). `overflowed`: the count came from an overflow error, so
        the correction applies at once and counts this body at least that big."""
        observation = Observation(
            raw=float(self.raw_request(model, sent)),
            messages=len(_messages_of(sent)),
            actual=float(actual),
            system=has_system(sent),
            tools=has_tools(sent),
        )
        bounds = EXACT_BOUNDS if self.is_exact(model) else HEURISTIC_BOUNDS
        self._calibration.observe(model, observation, bounds, overflowed=overflowed)

    def counting(self, model: str) -> Hashable:
        """What `model`'s counts depend on besides the message: the encoding and the
        calibration state (a remembered plan is keyed by it, app/compaction/replays.py)."""
        return (model, self.encoding_name(model), *self._calibration.state(model))

    def calibration_factors(self) -> dict[str, float]:
        """The per-model factor on content learned so far (for /stats and /metrics)."""
        return {m: c.content for m, c in self._calibration.corrections().items()}

    def calibration(self) -> dict[str, dict[str, float]]:
        """The whole per-model correction: factor on content, tokens per message, per request,
        per request without a system message and with tools (for /stats)."""
        return {m: c.as_dict() for m, c in self._calibration.corrections().items()}


def _messages_of(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The body's messages that are objects (all of them, checked at C speed, as a rule)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    if set(map(type, messages)) <= {dict}:
        return messages
    return [m for m in messages if isinstance(m, Mapping)]


def has_system(body: Mapping[str, Any]) -> bool:
    """True when the request opens with a system prompt — a system (or developer) message, or
    top-level `instructions` (Responses) or `system` (Messages): templates such as Qwen's
    insert a default system prompt otherwise."""
    if body.get("instructions") or body.get("system"):  # Responses, Messages
        return True
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    return isinstance(first, Mapping) and first.get("role") in ("system", "developer")


def has_tools(body: Mapping[str, Any]) -> bool:
    """True when the request defines tools (templates put a tool-use preamble before them)."""
    return any(isinstance(body.get(k), list) and body[k] for k in ("tools", "functions"))


def _whole(tokens: float) -> int:
    """A calibrated count in whole tokens, never negative. Rounded to the nearest: rounding
    each message up would add half a token per message on average, a bias that grows with
    the conversation (and that calibration, fitted on unrounded sums, would not see)."""
    return max(0, math.floor(tokens + 0.5))


def count_within(
    counter: TokenCounter,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    memo: dict[int, int],
    message: Mapping[str, Any],
) -> int:
    """`count_message` of `message`, one of a request's `messages` or a copy made of one. The
    first call counts all of `messages` at once (`count_messages`: only what the conversation
    added since its last request) into `memo`, keyed by identity: whoever holds `memo` holds
    `messages` too, so while it lives no other object can have one of their ids."""
    if not memo and messages:
        memo.update(zip(map(id, messages), counter.count_messages(model, messages), strict=True))
    found = memo.get(id(message))
    return counter.count_message(model, message) if found is None else found
