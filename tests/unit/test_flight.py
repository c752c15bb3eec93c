"""SingleFlight: one computation per key; its value, its error or its abandonment shared."""

from __future__ import annotations

import asyncio

from inflight.flight import SingleFlight


class Abandoned(Exception):
    pass


def test_callers_share_one_computation_and_its_value() -> None:
    async def scenario() -> None:
        flight: SingleFlight[str, int] = SingleFlight(Abandoned)
        calls = 0
        gate = asyncio.Event()

        async def compute() -> int:
            nonlocal calls
            calls += 1
            await gate.wait()
            return 42

        tasks = [asyncio.create_task(flight.run("k", compute)) for _ in range(5)]
        other = asyncio.create_task(flight.run("other", compute))
        await asyncio.sleep(0)
        assert "k" in flight
        gate.set()
        async with asyncio.timeout(5):
            assert await asyncio.gather(*tasks, other) == [42] * 6
        assert calls == 2
        assert "k" not in flight  # done: the next caller computes afresh

    asyncio.run(scenario())


def test_an_error_reaches_every_caller() -> None:
    async def scenario() -> None:
        flight: SingleFlight[str, int] = SingleFlight(Abandoned)
        gate = asyncio.Event()

        async def compute() -> int:
            await gate.wait()
            raise KeyError("boom")

        tasks = [asyncio.create_task(flight.run("k", compute)) for _ in range(3)]
        await asyncio.sleep(0)
        gate.set()
        async with asyncio.timeout(5):
            results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, KeyError) for r in results)

    asyncio.run(scenario())


def test_a_cancelled_first_caller_abandons_the_waiters_and_a_cancelled_waiter_does_not() -> None:
    async def scenario() -> None:
        flight: SingleFlight[str, int] = SingleFlight(Abandoned)
        gate = asyncio.Event()

        async def compute() -> int:
            await gate.wait()
            return 1

        first = asyncio.create_task(flight.run("k", compute))
        await asyncio.sleep(0)
        waiters = [asyncio.create_task(flight.run("k", compute)) for _ in range(2)]
        await asyncio.sleep(0)
        waiters[0].cancel()  # a waiter leaving does not end the computation
        await asyncio.sleep(0)
        assert not first.done()
        first.cancel()
        async with asyncio.timeout(5):
            results = await asyncio.gather(first, *waiters, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert isinstance(results[1], asyncio.CancelledError)
        assert isinstance(results[2], Abandoned)
        assert "k" not in flight

    asyncio.run(scenario())
