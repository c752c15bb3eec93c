"""Per-model calibration of token estimates against the upstream's own counts.

A chat template adds tokens the estimate cannot see, a fixed cost per request and per message on top
of a content count off by a factor: the correction (`Correction`) keeps them apart.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any, cast

WINDOW = 32  # observations kept per model
DECAY = 0.9  # weight of an observation one step older: a new conversation takes over soon
# Expected disagreement of an observation with the model: a few tokens of template quirks on
# any prompt, a few per cent of content on a long one. Weights are 1 / (FIXED² + (RELATIVE·x)²)
# with x our own estimate (not the upstream's count, which would favour low answers): short
# prompts pin the fixed costs, long ones the factor on content.
FIXED_NOISE = 16.0
RELATIVE_NOISE = 0.02
# The correction in use moves when the fit would count some prompt more than DEADBAND above
# it, or more than SLACK below (an overcount only compacts a little early; an undercount nears
# the window). A band this wide keeps cut points still between events while the fit wobbles.
DEADBAND = 0.03
SLACK = 0.06
DEADBAND_FLOOR = 256  # ... relative to at least this many tokens (short prompts wobble by a few)
MAX_MODELS = 1024  # model names come from clients: bounded
MAX_CLIENTS = 16  # clients whose observations are kept per model (least recently heard from go)
MIN_ACTUAL = 16  # a smaller count is a placeholder or a prompt of pure framing: nothing to learn
MAX_SOLVER_STEPS = 64  # the active-set solver needs a few; this bounds it whatever the input
# A fit costs CPU on every answer. An observation the last fit already
# explains (within half the deadband) cannot move the correction in use by itself, so it joins
# the history without a refit — at most this many in a row, so that fading old observations
# still count.
REFIT_EVERY = 8
# ... "explains": within half the deadband, or, when the fit's own observations scatter more
# (a count it cannot model to 1 %: another tokenizer's quirks), within twice their typical
# scatter — else every answer would refit — but never past this share.
MAX_EXPLAINED = 0.25
# Prior stiffness per parameter toward "no correction", in the units of the weighted sum of
# squares (a short prompt weighs about 1/256, a 3,000-token one 1/3,900). `content`: a twentieth
# of one 3,000-token prompt but some thirty short ones, so short prompts alone hardly move it.
# The overheads: a fortieth of one short prompt, so a few prompts settle them; where the prompts
# seen do not tell two of them apart (none had a system message, say), they share the cost.
# `per_message` is stiffer (a short prompt of two messages; a long conversation outweighs it
# tenfold): a fixed cost is not spread over the messages of the prompts that showed it.
PRIOR = (100.0, 1e-2, 1e-4, 1e-4, 1e-4)
_SIZE = len(PRIOR)

Vector = tuple[float, float, float, float, float]
# How far one client's fit moves each parameter of the correction every client's counts use
# (`consensus`), unless an overflow error backs it: the heuristic reads 0–25 % high, a template
# adds a few tokens per message and a few hundred per request. More matters only near the
# window, where an undercount meets the upstream's overflow error, which lifts the limit.
CLIENT_REACH: Vector = (0.25, 2.0, 256.0, 128.0, 256.0)
CLIENT_HALF_LIFE = 3600.0  # seconds: a client not heard from for this long weighs half
# A correction's parameters, or their bounds, in order (Correction's and Bounds' fields).
_IN_ORDER = attrgetter("content", "per_message", "per_request", "without_system", "with_tools")


@dataclass(frozen=True, slots=True)
class Observation:
    """One request: our uncalibrated estimate, its message count, whether it opens with a
    system message and defines tools, and the upstream's count."""

    raw: float
    messages: int
    actual: float
    system: bool = True
    tools: bool = False

    def features(self) -> Vector:
        return (
            self.raw,
            float(max(self.messages - 1, 0)),
            1.0,
            0.0 if self.system else 1.0,
            1.0 if self.tools else 0.0,
        )


