"""The calibration fit: an exact bounded least-squares solver, a bounded model, steps, overflow."""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.tokens.calibration import (
    EXACT_BOUNDS,
    HEURISTIC_BOUNDS,
    NEUTRAL,
    Bounds,
    Calibration,
    Correction,
    Observation,
    box_minimum,
    fit,
    moved,
    normal_equations,
    reaching,
    solve,
)
from tests.support.fakes import FakeUpstream


def _cost(matrix: list[list[float]], rhs: list[float], theta: list[float]) -> float:
    n = len(rhs)
    quadratic = sum(theta[j] * matrix[j][k] * theta[k] for j in range(n) for k in range(n))
    return quadratic - 2 * sum(rhs[j] * theta[j] for j in range(n))


def _exhaustive_minimum(
    matrix: list[list[float]], rhs: list[float], limits: tuple[tuple[float, float], ...]
) -> float:
    """Reference: try every parameter free, at its lower or at its upper bound (3^n systems),
    solve each for the free ones, and keep the best feasible."""
    n = len(rhs)
    best = float("inf")
    for states in itertools.product((None, 0, 1), repeat=n):
        theta = [0.0 if s is None else limits[j][s] for j, s in enumerate(states)]
        free = [j for j, s in enumerate(states) if s is None]
        if free:
            system = [[matrix[j][k] for k in free] for j in free]
            target = [
                rhs[j] - sum(matrix[j][k] * theta[k] for k in range(n) if k not in free)
                for j in free
            ]
            solved = solve(system, target)
            if solved is None or any(
                not limits[j][0] - 1e-9 <= v <= limits[j][1] + 1e-9
                for j, v in zip(free, solved, strict=True)
            ):
                continue
            for j, v in zip(free, solved, strict=True):
                theta[j] = v
        best = min(best, _cost(matrix, rhs, theta))
    return best


observations = st.lists(
    st.builds(
        Observation,
        raw=st.one_of(st.floats(1, 80), st.floats(80, 200_000)),
        messages=st.integers(1, 400),
        actual=st.floats(1, 400_000),
        system=st.booleans(),
        tools=st.booleans(),
    ),
    min_size=1,
    max_size=32,
)


@settings(max_examples=150, deadline=None)
@given(observations, st.sampled_from([HEURISTIC_BOUNDS, EXACT_BOUNDS]))
def test_the_solver_finds_the_bounded_minimum(obs: list[Observation], bounds: Bounds) -> None:
    """The active-set solver agrees with trying every combination of active bounds."""
    matrix, rhs = normal_equations(obs)
    limits = bounds.limits()
    start = [min(hi, max(lo, p)) for p, (lo, hi) in zip(NEUTRAL.params(), limits, strict=True)]
    theta = box_minimum(matrix, rhs, limits, start)
    assert all(lo <= t <= hi for t, (lo, hi) in zip(theta, limits, strict=True))
    reference = _exhaustive_minimum(matrix, rhs, limits)
    assert _cost(matrix, rhs, theta) <= reference + 1e-7 * (1 + abs(reference))


@settings(max_examples=100, deadline=None)
@given(observations, st.sampled_from([HEURISTIC_BOUNDS, EXACT_BOUNDS]))
def test_every_fit_is_within_bounds(obs: list[Observation], bounds: Bounds) -> None:
    fitted = fit(obs, bounds)
    for value, (low, high) in zip(fitted.params(), bounds.limits(), strict=True):
        assert low <= value <= high


def test_no_observations_means_no_correction() -> None:
    assert fit([], HEURISTIC_BOUNDS) == NEUTRAL == Correction(1.0, 0.0, 0.0, 0.0, 0.0)


def test_an_exact_linear_template_is_recovered() -> None:
    """actual = 0.9 × raw + 1.5 per message + 20, + 22 without a system message, + 80 with
    tools: prompts of varied size and shape give back those numbers."""

    def truth(raw: int, messages: int, system: bool, tools: bool) -> Observation:
        actual = 0.9 * raw + 1.5 * messages + 20 + (0 if system else 22) + (80 if tools else 0)
        return Observation(raw, messages, round(actual), system, tools)

    sizes = [(30, 1), (5200, 40), (60, 3), (900, 12), (14, 1), (12000, 90), (3000, 8)]
    shapes = list(itertools.product((True, False), repeat=2))
    obs = [truth(*size, *shape) for size, shape in itertools.product(sizes, shapes)]
    random.Random(0).shuffle(obs)  # an arrival order that mixes sizes and shapes
    fitted = fit(obs, HEURISTIC_BOUNDS)
    assert fitted.content == pytest.approx(0.9, abs=0.01)
    assert fitted.without_system == pytest.approx(22, abs=3)
    assert fitted.with_tools == pytest.approx(80, abs=3)
    for o in obs:
        assert fitted.predict(o) == pytest.approx(o.actual, rel=0.03)


