"""The price table, the cost arithmetic and the uncompacted baseline (app/pricing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inflight.pricing.cost import Billed, automatic_hit, baseline_billed, dollars
from inflight.pricing.history import PromptHistory, conversation_items, conversation_key
from inflight.pricing.table import BaselineRules, Caching, ModelPrice, PriceTable, PriceTableError

CONFIG = Path(__file__).resolve().parents[3] / "config" / "prices.toml"
RULES = BaselineRules()
GPT_4O = ModelPrice(models=("gpt-4o",), input=2.5, cached_input=1.25, output=10.0)
SONNET = ModelPrice(
    models=("claude-sonnet-4*",),
    input=3.0,
    cached_input=0.3,
    cache_write=3.75,
    output=15.0,
    caching=Caching.EXPLICIT,
)


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.load(CONFIG)


# --- the shipped table -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "rates"),
    [
        ("gpt-4o", (2.5, 1.25, 10.0)),
        ("gpt-4o-2024-11-20", (2.5, 1.25, 10.0)),
        ("gpt-4o-2024-05-13", (5.0, 5.0, 15.0)),  # the launch snapshot: its own price
        ("gpt-4o-mini", (0.15, 0.075, 0.6)),  # not gpt-4o
        ("gpt-4o-mini-2024-07-18", (0.15, 0.075, 0.6)),
        ("gpt-4.1", (2.0, 0.5, 8.0)),
        ("gpt-4.1-mini", (0.4, 0.1, 1.6)),
        ("gpt-4.1-nano-2025-04-14", (0.1, 0.025, 0.4)),
        ("o3", (2.0, 0.5, 8.0)),
        ("o3-mini", (1.1, 0.55, 4.4)),
        ("o4-mini", (1.1, 0.275, 4.4)),
        ("gpt-5", (1.25, 0.125, 10.0)),
        ("gpt-5-2025-08-07", (1.25, 0.125, 10.0)),
        ("gpt-5-mini", (0.25, 0.025, 2.0)),
        ("gpt-5-nano", (0.05, 0.005, 0.4)),
        ("gpt-5-pro", (15.0, 15.0, 120.0)),
        ("openai/GPT-4o", (2.5, 1.25, 10.0)),  # provider prefix and case
        ("claude-opus-4-1-20250805", (15.0, 1.5, 75.0)),
        ("claude-opus-4-5-20251101", (5.0, 0.5, 25.0)),
        ("claude-sonnet-4-5-20250929", (3.0, 0.3, 15.0)),
        ("claude-3-7-sonnet-20250219", (3.0, 0.3, 15.0)),
        ("claude-haiku-4-5-20251001", (1.0, 0.1, 5.0)),
        ("claude-3-5-haiku-20241022", (0.8, 0.08, 4.0)),
        ("anthropic/claude-3-haiku-20240307", (0.25, 0.03, 1.25)),
    ],
)
def test_shipped_prices(table: PriceTable, model: str, rates: tuple[float, float, float]) -> None:
    price = table.lookup(model)
    assert price is not None, model
    assert (price.input, price.cache_read_rate, price.output) == pytest.approx(rates)


def test_shipped_table_says_when_and_where(table: PriceTable) -> None:
    assert table.currency == "USD"
    assert table.as_of
    assert any("openai.com" in s for s in table.sources)
    assert any("anthropic.com" in s for s in table.sources)
    for entry in table.price:
        if entry.caching is Caching.EXPLICIT:
            # 5-minute writes: 1.25x input (Claude 3 Haiku's $0.30 is listed rounded)
            assert entry.cache_write == pytest.approx(entry.input * 1.25, rel=0.05)


@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b", "llama3.1:8b", "gpt-4", "fake-model", ""])
def test_self_hosted_and_unknown_models_are_unpriced(table: PriceTable, model: str) -> None:
    assert table.lookup(model) is None


def test_first_match_wins() -> None:
    table = PriceTable.parse(
        '[[price]]\nmodels = ["m-mini*"]\ninput = 1\noutput = 2\n'
        '[[price]]\nmodels = ["m-*"]\ninput = 10\noutput = 20\n',
        "t.toml",
    )
    assert table.lookup("m-mini-1") is table.price[0]
    assert table.lookup("m-large") is table.price[1]


def test_missing_file_means_everything_unpriced(tmp_path: Path) -> None:
    assert PriceTable.load(tmp_path / "prices.toml").lookup("gpt-4o") is None


@pytest.mark.parametrize(
    "text",
    [
        "[[price]\nmodels = ['x']",  # not TOML
        "[[price]]\nmodels = ['x']\ninput = 1\n",  # no output price
        "[[price]]\nmodels = ['x']\ninput = -1\noutput = 1\n",  # negative
        "[[price]]\nmodels = []\ninput = 1\noutput = 1\n",  # covers nothing
        "[[price]]\nmodels = [' ']\ninput = 1\noutput = 1\n",  # an empty name
        "[[price]]\nmodels = ['x']\ninput = 1\noutput = 1\ncache_read = 1\n",  # unknown key
        "[[price]]\nmodels = ['x']\ninput = 1\noutput = 1\ncaching = 'sometimes'\n",
        "currency = 'EUR'\n",
        "[baseline]\nautomatic_increment = 0\n",
    ],
)
def test_malformed_table_is_an_error_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(text)
    with pytest.raises(PriceTableError, match=str(path)):
        PriceTable.load(path)


def test_undecodable_table_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(PriceTableError, match=str(path)):
        PriceTable.load(path)


# --- dollars -----------------------------------------------------------------------------------


def test_cached_share_at_the_cached_price() -> None:
    # 2,000 fresh at $2.50, 8,000 cached at $1.25, 500 out at $10 (per 1M)
    billed = Billed(prompt=10_000, cached=8_000, completion=500)
    assert dollars(GPT_4O, billed) == pytest.approx((2_000 * 2.5 + 8_000 * 1.25 + 500 * 10) / 1e6)


def test_anthropic_cache_writes_at_the_write_price() -> None:
    # prompt = 1,000 fresh + 6,000 read + 3,000 written
    billed = Billed(prompt=10_000, cached=6_000, cache_write=3_000, completion=500)
    expected = (1_000 * 3.0 + 6_000 * 0.3 + 3_000 * 3.75 + 500 * 15.0) / 1e6
    assert dollars(SONNET, billed) == pytest.approx(expected)


def test_no_discount_without_a_cached_price() -> None:
    plain = ModelPrice(models=("m",), input=4.0, output=8.0)
    assert dollars(plain, Billed(prompt=1_000, cached=1_000)) == pytest.approx(4_000 / 1e6)
    assert dollars(plain, Billed(prompt=1_000, cache_write=1_000)) == pytest.approx(4_000 / 1e6)


def test_inconsistent_usage_never_bills_a_token_twice() -> None:
    # an upstream reporting more cached (or written) tokens than prompt tokens
    billed = Billed(prompt=100, cached=150, cache_write=50, completion=-3)
    assert (billed.read, billed.written, billed.fresh) == (100, 0, 0)
    assert dollars(SONNET, billed) == pytest.approx(100 * 0.3 / 1e6)


@given(
    prompt=st.integers(0, 10**7),
    cached=st.integers(0, 10**7),
    written=st.integers(0, 10**7),
    completion=st.integers(0, 10**6),
)
def test_each_prompt_token_in_exactly_one_category(
    prompt: int, cached: int, written: int, completion: int
) -> None:
    billed = Billed(prompt, cached, written, completion)
    assert billed.read + billed.written + billed.fresh == prompt
    assert min(billed.read, billed.written, billed.fresh) >= 0
    # caching never makes a request dearer than no caching at OpenAI, nor cheaper than all-hits
    cost = dollars(GPT_4O, billed)
    assert dollars(GPT_4O, Billed(prompt, completion=completion)) >= cost - 1e-12
    assert cost >= dollars(GPT_4O, Billed(prompt, prompt, 0, completion)) - 1e-12


# --- the baseline ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "reusable", "hit"),
    [(5_000, 0, 0), (5_000, 1_000, 0), (5_000, 1_024, 1_024), (5_000, 1_500, 1_408),
     (1_500, 9_000, 1_408), (900, 900, 0)],
)  # fmt: skip
def test_automatic_cache_hits_in_steps_above_a_minimum(
    prompt: int, reusable: int, hit: int
) -> None:
    assert automatic_hit(RULES, prompt, reusable) == hit


def test_baseline_adds_what_compaction_removed_and_caches_the_previous_prompt() -> None:
    actual = Billed(prompt=4_000, cached=3_968, completion=300)
    baseline = baseline_billed(GPT_4O, RULES, actual, removed=6_000, reusable=9_000)
    assert baseline == Billed(prompt=10_000, cached=8_960, completion=300)


def test_baseline_of_an_uncompacted_first_request_is_the_request() -> None:
    actual = Billed(prompt=4_000, completion=300)
    assert baseline_billed(GPT_4O, RULES, actual, removed=0, reusable=0) == actual


def test_explicit_caching_baseline_without_client_markers_caches_nothing() -> None:
    actual = Billed(prompt=4_000, completion=300)  # no cache_control: no reads, no writes
    baseline = baseline_billed(SONNET, RULES, actual, removed=6_000, reusable=9_000)
    assert baseline == Billed(prompt=10_000, completion=300)


def test_explicit_caching_baseline_reads_the_prefix_and_writes_like_the_client() -> None:
    # the client wrote 3/4 of what it did not read
    actual = Billed(prompt=5_000, cached=1_000, cache_write=3_000, completion=200)
    baseline = baseline_billed(SONNET, RULES, actual, removed=7_000, reusable=8_000)
    assert baseline == Billed(prompt=12_000, cached=8_000, cache_write=3_000, completion=200)
    # everything read: the new part is written in full
    all_read = Billed(prompt=5_000, cached=5_000, completion=1)
    assert baseline_billed(SONNET, RULES, all_read, 1_000, 5_000).cache_write == 1_000


def test_compaction_event_can_cost_more_than_the_baseline() -> None:
    """The honest case: a compaction event busts the cache; the baseline would have hit it."""
    actual = Billed(prompt=20_000, cached=0, completion=100)  # the new, compacted prefix
    baseline = baseline_billed(GPT_4O, RULES, actual, removed=5_000, reusable=24_000)
    assert dollars(GPT_4O, baseline) < dollars(GPT_4O, actual)


# --- the conversation map ----------------------------------------------------------------------


def _chat(*contents: str) -> dict[str, object]:
    roles = ["system", "user"] + ["assistant", "user"] * len(contents)
    return {
        "model": "gpt-4o",
        "messages": [{"role": r, "content": c} for r, c in zip(roles, contents, strict=False)],
    }


def _remembered(history: PromptHistory, body: dict[str, object], tokens: int, now: float) -> int:
    items = conversation_items(body)
    assert items is not None
    key = conversation_key("gpt-4o", body, items)
    return history.observe(key, items, tokens, now, ttl=600)


def test_append_only_conversation_reuses_its_previous_prompt() -> None:
    history = PromptHistory(capacity=10)
    assert _remembered(history, _chat("sys", "u1"), 1_000, now=0) == 0  # first: uncached
    assert _remembered(history, _chat("sys", "u1", "a1", "u2"), 1_500, now=10) == 1_000
    assert _remembered(history, _chat("sys", "u1", "a1", "u2", "a2", "u3"), 2_000, now=20) == 1_500


def test_edited_history_and_expired_cache_reuse_nothing() -> None:
    history = PromptHistory(capacity=10)
    _remembered(history, _chat("sys", "u1", "a1", "u2"), 1_500, now=0)
    assert _remembered(history, _chat("sys", "u1", "EDITED", "u2", "a2"), 1_600, now=1) == 0
    assert (
        _remembered(history, _chat("sys", "u1", "EDITED", "u2", "a2", "u3"), 1_700, now=2) == 1_600
    )
    assert (
        _remembered(history, _chat("sys", "u1", "EDITED", "u2", "a2", "u3", "a3"), 1_800, now=700)
        == 0
    )
    assert _remembered(history, _chat("sys", "u1"), 900, now=701) == 0  # shorter: a new branch
    # the same prompt again (a retry) is all cached
    assert _remembered(history, _chat("sys", "u1"), 900, now=702) == 900


def test_conversations_are_told_apart_by_model_and_pinned_head() -> None:
    body = _chat("sys", "u1", "a1", "u2")
    items = conversation_items(body)
    assert items is not None
    other_user = _chat("sys", "another task", "a1", "u2")
    other_items = conversation_items(other_user)
    assert other_items is not None
    key = conversation_key("gpt-4o", body, items)
    assert key == conversation_key("gpt-4o", _chat("sys", "u1"), items[:2])
    assert key != conversation_key("gpt-4o-mini", body, items)
    assert key != conversation_key("gpt-4o", other_user, other_items)
    anthropic = {"system": "be brief", "messages": items[1:]}
    assert conversation_key("m", anthropic, items[1:]) != conversation_key(
        "m", {**anthropic, "system": "be long"}, items[1:]
    )


def test_history_is_bounded_least_recent_first() -> None:
    history = PromptHistory(capacity=2)
    for n in range(3):
        _remembered(history, _chat(f"sys{n}", "u"), 100 + n, now=n)
    assert len(history) == 2
    assert _remembered(history, _chat("sys0", "u", "a", "u2"), 500, now=5) == 0  # evicted
    assert _remembered(history, _chat("sys2", "u", "a", "u2"), 500, now=5) == 102


def test_bodies_without_history_have_no_conversation() -> None:
    assert conversation_items({"model": "m", "messages": []}) is None
    assert conversation_items({"model": "m", "input": "a string"}) is None
    assert conversation_items({"model": "m", "input": [{"role": "user", "content": "x"}]})


# --- `inflight stats` ----------------------------------------------------------------------------


def test_inflight_stats_prints_dollars() -> None:
    from inflight.cli.stats_table import render_stats, usd

    def cost(actual: float, baseline: float, summaries: float = 0.0) -> dict[str, object]:
        return {"currency": "USD", "actual": actual, "baseline": baseline,
                "saved": baseline - actual, "summaries": summaries, "unpriced_requests": 0}  # fmt: skip

    stats = {
        "requests": 3,
        "cost": {**cost(1.25, 3.5, 0.0123), "unpriced_requests": 2},
        "models": {
            "gpt-4.1": {"requests": 2, "tokens_in": 10, "cost": cost(1.25, 3.5, 0.0123)},
            "local": {"requests": 1, "tokens_in": 5, "cost": cost(0.0, 0.0)},
        },
    }
    text = render_stats(stats)
    assert (
        "  all models                 $1.25              $3.50      $2.25   64% of the baseline"
        in text
    )
    assert "  gpt-4.1                    $1.25              $3.50      $2.25" in text
    assert (
        "local " not in text.split("dollars")[1].split("of which")[0]
    )  # nothing spent, not listed
    assert "of which summary calls $0.0123; unpriced requests 2" in text
    assert (usd(0.00005), usd(-2.5), usd(1234.5)) == ("$0.0001", "-$2.50", "$1,234.50")
    assert "dollars" not in render_stats({"requests": 0})  # an old proxy without `cost`
