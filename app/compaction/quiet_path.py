"""The quiet path: a forwarded request under the trigger as a whole goes as received, decided from
its token count alone, and the plan it would have made is made once its answer is on its way, for
the replay cache its conversation's next requests resume.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import partial

from inflight.compaction.engine import untouched
from inflight.compaction.job import Job, Outcome
from inflight.compaction.policy import Budget
from inflight.compaction.replays import Replays
from inflight.compaction.summary.request import RequestSummaries


def quiet_outcome(job: Job, budget: Budget, summarizing: RequestSummaries | None) -> Outcome | None:
    """`job`'s request as received, when it is under the trigger as a whole; None when it is
    over, or when summaries would start ahead of its next event
    (`RequestSummaries.keeps_still`).

    Its replay would cross the trigger nowhere (every unit costs >= 0, so no prefix costs more than
    the whole), so its plan is to keep everything: the argument of `planner._quiet`. What it
    forwards, reports and leaves in the cache is what planning gives
    (tests/asgi/test_quiet_path.py).
    """
    tokens = job.count_fixed() + sum(job.counts())
    if tokens > budget.calm:
        return None
    if summarizing is not None and not summarizing.keeps_still(
        job.conversation.messages, job.summary_model, tokens, budget, job.wait
    ):
        return None
    return Outcome(untouched(job.conversation.messages, tokens, budget), job.body)


def planned_later(
    replays: Replays, heavy: Callable[[], bool], planning: Callable[[], object]
) -> Callable[[], None]:
    """What makes the plan a quiet request would have made (`planning`), for the replay
    cache, once its answer is on its way; `heavy`: whether that plan is no longer small."""
    return partial(_replayed, replays, replays.counting(), heavy, planning)


def _replayed(
    replays: Replays,
    counting: Hashable,
    heavy: Callable[[], bool],
    planning: Callable[[], object],
) -> None:
    """Make the plan, on the event loop. Nothing when the counter's state moved since the
    request was counted (its counts are the request's), or when the plan is no longer a small
    one (`heavy`: the replay it resumes was dropped from the cache meanwhile) and would hold
    up the loop: the next request then plans from further back, where planning runs."""
    if replays.counting() != counting or heavy():
        return
    planning()
