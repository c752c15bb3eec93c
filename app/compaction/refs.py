"""Refs: the stable names by which an elision marker points at what it stands for (§11).

Format (DESIGN.md §11): markers end with exactly `(ref: ID)`, ID of 6–32 characters from
`[A-Za-z0-9_-]`; here 12 lowercase hex digits.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

REF_LENGTH = 12
REF_PATTERN = r"[A-Za-z0-9_-]{6,32}"
REF_SUFFIX_RE = re.compile(r"\(ref: (" + REF_PATTERN + r")\)")


def content_bytes(content: Any) -> bytes:
    """The bytes a ref and the ledger's sha256 hash: a string's UTF-8, else its canonical JSON."""
    if isinstance(content, str):
        return content.encode("utf-8", "surrogatepass")
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS)


def ref_for(position: int, content: Any, part: str = "") -> str:
    """The ref of the content at `position` (the message's index in the client's history);
    `part` names a piece of that message when one message holds several cut texts (a call's
    arguments, a content part), else empty.

    A pure function of the position and the content, so the marker written for it is byte-identical
    on every request of a conversation (the prompt cache stays hot, DESIGN.md §4.7), on any replica,
    after any restart — and the restore tool resolves it against the originals of the request being
    served, with nothing stored.
    """
    h = hashlib.sha256(f"{position}\0{part}\0".encode())
    h.update(content_bytes(content))
    return h.hexdigest()[:REF_LENGTH]


def ref_suffix(ref: str) -> str:
    """The text every elision marker ends with."""
    return f"(ref: {ref})"


def content_sha256(content: Any) -> str:
    """The ledger's hash of an original content (UTF-8 of the string, DESIGN.md §11)."""
    return hashlib.sha256(content_bytes(content)).hexdigest()
