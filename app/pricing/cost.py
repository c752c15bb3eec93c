"""Dollars for one request: what it cost, and what it would have cost uncompacted (pure).

`Billed` is a request's tokens in billing categories. `prompt` counts every prompt token, cache
reads and cache writes included (OpenAI's `prompt_tokens`; for Anthropic, `input_tokens` +
`cache_read_input_tokens` + `cache_creation_input_tokens`), so each prompt token falls in exactly
one category: read from the cache, written to it, or plain input.

The baseline (`baseline_billed`) is the same request without compaction: its prompt is the one
the upstream billed plus the tokens compaction removed, its answer is the same, and its cached
share is what an append-only conversation would have read from the provider's cache: the
previous uncompacted prompt of the conversation (`reusable`), under the provider's caching rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.pricing.table import BaselineRules, Caching, ModelPrice

PER_MILLION = 1_000_000


@dataclass(frozen=True, slots=True)
class Billed:
    """Tokens of one request by billing category (see the module docstring for `prompt`)."""

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
    """The uncompacted request's tokens: `removed` more prompt tokens than `actual`, the same
    completion, and cache hits on the `reusable` prefix (0 when there is no previous prompt).

    With explicit caching the baseline caches the way the client did: no `cache_control`
    activity in the actual request means none in the baseline; otherwise it reads the reusable
    prefix and writes the rest in the same proportion as the actual request wrote its new part.
    """
    prompt = max(actual.prompt, 0) + max(removed, 0)
    reusable = max(reusable, 0)
    if price.caching is Caching.AUTOMATIC:
        hit = automatic_hit(rules, prompt, reusable)
        return Billed(prompt=prompt, cached=hit, completion=actual.completion)
    if actual.read == 0 and actual.written == 0:
        return Billed(prompt=prompt, completion=actual.completion)
    hit = min(reusable, prompt)
    new_part = max(actual.prompt, 0) - actual.read
    share = actual.written / new_part if new_part > 0 else 1.0
    written = round((prompt - hit) * share)
    return Billed(prompt=prompt, cached=hit, cache_write=written, completion=actual.completion)
