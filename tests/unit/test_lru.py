"""BoundedLRU against a plain reference model: same contents after any sequence of operations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inflight.lru import BoundedLRU

OPS = st.lists(
    st.tuples(st.sampled_from(["get", "put", "pop"]), st.integers(0, 6), st.integers()),
    max_size=60,
)


@given(capacity=st.integers(1, 4), ops=OPS)
def test_matches_a_reference_lru(capacity: int, ops: list[tuple[str, int, int]]) -> None:
    lru: BoundedLRU[int, int] = BoundedLRU(capacity)
    reference: list[tuple[int, int]] = []  # oldest first
    for op, key, value in ops:
        found = next((v for k, v in reference if k == key), None)
        if op == "get":
            assert lru.get(key) == found
            if found is not None:
                reference = [(k, v) for k, v in reference if k != key] + [(key, found)]
        elif op == "put":
            lru.put(key, value)
            reference = [(k, v) for k, v in reference if k != key] + [(key, value)]
            reference = reference[-capacity:]
        else:
            assert lru.pop(key) == found
            reference = [(k, v) for k, v in reference if k != key]
        assert list(lru.items()) == reference
        assert len(lru) == len(reference) <= capacity


def test_a_read_keeps_an_entry_and_the_oldest_goes() -> None:
    lru: BoundedLRU[str, int] = BoundedLRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru["a"] == 1
    lru.put("c", 3)
    assert "b" not in lru
    assert list(lru) == ["a", "c"]
    with pytest.raises(KeyError):
        lru["b"]


def test_no_room_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        BoundedLRU(0)