def test_one_observation_cannot_move_the_model_wildly() -> None:
    """A tiny prompt that the upstream counts at 1,000 tokens (an image? a server-side system
    prompt?) is a fixed cost, not a factor on content: long prompts stay near their size."""
    fitted = fit([Observation(5, 1, 1000)], HEURISTIC_BOUNDS)
    assert fitted.content < 1.05
    assert fitted.per_message < 1.0
    long_prompt = Observation(50_000, 300, 0)
    assert fitted.predict(long_prompt) < 50_000 * 1.05 + 1000


def test_moved_is_a_deadband() -> None:
    obs = [Observation(30, 1, 50), Observation(4000, 30, 4100)]
    applied = Correction(1.0, 0.0, 20.0)
    assert not moved(applied, Correction(1.015, 0.0, 20.0), obs)  # 1.5 % on content
    assert not moved(applied, Correction(1.0, 0.0, 24.0), obs)  # 4 tokens on ≥ 256: noise
    assert moved(applied, Correction(1.035, 0.0, 20.0), obs)  # 3.5 % more on content
    assert moved(applied, Correction(1.0, 0.0, 30.0), obs)  # 10 tokens on a short prompt
    assert moved(applied, Correction(1.0, 5.0, 20.0), obs)  # 145 tokens on the long one
    # fewer: only past 6 % (an overcount compacts a little early, never overflows)
    assert not moved(applied, Correction(0.955, 0.0, 20.0), obs)
    assert not moved(applied, Correction(1.0, 0.0, 6.0), obs)  # 14 tokens fewer on ≥ 256
    assert moved(applied, Correction(0.935, 0.0, 20.0), obs)


def test_reaching_counts_an_overflowed_prompt_at_least_at_its_size() -> None:
    obs = Observation(3000, 20, 3600)
    raised = reaching(Correction(1.0, 0.0, 10.0), obs, HEURISTIC_BOUNDS)
    assert raised.predict(obs) >= 3600
    assert raised.content > 1.0
    already = Correction(1.3, 0.0, 0.0)
    assert reaching(already, obs, HEURISTIC_BOUNDS) == already
    # past the content bound, the rest goes on the request's fixed cost (also bounded)
    capped = reaching(NEUTRAL, Observation(100, 1, 600), HEURISTIC_BOUNDS)
    assert capped.content == 2.0
    assert capped.predict(Observation(100, 1, 0)) >= 600


def test_calibration_is_bounded_in_models_clients_and_history() -> None:
    calibration = Calibration(window=4, max_models=2, max_clients=3)
    for model in ("a", "b", "c"):
        for _ in range(10):
            calibration.observe(model, Observation(1000, 5, 1300), HEURISTIC_BOUNDS)
    assert set(calibration.corrections()) == {"a", "b"}
    assert calibration.observations("a") == calibration.observations("b") == {"": 4}
    assert calibration.observations("c") == {}
    assert calibration.correction("c") == NEUTRAL
    calibration.observe("a", Observation(0, 0, 10), HEURISTIC_BOUNDS)  # nothing to learn
    calibration.observe("a", Observation(10, 1, 0), HEURISTIC_BOUNDS)
    assert calibration.observations("a") == {"": 4}
    for client in ("k1", "k2", "k3"):  # the least recently heard from client goes first
        calibration.observe("a", Observation(1000, 5, 1300), HEURISTIC_BOUNDS, client=client)
    assert calibration.observations("a") == {"k1": 1, "k2": 1, "k3": 1}


def test_calibration_is_thread_safe() -> None:
    calibration = Calibration()
    barrier = threading.Barrier(4)

    def work(k: int) -> None:
        barrier.wait(timeout=10)
        for i in range(200):
            calibration.observe("m", Observation(100 + i + k, 2, 150 + i), HEURISTIC_BOUNDS)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert calibration.observations("m") == {"": 32}
    assert calibration.correction("m") != NEUTRAL


@pytest.mark.anyio
async def test_the_proxy_calibrates_from_usage_and_reports_it(
    client: httpx.AsyncClient, fake: FakeUpstream
) -> None:
    """Every completed response's `usage.prompt_tokens` calibrates the counter for that model,
    and `/stats` shows the factor (`calibration`) and every part (`calibration_detail`)."""
    fake.prompt_tokens = 60  # a template adding ~50 tokens to a tiny prompt
    body = {"model": "qwen-local", "messages": [{"role": "user", "content": "hi there"}]}
    before = (await client.post("/v1/compaction/count", json=body)).json()["prompt_tokens"]
    for _ in range(3):
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
    after = (await client.post("/v1/compaction/count", json=body)).json()["prompt_tokens"]
    assert before < 20
    assert abs(after - 60) <= 3
    stats = (await client.get("/stats")).json()
    assert stats["calibration"]["qwen-local"] < 1.05  # a fixed cost, not a factor on content
    detail = stats["calibration_detail"]["qwen-local"]
    # no system message in any request: the cost is shared with `without_system`
    assert detail["per_request"] + detail["without_system"] == pytest.approx(50, abs=3)


