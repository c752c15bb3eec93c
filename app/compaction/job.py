"""One request being compacted (`Job`): its adapter, body, view, models and where it goes, how
its messages are counted, how it is planned (`Planning`), and what its pipeline came to
(`Outcome`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inflight.compaction.engine import CompactionResult, compact, marker_tokens
from inflight.compaction.pins import Pin, pin_tokens
from inflight.compaction.planner import plan
from inflight.compaction.policy import Budget
from inflight.compaction.rendering import Plan
from inflight.compaction.replays import Replays
from inflight.compaction.summary.prompt import SummaryUsage
from inflight.compaction.summary.request import Asked, StandIn
from inflight.compaction.summary.rolling import summary_budget
from inflight.compaction.unit_costs import MessageCounter
from inflight.compaction.wire import Conversation, WireFormat
from inflight.errors import ProxyError
from inflight.strategies import StrategyName
from inflight.tokens.counter import Counted, TokenCounter, count_within, counts_within

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Job:
    """One request being compacted: its adapter, body, view, models and where it goes."""

    wire: WireFormat
    body: dict[str, Any]  # without control keys
    conversation: Conversation
    model: str
    summary_model: str
    base_url: str
    headers: Mapping[str, str]
    counter: TokenCounter
    protect: frozenset[str] = frozenset()  # tools whose outputs only the last unit may cut
    restore: bool = False  # a marker stands for every cut; markers' refs resolved (§11)
    pins: tuple[Pin, ...] = ()  # what they match in a cut stands beside its stand-in (§14)
    counted: Counted = field(default_factory=Counted)  # see count_within
    wait: bool = False  # a compaction event waits for its summary (§12)
    forwarded: bool = False  # not a preview: see `Asked.forwarded`
    later: list[Callable[[], object]] = field(default_factory=list)  # see `Asked.later`
    after: list[Callable[[], object]] = field(default_factory=list)  # see `Asked.after`

    @property
    def marked(self) -> bool:
        """Whether something stands for every cut even without a summary (restore, pins)."""
        return self.restore or bool(self.pins)

    def count(self, message: Mapping[str, Any]) -> int:
        messages = self.conversation.messages
        return count_within(self.counter, self.model, messages, self.counted, message)

    def counts(self) -> Sequence[int]:
        """Each message's tokens, counted once: the counts `count` reads."""
        messages = self.conversation.messages
        return counts_within(self.counter, self.model, messages, self.counted)

    def asked(self) -> Asked:
        """What this request's summary is asked with."""
        return Asked(
            self.conversation.messages,
            self.model,
            self.summary_model,
            self.base_url,
            self.headers,
            self.wire.api,
            self.count,
            self.wait,
            self.forwarded,
            self.later,
            self.after,
        )

    def count_fixed(self) -> int:
        """The tokens of what every prompt carries whatever is cut (tools, instructions),
        counted once."""
        if self.counted.fixed is None:
            self.counted.fixed = self.counter.count_fixed(self.model, self.conversation.fixed)
        return self.counted.fixed

    def rendered(
        self,
        result: CompactionResult,
        usage: SummaryUsage | None = None,
        stand: StandIn | None = None,
    ) -> Outcome:
        """The outcome of `result`: the body rendered back by the adapter when it changed;
        `stand`: what stood for its cut span, when its event needed a summary."""
        forwarded = (
            self.wire.render(self.body, self.conversation, result.messages, result.sources)
            if result.applied
            else self.body
        )
        return Outcome(result, forwarded, usage or SummaryUsage(), stand)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: CompactionResult
    forwarded: dict[str, Any]
    usage: SummaryUsage = field(default_factory=SummaryUsage)
    stand: StandIn | None = None  # what stood for the cut span, when the event needed a summary


@dataclass(frozen=True, slots=True)
class Planning:
    """How one request is planned: its pipeline and budget, the replay cache its plans resume
    (None: every plan from the first message), and, when it is summarised, the tokens
    reserved for what stands for a cut span (the summary, and restore's marker with it)."""

    job: Job
    pipeline: tuple[StrategyName, ...]
    budget: Budget
    replays: Replays | None
    summarized: bool = False
    stand_in: int = 0

    @classmethod
    def of(
        cls,
        job: Job,
        pipeline: tuple[StrategyName, ...],
        budget: Budget,
        replays: Replays | None,
        summarized: bool,
    ) -> Planning:
        reserved = summary_budget(budget.goal) if summarized else 0
        # restoring, the summary ends with the span marker: its tokens are reserved too
        marker = marker_tokens(job.count) if summarized and job.restore else 0
        pinned = pin_tokens(budget.goal) if summarized and job.pins else 0
        return cls(job, pipeline, budget, replays, summarized, reserved + marker + pinned)

    def plan(
        self,
        history: Sequence[Mapping[str, Any]],
        count: MessageCounter,
        fixed: int,
        memory: Replays | None,
    ) -> Plan:
        """This request's plan inputs, for its history or a predicted one."""
        job = self.job
        return plan(
            history, self.pipeline, self.budget, count, fixed, self.stand_in,
            protect=job.protect, marked=job.marked, replays=memory,
        )  # fmt: skip

    def compact(self, fixed: int, **given: Any) -> CompactionResult:
        """`compact` of the request's messages with these inputs (`given`: the summary, the
        plan already made)."""
        job = self.job
        return compact(
            job.conversation.messages, self.pipeline, self.budget, job.count, fixed,
            protect=job.protect, restore=job.restore, pins=job.pins, replays=self.replays,
            **given,
        )  # fmt: skip

    def remembered(self) -> object:
        """Plan the request as its planning does, for what the replay cache remembers of it."""
        fixed = self.job.count_fixed()
        if self.summarized:
            return self.plan(self.job.conversation.messages, self.job.count, fixed, self.replays)
        return self.compact(fixed)


def view_of(wire: WireFormat, body: dict[str, Any]) -> Conversation:
    """The adapter's view of `body`. A request it refuses is a 400 (`BadRequest`); one it fails
    on (a bug, not the client's fault) is forwarded as received, never a 500."""
    try:
        return wire.conversation(body)
    except ProxyError:
        raise
    except Exception as exc:
        logger.exception("the %s adapter failed on a request; forwarding it as received", wire.api)
        return Conversation(messages=(), fixed=body, skip=f"{type(exc).__name__} in the adapter")