@dataclass(frozen=True, slots=True)
class Correction:
    """actual ≈ content × raw + per_request + per_message × (messages − 1), plus
    `without_system` for a request without a system message and `with_tools` for one that
    defines tools. `per_request` is the fixed cost of a one-message request, so a single
    message's framing is never split between the two (they cannot be told apart)."""

    content: float = 1.0
    per_message: float = 0.0
    per_request: float = 0.0
    without_system: float = 0.0
    with_tools: float = 0.0

    def params(self) -> Vector:
        return cast(Vector, _IN_ORDER(self))

    def predict(self, obs: Observation) -> float:
        return sum(p * f for p, f in zip(self.params(), obs.features(), strict=True))

    def as_dict(self) -> dict[str, float]:
        return {
            "content": round(self.content, 4),
            "per_message": round(self.per_message, 2),
            "per_request": round(self.per_request, 2),
            "without_system": round(self.without_system, 2),
            "with_tools": round(self.with_tools, 2),
        }


NEUTRAL = Correction()

Interval = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Bounds:
    """Closed intervals for each parameter of a `Correction`, in the same order."""

    content: Interval
    per_message: Interval
    per_request: Interval
    without_system: Interval
    with_tools: Interval

    def limits(self) -> tuple[Interval, ...]:
        """The intervals in the order of `Correction.params` (read at C speed: every answer
        asks)."""
        return cast(tuple[Interval, ...], _IN_ORDER(self))


# Heuristic-counted models: the content factor within 0.5–2; templates add a few tokens per
# message (Llama 3, Qwen, Gemma: about one more than OpenAI's framing; Mistral: fewer), a fixed
# cost per request (a knowledge-date header; a system prompt the server adds, as an Ollama
# Modelfile's can, up to 2,048), a default system prompt when the request has none (Qwen) and
# a tool-use preamble of up to a thousand tokens.
HEURISTIC_BOUNDS = Bounds((0.5, 2.0), (-3.0, 8.0), (-8.0, 2048.0), (-64.0, 256.0), (-64.0, 1024.0))
# tiktoken models are counted exactly: only hidden framing can add, never subtract.
EXACT_BOUNDS = Bounds((1.0, 1.1), (0.0, 2.0), (0.0, 256.0), (0.0, 0.0), (0.0, 256.0))


def solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when (nearly) singular."""
    n = len(rhs)
    a = [[*row, value] for row, value in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for k in range(col, n + 1):
                a[r][k] -= f * a[col][k]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - sum(a[r][k] * out[k] for k in range(r + 1, n))) / a[r][r]
    return out


def normal_equations(observations: Sequence[Observation]) -> tuple[list[list[float]], list[float]]:
    """The weighted least-squares system, prior included: minimise θᵀMθ − 2vᵀθ."""
    matrix = [[0.0] * _SIZE for _ in range(_SIZE)]
    rhs = [0.0] * _SIZE
    weight = 1.0
    for obs in reversed(observations):  # newest first: it has the full weight
        features = obs.features()
        w = weight / (FIXED_NOISE**2 + (RELATIVE_NOISE * obs.raw) ** 2)
        for j in range(_SIZE):
            rhs[j] += w * features[j] * obs.actual
            for k in range(_SIZE):
                matrix[j][k] += w * features[j] * features[k]
        weight *= DECAY
    for j, (stiffness, neutral) in enumerate(zip(PRIOR, NEUTRAL.params(), strict=True)):
        matrix[j][j] += stiffness
        rhs[j] += stiffness * neutral
    return matrix, rhs


def _newton_step(
    matrix: list[list[float]], gradient: list[float], fixed: dict[int, int]
) -> list[float] | None:
    """The step to the minimum over the parameters not held at a bound."""
    free = [j for j in range(len(gradient)) if j not in fixed]
    step = [0.0] * len(gradient)
    if not free:
        return step
    solved = solve([[matrix[j][k] for k in free] for j in free], [-gradient[j] for j in free])
    if solved is None:
        return None
    for j, value in zip(free, solved, strict=True):
        step[j] = value
    return step


def box_minimum(
    matrix: list[list[float]], rhs: list[float], limits: Sequence[Interval], start: Sequence[float]
) -> list[float]:
    """Minimise θᵀMθ − 2vᵀθ (M positive definite) within the box `limits`, from a feasible
    `start`: the primal active-set method (Nocedal & Wright, Algorithm 16.3). Each step
    solves for the free parameters, stops at the first bound in the way and holds it there;
    at a stationary point a held parameter whose gradient points into the box is released."""
    n = len(rhs)
    theta = list(start)
    fixed: dict[int, int] = {}  # parameter -> 0 held at its lower bound, 1 at its upper
    for _ in range(MAX_SOLVER_STEPS):
        gradient = [sum(matrix[j][k] * theta[k] for k in range(n)) - rhs[j] for j in range(n)]
        step = _newton_step(matrix, gradient, fixed)
        if step is None:
            break
        if all(abs(s) <= 1e-12 * (1.0 + abs(t)) for s, t in zip(step, theta, strict=True)):
            tolerance = [1e-9 * (abs(rhs[j]) + matrix[j][j]) for j in range(n)]
            wrong = [
                j
                for j, side in fixed.items()
                if (gradient[j] < -tolerance[j] if side == 0 else gradient[j] > tolerance[j])
            ]
            if not wrong:
                break
            del fixed[max(wrong, key=lambda j: abs(gradient[j]) / (matrix[j][j] or 1.0))]
            continue
        alpha, blocking = 1.0, None
        for j, s in enumerate(step):
            if j in fixed or s == 0:
                continue
            side = 0 if s < 0 else 1
            room = (limits[j][side] - theta[j]) / s
            if room < alpha:
                alpha, blocking = max(room, 0.0), (j, side)
        theta = [t + alpha * s for t, s in zip(theta, step, strict=True)]
        if blocking is not None:
            j, side = blocking
            theta[j] = limits[j][side]
            fixed[j] = side
    return [min(high, max(low, t)) for t, (low, high) in zip(theta, limits, strict=True)]


def fit(observations: Sequence[Observation], bounds: Bounds) -> Correction:
    """The bounded correction that best explains `observations` (NEUTRAL when there are none).

    Weighted least squares over the model's most recent observations. Each observation is weighed by
    its size, so that long prompts, where the window is at stake, decide the factor on content and
    short ones the fixed costs (the error expected of a prompt is a few tokens plus a few per cent
    of its size), and by its recency (older ones fade). A weak prior pulls each parameter toward "no
    correction", so request shapes that do not separate them (every prompt the same length, or with
    the same number of messages) leave the unknown part near neutral instead of wild; every
    parameter is bounded.
    """
    if not observations:
        return NEUTRAL
    matrix, rhs = normal_equations(observations)
    limits = bounds.limits()
    start = [
        min(high, max(low, p)) for p, (low, high) in zip(NEUTRAL.params(), limits, strict=True)
    ]
    best = box_minimum(matrix, rhs, limits, start)
    content, per_message, per_request, without_system, with_tools = best
    return Correction(
        round(content, 4),
        round(per_message, 2),
        round(per_request, 2),
        round(without_system, 2),
        round(with_tools, 2),
    )


def moved(applied: Correction, fitted: Correction, observations: Iterable[Observation]) -> bool:
    """True when `fitted` would count more than `DEADBAND` above the correction in use, or more
    than `SLACK` below it: the content factor (what decides long prompts) or the count of any
    observed prompt."""
    change = fitted.content - applied.content
    if not -SLACK * applied.content <= change <= DEADBAND * applied.content:
        return True
    for obs in observations:
        before = applied.predict(obs)
        change = fitted.predict(obs) - before
        if not -SLACK <= change / max(before, DEADBAND_FLOOR) <= DEADBAND:
            return True
    return False


def _scatter(correction: Correction, observations: Sequence[Observation]) -> float:
    """How far `observations` typically are from what `correction` predicts: the root mean
    square of the relative misses (relative to at least `DEADBAND_FLOOR` tokens)."""
    misses = [
        ((correction.predict(o) - o.actual) / max(correction.predict(o), DEADBAND_FLOOR)) ** 2
        for o in observations
    ]
    return math.sqrt(sum(misses) / len(misses)) if misses else 0.0


def reaching(correction: Correction, obs: Observation, bounds: Bounds) -> Correction:
    """`correction`, raised (content first, then per request, within bounds) until it counts
    `obs` at least at its actual size — in whole tokens too: a count rounds each message and
    the rest of the prompt apart, half a token off each at most."""
    wanted = obs.actual + 0.5 * (obs.messages + 1)
    missing = wanted - correction.predict(obs)
    if missing <= 0:
        return correction
    low, high = bounds.content
    content = min(high, max(low, correction.content + missing / obs.raw))
    raised = replace(correction, content=max(content, correction.content))
    missing = wanted - raised.predict(obs)
    if missing > 0:
        per_request = min(bounds.per_request[1], raised.per_request + missing)
        raised = replace(raised, per_request=per_request)
    return raised


def plausible(obs: Observation, bounds: Bounds) -> bool:
    """Whether `obs` can be a prompt's size: at least `MIN_ACTUAL` tokens, and within a factor
    of two of what some correction within `bounds` predicts. A count far
    outside says something else (a server reporting only what it did not have cached, a
    placeholder): fitted, it would drag every parameter to a bound."""
    pairs = list(zip(bounds.limits(), obs.features(), strict=True))
    ends = [sum(limit[side] * f for limit, f in pairs) for side in (0, 1)]
    return obs.actual >= MIN_ACTUAL and ends[0] / 2 <= obs.actual <= 2 * ends[1]


@dataclass(frozen=True, slots=True)
class ClientFit:
    """One client's last fit of a model, how much its observations say about each parameter
    (`evidence`, 0–1: none to far more than the prior), how far they scatter around the fit,
    and how many observations joined since without a refit."""

    fit: Correction
    evidence: Vector
    heard: float  # when the client was last heard from (the calibration's clock)
    scatter: float = 0.0
    since: int = 0
    backed: bool = False  # an overflow error stated one of its prompts' size: no reach limit

    def weight(self, now: float) -> Vector:
        """Its evidence, fading with the time since it was last heard from (by the clock, not
        by other clients' requests, so that those move nobody's weight against another's)."""
        fade = 0.5 ** (max(0.0, now - self.heard) / CLIENT_HALF_LIFE)
        return cast(Vector, tuple(e * fade for e in self.evidence))


def evidence(observations: Sequence[Observation]) -> Vector:
    """Per parameter, what `observations` say about it against the prior: m / (m + prior), m
    the diagonal of their normal equations (0 for a feature they never showed: a client that
    always sends a system message says nothing about `without_system`)."""
    matrix, _ = normal_equations(observations)
    return cast(
        Vector,
        tuple(
            max(0.0, (matrix[j][j] - p) / matrix[j][j]) if matrix[j][j] > 0 else 0.0
            for j, p in enumerate(PRIOR)
        ),
    )


def consensus(fits: Iterable[ClientFit], now: float, reach: Vector = CLIENT_REACH) -> Correction:
    """The correction shared by every client: per parameter, the mean of the clients'
    deviations from "no correction", each clipped to `reach` and weighed by the client's
    faded evidence (at most 1). So one client alone moves a parameter at most `reach`, and
    among others it moves it at most 2·reach·w/(w + W) from where they put it (w its weight,
    W theirs) — whatever it sends."""
    neutral = NEUTRAL.params()
    totals = [0.0] * _SIZE
    weights = [0.0] * _SIZE
    for client in fits:
        params = client.fit.params()
        for j, (value, weight) in enumerate(zip(params, client.weight(now), strict=True)):
            deviation = value - neutral[j]
            if not client.backed:
                deviation = min(reach[j], max(-reach[j], deviation))
            totals[j] += weight * deviation
            weights[j] += weight
    shared = [
        n + (t / w if w > 0 else 0.0) for n, t, w in zip(neutral, totals, weights, strict=True)
    ]
    content, per_message, per_request, without_system, with_tools = shared
    return Correction(
        round(content, 4),
        round(per_message, 2),
        round(per_request, 2),
        round(without_system, 2),
        round(with_tools, 2),
    )


@dataclass(frozen=True, slots=True)
class Observed:
    """One observation as the calibration took it: everything `Calibration.apply` needs to
    take it again, the same way, on another replica (app/windows/shared.py)."""

    model: str
    obs: Observation
    bounds: Bounds
    overflowed: bool
    client: str
    now: float


class Calibration:
    """Per model: each client's recent observations and fit, and the correction in use — the
    clients' bounded consensus (`consensus`), so that one client's odd requests (a template of
    its own, counts its upstream reports differently) move another's counts only that far.
    Thread-safe, bounded in models, clients per model and observations per client.

    `journal`, when set, is told every observation taken (replicas share them: the state of a
    model is a function of its observations in order, `export`ed and `install`ed whole).

    The correction in use moves only when the fit would count some prompt more than `DEADBAND`
    higher or `SLACK` lower (plans depend on counts, and a move re-places a conversation's
    earlier cuts: DESIGN.md §4.7); an overflow error that states the prompt's real size
    applies the fit at once and makes sure that prompt is counted at least that big (DESIGN.md §8),
    so the retry differs from what failed. No client may drag the correction the others are counted
    with (DESIGN.md §7 Isolation): each client's deviation is clipped to `CLIENT_REACH` unless an
    overflow error backs that client's fit.
    """

    def __init__(
        self,
        window: int = WINDOW,
        max_models: int = MAX_MODELS,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._window = window
        self._max_models = max_models
        self._max_clients = max_clients
        # per model, per client (least recently heard from first): its recent observations
        self._history: dict[str, OrderedDict[str, deque[Observation]]] = {}
        self._fits: dict[str, dict[str, ClientFit]] = {}  # per model, per client: its last fit
        self._applied: dict[str, Correction] = {}
        self._changes: dict[str, int] = {}  # per model: how many times its correction changed
        self._lock = threading.Lock()
        self.journal: Callable[[Observed], None] | None = None

    def correction(self, model: str) -> Correction:
        with self._lock:
            return self._applied.get(model, NEUTRAL)

    def state(self, model: str) -> tuple[Correction, int]:
        """The correction in use and how many times it changed so far: equal states mean
        nothing was recalibrated in between (what a remembered plan is keyed by)."""
        with self._lock:
            return self._applied.get(model, NEUTRAL), self._changes.get(model, 0)

    def corrections(self) -> dict[str, Correction]:
        with self._lock:
            return dict(self._applied)

    def observations(self, model: str) -> dict[str, int]:
        """How many observations of `model` are kept, per client."""
        with self._lock:
            return {c: len(h) for c, h in self._history.get(model, OrderedDict()).items()}

    def _client_history(self, model: str, client: str) -> deque[Observation] | None:
        """`client`'s history of `model` (created, evicting the least recently heard from
        client past `max_clients`); None past `max_models`."""
        clients = self._history.get(model)
        if clients is None:
            if len(self._history) >= self._max_models:
                return None
            clients = self._history[model] = OrderedDict()
            self._fits[model] = {}
        history = clients.get(client)
        if history is None:
            if len(clients) >= self._max_clients:
                gone, _ = clients.popitem(last=False)
                self._fits[model].pop(gone, None)
            history = clients[client] = deque(maxlen=self._window)
        clients.move_to_end(client)
        return history

    def observe(
        self,
        model: str,
        obs: Observation,
        bounds: Bounds,
        *,
        overflowed: bool = False,
        client: str = "",
    ) -> None:
        """Add one observation of `client` and refit its fit and the consensus; `overflowed`:
        the upstream rejected this prompt as too long, so the consensus applies at once and
        counts it at least at `obs.actual`."""
        if obs.raw <= 0 or obs.actual <= 0 or not plausible(obs, bounds):
            return
        taken = Observed(model, obs, bounds, overflowed, client, self._clock())
        if self.apply(taken) and self.journal is not None:
            self.journal(taken)

    def apply(self, taken: Observed) -> bool:
        """Take one observation (`observe`'s work, at its own time); False past `max_models`."""
        model, obs, bounds, client, now = (
            taken.model, taken.obs, taken.bounds, taken.client, taken.now,
        )  # fmt: skip
        with self._lock:
            history = self._client_history(model, client)
            if history is None:
                return False
            history.append(obs)
            fits = self._fits[model]
            last = fits.get(client)
            if not taken.overflowed and last is not None and last.since < REFIT_EVERY:
                expected = last.fit.predict(obs)
                explained = min(MAX_EXPLAINED, max(DEADBAND / 2, 2 * last.scatter))
                if abs(expected - obs.actual) <= explained * max(expected, DEADBAND_FLOOR):
                    fits[client] = replace(last, heard=now, since=last.since + 1)
                    return True
            fitted = fit(history, bounds)
            backed = taken.overflowed or (last is not None and last.backed)
            scatter = _scatter(fitted, history)
            fits[client] = ClientFit(fitted, evidence(history), now, scatter, backed=backed)
            shared = consensus(fits.values(), now)
            applied = self._applied.get(model, NEUTRAL)
            if taken.overflowed:
                self._applied[model] = reaching(shared, obs, bounds)
            elif moved(applied, shared, self._all(model)):
                self._applied[model] = shared
            if self._applied.get(model, NEUTRAL) != applied:
                self._changes[model] = self._changes.get(model, 0) + 1
            return True

    def _all(self, model: str) -> Iterator[Observation]:
        for history in self._history[model].values():
            yield from history

    def export(self, model: str) -> dict[str, Any]:
        """`model`'s whole state as plain JSON values (`install` takes it back)."""
        with self._lock:
            clients = self._history.get(model, OrderedDict())
            fits = self._fits.get(model, {})
            return {
                "clients": [
                    [c, [[o.raw, o.messages, o.actual, o.system, o.tools] for o in h]]
                    for c, h in clients.items()
                ],
                "fits": {
                    c: [
                        list(f.fit.params()),
                        list(f.evidence),
                        f.heard,
                        f.scatter,
                        f.since,
                        f.backed,
                    ]
                    for c, f in fits.items()
                },
                "applied": list(self._applied[model].params()) if model in self._applied else None,
                "changes": self._changes.get(model, 0),
            }

    def install(self, model: str, state: dict[str, Any]) -> None:
        """Replace `model`'s state with `state` (an `export`: another replica's)."""
        with self._lock:
            if model not in self._history and len(self._history) >= self._max_models:
                return
            clients: OrderedDict[str, deque[Observation]] = OrderedDict()
            for client, rows in state["clients"]:
                clients[client] = deque(
                    (Observation(r[0], r[1], r[2], r[3], r[4]) for r in rows), maxlen=self._window
                )
            self._history[model] = clients
            self._fits[model] = {
                c: ClientFit(Correction(*f[0]), cast(Vector, tuple(f[1])), f[2], f[3], f[4], f[5])
                for c, f in state["fits"].items()
            }
            if state["applied"] is None:
                self._applied.pop(model, None)
            else:
                self._applied[model] = Correction(*state["applied"])
            self._changes[model] = state["changes"]
