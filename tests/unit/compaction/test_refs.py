"""Refs are a pure function of position and content, in the format DESIGN.md §11 fixes."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given
from hypothesis import strategies as st

from inflight.compaction.refs import REF_SUFFIX_RE, content_sha256, ref_for, ref_suffix

FORMAT = re.compile(r"\(ref: [A-Za-z0-9_-]{6,32}\)")


@given(st.integers(0, 10**6), st.text())
def test_refs_are_stable_and_well_formed(position: int, content: str) -> None:
    ref = ref_for(position, content)
    assert ref == ref_for(position, content)
    assert FORMAT.fullmatch(ref_suffix(ref))
    match = REF_SUFFIX_RE.fullmatch(ref_suffix(ref))
    assert match is not None
    assert match.group(1) == ref


def test_position_content_and_part_each_change_the_ref() -> None:
    base = ref_for(3, "output")
    assert ref_for(4, "output") != base
    assert ref_for(3, "output!") != base
    assert ref_for(3, "output", "arguments") != base
    assert ref_for(3, [{"type": "text", "text": "a"}]) == ref_for(
        3, [{"text": "a", "type": "text"}]
    )


def test_sha256_is_of_the_utf8_string() -> None:
    assert content_sha256("é") == hashlib.sha256("é".encode()).hexdigest()
