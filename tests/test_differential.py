"""Every engine gives the same decision on the same sequence of calls (DESIGN §4).

A seeded random trace of calls (rules trees with selectors, values, time steps of a few
milliseconds up to seconds) is run against each backend with one fake clock; every
``Decision`` must be equal, retry_after to the microsecond.
"""

from __future__ import annotations

import random
import uuid

import fakeredis
import pytest
import redis.asyncio as aioredis

from ratelimit import MemoryBackend, RateLimit, RedisScriptBackend
from ratelimit.backends.base import Backend
from ratelimit.decision import Decision
from tests.conftest import FakeClock

TREES = [
    "3/s",
    "2/100ms | 5/s",
    "user:3/s & 2/s",
    "apikey:4/2s & (3/s | 5/10s)",
    "(user:2/s | ip:3/s) & (5/s | user:4/3s)",
    "user:1/s | ip:2/500ms | 6/5s",
]
USERS = ["alice", "bob", None, ""]
IPS = ["10.0.0.1", "10.0.0.2"]


async def run_trace(backend: Backend, clock: FakeClock, seed: int) -> list[Decision]:
    rng = random.Random(seed)
    rl = RateLimit(backend, f"diff-{uuid.uuid4().hex[:8]}")
    decisions = []
    for _ in range(250):
        clock.advance(rng.choice([0.0, 0.001, 0.013, 0.1, 0.25, 0.7, 1.5]))
        index = rng.randrange(len(TREES))
        limit = rl.limit(
            TREES[index],
            key=f"tree{index}",
            user=rng.choice(USERS),
            ip=rng.choice(IPS),
            apikey="k1",
        )
        decisions.append(await limit.decide())
    return decisions


async def compare(backends: dict[str, tuple[Backend, FakeClock]], seed: int) -> None:
    traces = {name: await run_trace(b, c, seed) for name, (b, c) in backends.items()}
    reference_name, reference = next(iter(traces.items()))
    assert sum(d.allowed for d in reference) not in (0, len(reference))  # a trace that decides
    for name, trace in traces.items():
        for step, (want, got) in enumerate(zip(reference, trace, strict=True)):
            assert got == want, f"{name} differs from {reference_name} at step {step}"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("server", ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
async def test_memory_and_script_engine_decide_alike(
    seed: int, server: str, request: pytest.FixtureRequest
) -> None:
    client: aioredis.Redis = (
        fakeredis.FakeAsyncRedis()
        if server == "fakeredis"
        else aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    )
    memory_clock, script_clock = FakeClock(), FakeClock()
    try:
        await compare(
            {
                "memory": (MemoryBackend(clock=memory_clock), memory_clock),
                server: (RedisScriptBackend(client, clock=script_clock), script_clock),
            },
            seed,
        )
    finally:
        await client.aclose()
