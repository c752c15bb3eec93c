"""The fates of each ledger row's cut references (DESIGN.md §14), worked out once the answer has
started: in a worker thread, one row at a time, a bounded number waiting — never on the request
path. A row whose work was skipped (too many waiting) or failed keeps null facts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

logger = logging.getLogger(__name__)

Facts = Mapping[str, int]  # `facts_report`'s counts: references, retained, restorable, lost
# Rows whose references wait for the one being worked out; more are skipped. Each waiting row
# holds its request (the cut span's texts) in memory until its turn.
BACKLOG = 8


class FactsWork:
    """Runs each row's `facts_report` in a worker thread, one at a time, and hands its id and
    the counts to `done`."""

    def __init__(self, done: Callable[[str, Facts], None], backlog: int = BACKLOG) -> None:
        self._done = done
        self._backlog = backlog
        self._turn = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.skipped = 0  # rows whose references were not worked out (too many waiting)
        self.failed = 0

    def start(self, ledger_id: str, work: Callable[[], Facts]) -> None:
        """Work out `ledger_id`'s references when its turn comes (never waits)."""
        if len(self._tasks) > self._backlog:  # one running, `backlog` waiting
            self.skipped += 1
            if self.skipped == 1 or self.skipped % 1000 == 0:
                logger.warning("ledger references not worked out for %d rows", self.skipped)
            return
        task = asyncio.get_running_loop().create_task(
            self._run(ledger_id, work), name="inflight-ledger-facts"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, ledger_id: str, work: Callable[[], Facts]) -> None:
        async with self._turn:
            try:
                facts = await asyncio.to_thread(work)
            except Exception:
                self.failed += 1
                logger.exception("the references of a ledger row could not be worked out")
                return
        self._done(ledger_id, facts)

    async def idle(self) -> None:
        """Wait until every row started has its facts (or has failed)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel the work running or waiting (a thread already running finishes on its own)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