def test_an_implausible_count_is_ignored() -> None:
    """A count no bounded correction comes within a factor of two of (a placeholder, a server
    reporting only what it did not have cached) is not a prompt size: it must not drag the
    fit to its bounds."""
    calibration = Calibration()
    for _ in range(5):
        calibration.observe("m", Observation(8000, 40, 7600), HEURISTIC_BOUNDS)
    settled = calibration.correction("m")
    for _ in range(20):
        calibration.observe("m", Observation(8000, 40, 11), HEURISTIC_BOUNDS)
        calibration.observe("m", Observation(8000, 40, 80_000), HEURISTIC_BOUNDS)
    assert calibration.correction("m") == settled
    assert calibration.observations("m") == {"": 5}


def test_answers_the_fit_already_explains_skip_the_refit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fit on every answer was the biggest fixed cost of a request (issue 16). Answers the
    last fit explains join the history without one — at most REFIT_EVERY in a row — and one it
    does not explain refits at once, so the correction in use is the one refitting every time
    would give, within the deadband."""
    import inflight.tokens.calibration as calibration

    fits = 0
    real_fit = calibration.fit

    def counting_fit(*args: object, **kwargs: object) -> Correction:
        nonlocal fits
        fits += 1
        return real_fit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(calibration, "fit", counting_fit)
    every = Calibration()
    lazy = Calibration()

    def answer(raw: int, messages: int) -> Observation:
        return Observation(raw, messages, round(1.1 * raw + 2 * messages + 30))

    steady = [answer(2000 + 37 * k, 10 + k % 7) for k in range(40)]
    for obs in steady:
        lazy.observe("m", obs, HEURISTIC_BOUNDS)
    lazy_fits, fits = fits, 0
    monkeypatch.setattr(calibration, "REFIT_EVERY", 0)  # the old way: a fit on every answer
    for obs in steady:
        every.observe("m", obs, HEURISTIC_BOUNDS)
    assert fits == len(steady)
    assert lazy_fits <= len(steady) // (calibration.REFIT_EVERY + 1) + 4, lazy_fits
    probe = Observation(30_000, 200, 0)
    assert lazy.correction("m").predict(probe) == pytest.approx(
        every.correction("m").predict(probe), rel=calibration.DEADBAND
    )
    monkeypatch.setattr(calibration, "REFIT_EVERY", 8)
    surprise = Observation(2000, 10, 4000)  # twice what the fit expects: refit at once
    before = fits
    lazy.observe("m", surprise, HEURISTIC_BOUNDS)
    assert fits == before + 1


def test_answers_that_scatter_as_the_fit_does_skip_the_refit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real upstream's counts scatter around any fit by a few per cent (another tokenizer's
    quirks): measured against half the deadband alone, every answer refitted. An answer within
    twice the fit's own scatter is explained: refits stay at about one in REFIT_EVERY, and the
    correction in use is what refitting every time gives, within the deadband."""
    import inflight.tokens.calibration as calibration

    fits = 0
    real_fit = calibration.fit

    def counting_fit(*args: object, **kwargs: object) -> Correction:
        nonlocal fits
        fits += 1
        return real_fit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(calibration, "fit", counting_fit)

    def answer(k: int) -> Observation:
        raw, messages = 3000 + 53 * k, 12 + k % 5
        wobble = (1.04, 0.97, 1.0, 0.96, 1.03, 0.99, 1.02)[k % 7]  # ±4 %, as a tokenizer's
        return Observation(raw, messages, round(wobble * (1.1 * raw + 2 * messages + 30)))

    lazy, every = Calibration(), Calibration()
    noisy = [answer(k) for k in range(80)]
    for obs in noisy:
        lazy.observe("m", obs, HEURISTIC_BOUNDS)
    lazy_fits, fits = fits, 0
    monkeypatch.setattr(calibration, "REFIT_EVERY", 0)  # a fit on every answer
    for obs in noisy:
        every.observe("m", obs, HEURISTIC_BOUNDS)
    assert fits == len(noisy)
    assert lazy_fits <= len(noisy) // 4, lazy_fits
    probe = Observation(30_000, 200, 0)
    assert lazy.correction("m").predict(probe) == pytest.approx(
        every.correction("m").predict(probe), rel=calibration.DEADBAND
    )


def test_bounds_list_their_intervals_in_the_order_of_the_parameters() -> None:
    """`Bounds.limits` spells its fields out (it is asked on every answer): the same intervals,
    in the order of the dataclass fields and of `Correction.params`."""
    for bounds in (HEURISTIC_BOUNDS, EXACT_BOUNDS):
        assert bounds.limits() == tuple(getattr(bounds, f.name) for f in dataclasses.fields(bounds))
    assert [f.name for f in dataclasses.fields(Bounds)] == [
        f.name for f in dataclasses.fields(Correction)
    ]
