"""How far one client's requests reach into another's (DESIGN.md §7 Isolation), as properties:
whatever client A sends, client B's estimate moves at most a bounded amount (the bound below),
and B's window not at all unless an overflow error states one or enough other clients saw a
silent cut too."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.tokens.calibration import (
    CLIENT_REACH,
    DEADBAND,
    DEADBAND_FLOOR,
    HEURISTIC_BOUNDS,
    Calibration,
    Observation,
)
from inflight.windows.registry import SILENT_QUORUM, WindowRegistry
from inflight.windows.table import ModelTable

CONFIG = Path(__file__).resolve().parents[3] / "config" / "models.toml"
MODEL = "m"


def answers(rate: tuple[float, float], fixed: tuple[int, int]) -> st.SearchStrategy[Observation]:
    """Observations of prompts a template counts at `rate` × raw + `fixed` (within bounds)."""
    return st.builds(
        lambda raw, messages, system, tools, k, c: Observation(
            raw, messages, round(k * raw + c), system, tools
        ),
        st.integers(50, 40_000),
        st.integers(1, 120),
        st.booleans(),
        st.booleans(),
        st.floats(*rate),
        st.integers(*fixed),
    )


def influence_bound(obs: Observation) -> float:
    """What one client can move the estimate of `obs` by, without an overflow error: twice its
    reach on each parameter (from one side of the others' consensus to the other) — the factor
    on content by 0.5 of the raw count, 4 tokens a message, 512 a request (+256 without a system
    message, +512 with tools) — and less the more the others' own answers weigh."""
    return sum(2 * r * abs(f) for r, f in zip(CLIENT_REACH, obs.features(), strict=True))


# the others' answers: a template within the reach; A's: anything at all
others = st.lists(
    st.tuples(st.sampled_from("BC"), answers((0.8, 1.2), (0, 200))), min_size=0, max_size=12
)
odd = st.lists(answers((0.2, 4.0), (0, 4000)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(answers((0.8, 1.2), (0, 200)), others, odd, st.data())
def test_one_client_moves_anothers_estimate_at_most_its_reach(
    first: Observation,
    rest: list[tuple[str, Observation]],
    theirs: list[Observation],
    data: st.DataObject,
) -> None:
    """B's estimate of its own request, after the others' answers with A's interleaved anyhow,
    against the same answers without A's: within `influence_bound`, plus the deadband the
    correction in use may lag the fit by (in either run)."""
    positions = sorted(
        data.draw(st.lists(st.integers(0, len(rest)), min_size=len(theirs), max_size=len(theirs)))
    )
    now = [0.0]
    alone, joined = Calibration(clock=lambda: now[0]), Calibration(clock=lambda: now[0])
    sequence = [("B", first), *rest]
    a_at = iter(zip(positions, theirs, strict=True))
    pending = next(a_at, None)
    for index, (client, obs) in enumerate(sequence):
        now[0] = 60.0 * index
        while pending is not None and pending[0] <= index:
            joined.observe(MODEL, pending[1], HEURISTIC_BOUNDS, client="A")
            pending = next(a_at, None)
        alone.observe(MODEL, obs, HEURISTIC_BOUNDS, client=client)
        joined.observe(MODEL, obs, HEURISTIC_BOUNDS, client=client)
    while pending is not None:
        joined.observe(MODEL, pending[1], HEURISTIC_BOUNDS, client="A")
        pending = next(a_at, None)
    without = alone.correction(MODEL).predict(first)
    with_a = joined.correction(MODEL).predict(first)
    lag = DEADBAND * (max(without, DEADBAND_FLOOR) + max(with_a, DEADBAND_FLOOR))
    rounding = 1.0 + 1e-4 * first.raw
    assert abs(with_a - without) <= influence_bound(first) + lag + rounding


def registry() -> WindowRegistry:
    return WindowRegistry(ModelTable.load(CONFIG), discover=None)


reports = st.lists(st.integers(64, 8000), min_size=1, max_size=20)  # under the fallback window


@settings(max_examples=100, deadline=None)
@given(
    reports,
    st.lists(st.tuples(st.sampled_from("CD"[: SILENT_QUORUM - 2]), st.integers(64, 100_000))),
)
def test_one_clients_silent_cuts_never_move_anothers_window(
    cuts: list[int], earlier: list[tuple[str, int]]
) -> None:
    """A's silent cuts (any number, any sizes), after those of fewer than SILENT_QUORUM − 1
    other clients (with that many, A's is the corroboration that makes the window everyone's):
    B's window is what it was; A's own is its last cut."""
    windows = registry()
    for client, window in earlier:
        windows.learn_silent("http://u", MODEL, window, client)
    before = windows.known_window(MODEL, "http://u", client="B")
    for window in cuts:
        windows.learn_silent("http://u", MODEL, window, "A")
        assert windows.known_window(MODEL, "http://u", client="B") == before
    assert windows.known_window(MODEL, "http://u", client="A").tokens == cuts[-1]


def test_an_overflow_error_or_a_quorum_moves_everyones_window() -> None:
    windows = registry()
    fallback = windows.known_window(MODEL, "http://u", client="B").tokens
    windows.learn("http://u", MODEL, 6000)  # an overflow error's own statement: everyone's
    assert windows.known_window(MODEL, "http://u", client="B").tokens == 6000
    for n, client in enumerate("ACD"[:SILENT_QUORUM], start=1):
        windows.learn_silent("http://u", MODEL, 1000 * n, client)
    agreed = 1000 * SILENT_QUORUM  # the largest window all of them saw a cut at or under
    assert windows.known_window(MODEL, "http://u", client="B").tokens == agreed
    assert windows.known_window(MODEL, "http://u", client="A").tokens == 1000
    assert fallback > 6000
