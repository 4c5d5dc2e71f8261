"""Waiting for admission: ``wait=`` on a limit, ``acquire()``, and ``async with``.

The waits run in an event loop whose clock is its own (``run_virtual``): the limiter's
clock is the loop's, sleeps take no real time, and what each waiter sees is exact.
"""

from __future__ import annotations

import asyncio

import pytest

from ratelimit import ConfigurationError, MemoryBackend, RateLimit, RateLimitExceeded
from tests.conftest import run_virtual


def test_waiters_all_pass_and_never_exceed_the_rule() -> None:
    async def main() -> tuple[float, list[float]]:
        clock = asyncio.get_running_loop().time
        rl = RateLimit(MemoryBackend(clock=clock), "w")
        admitted_at: list[float] = []

        @rl.limit("5/s", key="queue", wait=True)
        async def work() -> None:
            admitted_at.append(clock())

        started = clock()
        await asyncio.gather(*(work() for _ in range(12)))
        return clock() - started, sorted(admitted_at)

    took, admitted_at = run_virtual(main)
    assert len(admitted_at) == 12
    # 5 at once, 5 a second later, 2 a second after that: 2 s, plus up to 10% jitter a wait
    assert 2.0 <= took <= 2.2 + 1e-6
    for first, sixth in zip(admitted_at, admitted_at[5:], strict=False):
        assert sixth - first >= 1.0 - 1e-6  # never six within one second


def test_a_refusal_longer_than_the_wait_raises_at_once() -> None:
    async def main() -> tuple[float, float]:
        clock = asyncio.get_running_loop().time
        rl = RateLimit(MemoryBackend(clock=clock), "w")
        limit = rl.limit("1/10s", key="k", wait=0.5)
        await limit.acquire()
        started = clock()
        with pytest.raises(RateLimitExceeded) as caught:
            await limit.acquire()
        return clock() - started, caught.value.retry_after

    waited, retry_after = run_virtual(main)
    assert waited == 0  # no point sleeping 0.5 s for a 10 s refusal
    assert retry_after == pytest.approx(10)


def test_a_waiter_is_admitted_when_the_window_frees() -> None:
    async def main() -> float:
        clock = asyncio.get_running_loop().time
        rl = RateLimit(MemoryBackend(clock=clock), "w")
        limit = rl.limit("1/300ms", key="k")
        await limit.acquire()
        started = clock()
        async with rl.limit("1/300ms", key="k", wait=1.0) as decision:
            assert decision.allowed
        waited = clock() - started
        with pytest.raises(RateLimitExceeded):  # without wait: refused at once
            await limit.acquire()
        return waited

    assert 0.3 <= run_virtual(main) <= 0.33 + 1e-6  # the window, plus up to 10% jitter


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    backend = MemoryBackend()
    rl = RateLimit(backend, "w")
    limit = rl.limit("2/10s", key="k", wait=True)
    await limit.acquire()
    await limit.acquire()
    waiter = asyncio.ensure_future(limit.acquire())
    for _ in range(10):  # yield to the loop: the waiter is refused and starts its pause
        await asyncio.sleep(0)
    assert not waiter.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    remaining = list(backend.logs().values())
    assert [len(hits) for hits in remaining] == [2]  # only the two admitted calls counted


@pytest.mark.parametrize("wait", [-1, float("nan"), "5"])
def test_bad_waits_are_refused(wait: object) -> None:
    with pytest.raises(ConfigurationError, match="wait must be seconds"):
        RateLimit(MemoryBackend()).limit("1/s", wait=wait)  # type: ignore[call-overload]


async def test_a_refused_waiter_is_not_decided_twice_in_a_row() -> None:
    asked = 0

    class Counting(MemoryBackend):
        async def decide(self, plan):  # type: ignore[no-untyped-def]
            nonlocal asked
            asked += 1
            return await super().decide(plan)

    rl = RateLimit(Counting(), "w", denial_cache=0)

    @rl.limit("1/10s", key="once", wait=0.5)
    async def work() -> None: ...

    await work()
    with pytest.raises(RateLimitExceeded):
        await work()  # refused for 10 s, more than its wait: raises without asking again
    assert asked == 2
