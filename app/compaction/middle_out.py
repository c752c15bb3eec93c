"""`middle-out`: drop whole units from the middle of the conversation, keeping head and tail.

Units are removed from the centre outwards (OpenRouter's transform, made pair-safe and, in a
strictly alternating conversation, done by assistant+user pairs so roles keep alternating).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def middle_order(kept: Sequence[int]) -> list[int]:
    """`kept` reordered centre first, then alternately left and right of it."""
    centre = len(kept) // 2
    order: list[int] = []
    for step in range(len(kept)):
        offset = (step + 1) // 2
        index = centre - offset if step % 2 else centre + offset
        if 0 <= index < len(kept):
            order.append(kept[index])
    seen = set(order)
    order.extend(k for k in kept if k not in seen)
    return order


def drop_middle(
    kept: Sequence[int],
    total: int,
    goal: int,
    cost: Callable[[int], int],
    pair_of: Callable[[int], int | None] | None,
) -> tuple[set[int], int]:
    """Units to drop (from `kept`, which excludes the head and the last unit) until ≤ goal.

    With `pair_of`, a unit can only go together with its partner (None: it cannot go).
    """
    dropped: set[int] = set()
    for unit in middle_order(kept):
        if total <= goal:
            break
        if unit in dropped:
            continue
        group = [unit]
        if pair_of is not None:
            partner = pair_of(unit)
            if partner is None or partner not in kept or partner in dropped:
                continue
            group.append(partner)
        for member in group:
            dropped.add(member)
            total -= cost(member)
    return dropped, total
