"""What the compaction service hands the API service: the body and bytes to forward, the
`X-Compaction-*` report and the numbers for the usage record (`Compacted`), built from a
request's `Preview`; and what an upstream overflow that states no number teaches."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import orjson

from inflight.compaction.cost_mode import CutFor
from inflight.compaction.cuts import Cut, cuts_of
from inflight.compaction.offload import offload
from inflight.compaction.report import Deferred, Preview, facts_report, report_headers
from inflight.compaction.summary.prompt import SummaryUsage
from inflight.compaction.wire import Conversation, WireFormat
from inflight.errors import ContextLengthExceeded
from inflight.settings import OnOverflow
from inflight.strategies import StrategyName
from inflight.tokens.counter import TokenCounter
from inflight.windows.overflow import OverflowInfo

# The largest cut (tokens of the messages cut) whose references the ledger row gets: their
# fates take CPU time in proportion to the cut span and the forwarded prompt.
FACTS_TOKENS = 500_000


@dataclass(frozen=True, slots=True)
class Compacted:
    """What the API service forwards after compaction, and what it reports about it."""

    body: dict[str, Any]  # the body forwarded
    forward: bytes | None  # its bytes; None: the bytes as received
    view: Mapping[str, Any]  # the chat-shaped view of `body`, for calibrating on the usage
    headers: dict[str, str]  # the `X-Compaction-*` report (DESIGN.md §2)
    tokens_before: int
    tokens_after: int
    context_limit: int
    strategies: tuple[StrategyName, ...]
    summary_usage: SummaryUsage
    summary_model: str
    ledger_id: str | None = None  # `X-Compaction-Id`: the ledger row of what was cut (§11)
    cuts: tuple[Cut, ...] = ()  # what was cut, for that row
    # restoring: what the forwarded markers' refs stand for (app/compaction/restorable.py)
    refs: Mapping[str, str] = field(default_factory=dict)
    budget: int = 0  # the window less the output reserve (what restored texts may fill)
    # what starts once the answer is on its way (not after an error): summaries ahead
    after_answer: Deferred = field(default_factory=Deferred)
    client: str = ""  # who sent it (`inflight.credentials.client_identity`): whose window it taught
    economics: Mapping[str, object] | None = None  # the cut's costs and savings (§16)
    cut_for: CutFor | None = None  # why it was cut: to fit, or for cost only (§16)
    events: int = 0  # the compaction events of its plan (one more than the last request's: new)
    # works out the fates of the cut span's references for the ledger row (`facts_report`):
    # CPU-heavy on a large cut, so run off the event loop, never before the answer
    facts: Callable[[], Mapping[str, int]] | None = None


def view_body(conversation: Conversation) -> dict[str, Any]:
    """The request as the counter sees it: the fixed parts and the chat-shaped messages."""
    return {**conversation.fixed, "messages": list(conversation.messages)}


def compacted_of(wire: WireFormat, preview: Preview, on_overflow: OnOverflow) -> Compacted:
    """What to forward for `preview`, and what to report about it (a 400 when it is over the
    budget and `INFLIGHT_ON_OVERFLOW=reject`)."""
    result = preview.result
    if result.over_budget and on_overflow is OnOverflow.REJECT:
        raise ContextLengthExceeded(
            f"the conversation needs {result.tokens_after} tokens after compaction, more than "
            f"the {preview.window - preview.reserve}-token budget of this model's "
            f"{preview.window}-token window",
            param=wire.history,
        )
    # unchanged: the request's own list (never changed), whose JSON text is known already
    # (app/jsontext.py)
    shown = preview.conversation.messages if not result.applied else list(result.messages)
    view = {**preview.conversation.fixed, "messages": shown}
    return Compacted(
        body=preview.forwarded,
        forward=orjson.dumps(preview.forwarded) if preview.changed else None,
        view=view,
        headers=report_headers(preview),
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        context_limit=preview.window,
        strategies=result.applied,
        summary_usage=preview.summary_usage,
        summary_model=preview.summary_model,
        refs=result.refs,
        budget=preview.window - preview.reserve,
        after_answer=preview.after,
        economics=None if preview.economics is None else preview.economics.as_dict(),
        cut_for=result.plan.cut_for if result.applied else None,
        events=len(result.plan.events),
    )


def overflow_bound(
    wire: WireFormat, body: Mapping[str, Any], failed: Compacted
) -> OverflowInfo | None:
    """What an overflow that states no number teaches (the Responses API's "Your input exceeds
    the context window of this model"): the prompt that failed, as estimated, is more than the
    window holds — an upper bound, learned when it is below the window assumed (else the retry
    would be the same). Not for a request forwarded as received: what it sent is not all the
    upstream counted (server-side history)."""
    if failed.tokens_after <= 0 or wire.conversation(body).skip is not None:
        return None
    bound = failed.tokens_after
    return OverflowInfo(bound, None) if bound < failed.context_limit else None


async def ledgered(
    preview: Preview, compacted: Compacted, counter: TokenCounter, full: bool
) -> Compacted:
    """`compacted` with a ledger id and its cuts (their texts too when `full`), when something
    was cut (DESIGN.md §11). The id is random (unguessable); the cuts are a pure function of
    the request, worked out in a worker thread for a large one."""
    if not preview.result.applied:
        return compacted
    cuts = await offload(
        preview.conversation.messages, partial(_cuts, preview, counter, full), counter.texts
    )
    if not cuts:
        return compacted
    ledger_id = secrets.token_urlsafe(16)
    headers = {**compacted.headers, "X-Compaction-Id": ledger_id}
    # a cut too large to work out its references in bounded time keeps null facts
    facts = partial(facts_report, preview) if sum(c.tokens for c in cuts) <= FACTS_TOKENS else None
    return replace(compacted, headers=headers, ledger_id=ledger_id, cuts=cuts, facts=facts)


def _cuts(preview: Preview, counter: TokenCounter, full: bool) -> tuple[Cut, ...]:
    # the counts planning just made (the counter's prefix cache: no message counted again),
    # of the very list planning counted (its JSON text known: app/jsontext.py)
    tokens = counter.count_messages(preview.body["model"], preview.conversation.messages)
    return cuts_of(preview.conversation, preview.result, tokens, full)
