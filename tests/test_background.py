"""Background counting: admitted at once, counted off the path, refusals fill the cache."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from ratelimit import BackendError, MemoryBackend, RateLimit
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from tests.conftest import FakeClock


async def test_calls_are_admitted_at_once_and_counted_later(clock: FakeClock) -> None:
    backend = MemoryBackend(clock=clock)
    rl = RateLimit(backend, "b", background=True)
    limit = rl.limit("3/m", key="k")
    assert all([(await limit.decide()).allowed for _ in range(10)])  # nothing counted yet
    assert rl.queued == 10
    await rl.flush()
    assert [len(hits) for hits in backend.logs().values()] == [3]  # refused hits add nothing
    refused = await limit.decide()  # the store's refusal reached the denial cache
    assert not refused.allowed
    assert rl.queued == 0  # answered in-process, nothing queued
    peeked = await limit.peek()  # peek decides synchronously
    assert not peeked.allowed
    await rl.aclose()


async def test_aclose_counts_what_is_queued(clock: FakeClock) -> None:
    backend = MemoryBackend(clock=clock)
    rl = RateLimit(backend, "b", background=True)
    for _ in range(2):
        await rl.limit("5/m", key="k").decide()
    await rl.aclose()
    assert [len(hits) for hits in backend.logs().values()] == []  # aclose cleared memory

    class Keeping(MemoryBackend):
        async def aclose(self) -> None:  # keeps what it counted, to be read after
            return None

    backend2 = Keeping(clock=clock)
    rl2 = RateLimit(backend2, "b", background=True)
    for _ in range(2):
        await rl2.limit("5/m", key="k").decide()
    assert [len(hits) for hits in backend2.logs().values()] == []  # queued, not counted
    await rl2.aclose()
    assert [len(hits) for hits in backend2.logs().values()] == [2]


async def test_a_failing_store_never_breaks_a_background_caller(clock: FakeClock) -> None:
    class Failing(MemoryBackend):
        async def decide(self, plan: Plan) -> Decision:
            raise BackendError("down")

    rl = RateLimit(Failing(clock=clock), "b", background=True)
    limit = rl.limit("1/m", key="k")
    for _ in range(5):
        assert (await limit.decide()).allowed
    await rl.flush()
    assert (await limit.decide()).allowed  # degraded refusals are never cached
    await rl.aclose()


@pytest.mark.redis
@pytest.mark.parametrize(("spacing", "most"), [(0.0, 200), (0.001, 20)])
async def test_the_overshoot_on_real_redis(
    redis_client: aioredis.Redis, namespace: str, spacing: float, most: int
) -> None:
    rl = RateLimit(redis_client, namespace, background=True)
    limit = rl.limit("10/m", key="burst")
    admitted = 0
    for _ in range(200):  # calls arriving every `spacing` seconds (0: back to back)
        admitted += (await limit.decide()).allowed
        await asyncio.sleep(spacing)  # the arrival rate under test, not a wait for a window
    await rl.flush()
    print(f"background counting, a call every {spacing * 1000:g} ms: {admitted} of 200 admitted")
    assert 10 <= admitted <= most
    assert await redis_client.llen(f"rl:{{{namespace}:burst}}") == 10  # Redis counted 10
    assert not (await limit.decide()).allowed
    await rl.aclose()
