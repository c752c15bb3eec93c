"""Uncalibrated token counts: one message (role, content parts, name, tool calls, reasoning
fields), and the prompt outside the messages (tool definitions, schemas, a top-level system
prompt), with tiktoken's encoding where the model's family has one, else the heuristic; and
how much of a count is guessed (images, documents, files, audio: sized by rule, not measured)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import orjson

from inflight.tokens.encodings import EncodingSet, bare_model, family_encoding
from inflight.tokens.heuristic import heuristic_tokens
from inflight.tokens.images import image_tokens

PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
PER_TOOL_CALL = 7  # framing of one call in the prompt (id, type, function wrapper)
PER_TOOL_DEFINITION = 8
PER_OPAQUE_PART = 1000  # audio, file or document parts: their size in tokens is not knowable here

LONG_TEXT = 200_000  # longer texts are encoded in pieces (BPE cost grows faster than linear)


class ModelEncodings(Protocol):
    """Where a deployment's model table names a model's encoding (`models.toml` `encoding`)."""

    def encoding_for(self, model: str) -> str | None: ...


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


TextCount = Callable[[str], int]  # one text's raw tokens under one encoding (or the heuristic)
_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_OPAQUE_PARTS = frozenset({"input_audio", "file", "input_file", "document"})
GUESSED_PARTS = _IMAGE_PARTS | _OPAQUE_PARTS  # parts whose count is a rule's guess
_MODEL_MEMO_SIZE = 1024


def _heuristic(text: str) -> int:
    return heuristic_tokens(text) if text else 0


def text_count(count: TextCount) -> TextCount:
    """`count` (an exact count) for any text: 0 for none, and a long one in pieces cut after
    a newline, which tokenize as the whole (BPE cost grows faster than linear)."""

    def exact(text: str) -> int:
        if len(text) <= LONG_TEXT:
            return count(text) if text else 0
        total, start = 0, 0
        while start < len(text):
            end = min(len(text), start + LONG_TEXT)
            cut = text.rfind("\n", start, end) + 1 if end < len(text) else end
            end = cut if cut > start else end
            total += count(text[start:end])
            start = end
        return total

    return exact


class RawCounter:
    """Uncalibrated counts, exact where tiktoken knows the family, else heuristic; per-message
    counts cached by content hash in a bounded LRU.

    Thread-safe; all state (the per-message LRU, per-model encodings) is this instance's.
    """

    def __init__(
        self,
        encodings: EncodingSet,
        model_table: ModelEncodings | None = None,
        cache_size: int = 50_000,
    ) -> None:
        self._encodings = encodings
        self._text_counts: dict[str, TextCount] = {  # encoding name: one text's exact count
            name: text_count(count)
            for name in encodings.encodings
            if (count := encodings.counter(name)) is not None
        }
        self._table = model_table
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._cache_size = cache_size
        self._families: dict[str, str | None] = {}
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
    def _count_of(self, encoding: str | None) -> TextCount:
        """How a text is counted under `encoding`: exactly when it loaded, else the heuristic."""
        return self._text_counts.get(encoding or "", _heuristic)

    def _text(self, encoding: str | None, text: str) -> int:
        return self._count_of(encoding)(text)

    @staticmethod
    def _value(count: TextCount, value: Any) -> int:
        return sum(map(count, _strings(value)))

    def _part(self, count: TextCount, model: str, part: Any) -> int:
        if not isinstance(part, dict):
            return self._value(count, part)
        kind = part.get("type")
        if kind in _IMAGE_PARTS:
            return image_tokens(part, model)
        if kind in _OPAQUE_PARTS:
            return PER_OPAQUE_PART
        for key in ("text", "thinking", "refusal"):
            if isinstance(part.get(key), str):
                return count(part[key])
        if kind == "redacted_thinking":
            return 0  # encrypted; providers drop it from the prompt
        return self._value(count, {k: v for k, v in part.items() if k != "type"})

    def _content(self, count: TextCount, model: str, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return count(content)
        if isinstance(content, list):
            return sum(self._part(count, model, part) for part in content)
        return self._value(count, content)

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
        total = self._uncached(self._count_of(encoding), model, message)
        with self._lock:
            self._cache[key] = total
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return total

    def _uncached(self, count: TextCount, model: str, message: Mapping[str, Any]) -> int:
        """`raw_message` counted: its fields in one pass."""
        total = PER_MESSAGE
        for key, value in message.items():
            if key == "role":
                total += count(str(value))
            elif key == "content":
                total += self._content(count, model, value)
            elif key == "tool_calls":
                for call in value if isinstance(value, list) else ():
                    total += PER_TOOL_CALL
                    fn = call.get("function") if isinstance(call, dict) else call
                    if isinstance(fn, dict):
                        total += count(str(fn.get("name", ""))) + count(
                            str(fn.get("arguments", ""))
                        )
            elif key == "name":
                total += PER_NAME + count(str(value)) if value else 0
            elif key == "tool_call_id" or key == "refusal":
                total += count(str(value)) if value else 0
            elif key == "function_call":
                total += PER_TOOL_CALL + self._value(count, value) if isinstance(value, dict) else 0
            elif value is not None:
                # reasoning_content / reasoning / thinking / reasoning_details and any unknown
                # field: counted, because some templates render them and overcounting is safe.
                total += self._value(count, value)
        return total

    def _guessed(self, model: str, content: Any) -> int:
        if not isinstance(content, list):
            return 0
        return sum(
            self._part(_heuristic, model, part)
            for part in content
            if isinstance(part, dict) and part.get("type") in GUESSED_PARTS
        )

    def raw_guessed(self, model: str, body: Mapping[str, Any]) -> int:
        """How many of the uncalibrated tokens of `body` (a chat-shaped view) are guessed, not
        measured: its image, document, file and audio parts. The upstream may bill them at a
        fraction or a multiple of the guess, so a count that includes them is no evidence of a
        cut prompt, nor of how the counter counts (DESIGN.md §7 Isolation)."""
        messages = body.get("messages")
        total = sum(
            self._guessed(model, message.get("content"))
            for message in (messages if isinstance(messages, list) else ())
            if isinstance(message, Mapping)
        )
        return total + sum(self._guessed(model, body.get(k)) for k in ("instructions", "system"))

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
                total += self._content(self._count_of(encoding), "", value)
        return total
