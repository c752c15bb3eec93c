"""Dollars for one request: what it cost, and what it would have cost uncompacted (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from inflight.pricing.table import BaselineRules, Caching, ModelPrice

PER_MILLION = 1_000_000


@dataclass(frozen=True, slots=True)
class Billed:
    """Tokens of one request by billing category.

    `prompt` counts every prompt token, cache reads and cache writes included (OpenAI's
    `prompt_tokens`; for Anthropic, `input_tokens` + `cache_read_input_tokens` +
    `cache_creation_input_tokens`), so each prompt token falls in exactly one category: read from
    the cache, written to it, or plain input.
    """

    prompt: int = 0
    cached: int = 0
    cache_write: int = 0
    completion: int = 0

    @property
    def read(self) -> int:
        return min(max(self.cached, 0), max(self.prompt, 0))

    @property
    def written(self) -> int:
        return min(max(self.cache_write, 0), max(self.prompt, 0) - self.read)

    @property
    def fresh(self) -> int:
        return max(self.prompt, 0) - self.read - self.written


def dollars(price: ModelPrice, billed: Billed) -> float:
    """USD for `billed` at `price` (cache reads at the cached price, writes at the write price)."""
    total = (
        billed.fresh * price.input
        + billed.read * price.cache_read_rate
        + billed.written * price.cache_write_rate
        + max(billed.completion, 0) * price.output
    )
    return total / PER_MILLION


def automatic_hit(rules: BaselineRules, prompt: int, reusable: int) -> int:
    """OpenAI's rule: a prefix of at least `automatic_min_tokens` is read from the cache, in
    whole `automatic_increment` steps."""
    prefix = min(reusable, prompt)
    if prefix < rules.automatic_min_tokens:
        return 0
    return prefix - prefix % rules.automatic_increment


def baseline_billed(
    price: ModelPrice, rules: BaselineRules, actual: Billed, removed: int, reusable: int
) -> Billed:
    """One uncompacted round of the request `actual` (one round's tokens) from which
    compaction removed `removed` prompt tokens; `reusable`: the tokens of the conversation's
    previous uncompacted prompt when it prefixes this one (else 0).

    When compaction removed nothing it is the request as billed. Otherwise its prompt is the one the
    upstream billed plus the tokens compaction removed, its answer is the same, and its cache reads
    are the previous uncompacted prompt of the conversation (`reusable`, remembered by
    `PromptHistory`); without one (a restart, a first sight), what the actual request read plus the
    removed tokens when it read anything (the conversation's cache was warm, and the removed part is
    older history than what follows the cut: cached wherever what precedes it was), else nothing.
    The rest of its prompt is plain input, or with explicit caching written in the proportion the
    actual request wrote its uncached part. Restore's extra rounds are never in it.
    """
    removed = max(removed, 0)
    if removed == 0:
        return actual
    prompt = max(actual.prompt, 0) + removed
    warm = actual.read + removed if actual.read > 0 else 0
    known = min(reusable if reusable > 0 else warm, prompt)
    if price.caching is Caching.AUTOMATIC:
        hit = automatic_hit(rules, prompt, known)
        return Billed(prompt=prompt, cached=hit, completion=actual.completion)
    if actual.read == 0 and actual.written == 0:  # the client used no cache
        return Billed(prompt=prompt, completion=actual.completion)
    new_part = max(actual.prompt, 0) - actual.read
    share = actual.written / new_part if new_part > 0 else 1.0
    written = round((prompt - known) * share)
    return Billed(prompt=prompt, cached=known, cache_write=written, completion=actual.completion)
