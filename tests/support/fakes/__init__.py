"""One fake upstream for the ASGI and end-to-end tiers, parametrised by API: `FakeUpstream`
serves chat completions, OpenAI Responses and Anthropic Messages (with `count_tokens`) with one
set of knobs and records; what differs between the APIs (prompt count, rules, overflow phrasing,
error envelope, JSON and event formats) is in one module per API (`chat`, `responses`,
`anthropic`), chosen by the request's path."""

from tests.support.fakes.upstream import FakeUpstream, Pacing, Recorded

__all__ = ["FakeUpstream", "Pacing", "Recorded"]
