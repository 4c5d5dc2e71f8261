"""Settling on the stores that need a server: several OS processes settling on one limit
end with the store holding exactly the sum of what they settled (real Redis, both engines;
PostgreSQL), Postgres settles as memory does, and ``sync_rate``'s local counters settle and
sync."""

from __future__ import annotations

import random
import uuid
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from ratelimit import MemoryBackend, RateLimit
from ratelimit.backends.naming import identifier_key
from ratelimit.backends.postgres import PostgresBackend
from ratelimit.backends.redis.keys import counter_key
from ratelimit.core.plan import Identifier
from tests.conftest import FakeClock
from tests.test_postgres import synced_store
from tests.workers import run_workers


def settled_identifier(namespace: str) -> Identifier:
    return Identifier(namespace, "settled", "job", "shared")


async def redis_total(client: aioredis.Redis, namespace: str, algorithm: str) -> float:
    identifier = settled_identifier(namespace)
    if algorithm == "sliding-log":
        return float(await client.llen(identifier_key(identifier)))
    held = await client.hgetall(counter_key(identifier))
    return sum(float(v) for k, v in held.items() if not _text(k).endswith("w"))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("engine", "algorithm"),
    [("script", "sliding-log"), ("script", "sliding-window"), ("locked", "fixed-window")],
)
async def test_four_processes_settling_leave_exactly_what_they_settled_on_redis(
    redis_url: str, engine: str, algorithm: str
) -> None:
    namespace = f"settle-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(redis_url)
    try:
        outputs = await run_workers(
            client, namespace, "tests.settle_worker", redis_url, namespace, engine, algorithm, "1"
        )
        settled = sum(int(out) for out in outputs)
        assert settled > 0
        assert await redis_total(client, namespace, algorithm) == settled
    finally:
        await client.aclose()


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.timeout(200)
async def test_four_processes_settling_leave_exactly_what_they_settled_on_postgres(
    redis_url: str, postgres_url: str
) -> None:
    namespace = f"settle-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(redis_url)
    try:
        outputs = await run_workers(
            client, namespace, "tests.settle_worker", redis_url, namespace, "postgres",
            "sliding-window", "2", postgres_url,
        )  # fmt: skip
    finally:
        await client.aclose()
    settled = sum(int(out) for out in outputs)
    connection = await asyncpg.connect(postgres_url)
    try:
        total = await connection.fetchval(
            "SELECT sum(count) FROM ratelimit_counters WHERE key = $1",
            identifier_key(settled_identifier(namespace)),
        )
    finally:
        await connection.close()
    assert settled > 0
    assert total == settled


@pytest.mark.postgres
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["sliding-window", "fixed-window"])
async def test_postgres_settles_as_memory_does(postgres_url: str, algorithm: str) -> None:
    namespace = f"pg-settle-{uuid.uuid4().hex[:8]}"
    clocks = [FakeClock(), FakeClock()]
    limiters = [
        RateLimit(MemoryBackend(clock=clocks[0]), namespace, algorithm=algorithm),
        RateLimit(
            PostgresBackend(postgres_url, clock=clocks[1], timeout=10),
            namespace,
            algorithm=algorithm,
        ),
    ]
    rng = random.Random(7)
    pending: list[list[Any]] = []
    allowed = 0
    try:
        for step in range(150):
            advance = rng.choice([0.0, 0.0, 0.01, 0.3, 2.0, 7.0])
            for clock in clocks:
                clock.advance(advance)
            if pending and rng.random() < 0.6:
                decisions = pending.pop(rng.randrange(len(pending)))
                real = rng.choice([0, 0.5, 1, 2.5, 4, 9])
                for rl, decision in zip(limiters, decisions, strict=True):
                    assert await rl.settle(decision, {"tokens": real})
            user = rng.choice(["a", "b", None])
            cost = {"tokens": rng.choice([0.5, 1, 2, 3])}
            decisions = [
                await rl.limit("u:4/10s | u:8 tokens/10s & 12 tokens/m", key="k", u=user).decide(
                    cost=cost
                )
                for rl in limiters
            ]
            assert decisions[1] == decisions[0], f"step {step}"
            assert decisions[1].states == decisions[0].states, f"states at step {step}"
            if decisions[0].allowed:
                allowed += 1
                pending.append(decisions)
    finally:
        await limiters[1].aclose()
    assert 0 < allowed < 150


@pytest.mark.redis
async def test_sync_rate_settles_on_local_counters_and_syncs_them(redis_url: str) -> None:
    namespace = f"sync-settle-{uuid.uuid4().hex[:8]}"
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
    one, two = (
        RateLimit(client, namespace, algorithm="fixed-window", sync_rate=60) for client in clients
    )
    try:
        limit = one.limit("100 tokens/d", key="llm")
        decision = await limit.decide(cost={"tokens": 90})
        assert await limit.settle(decision, {"tokens": 30})  # 60 back, locally at once
        assert (await limit.peek(cost={"tokens": 70})).allowed
        excess = await limit.decide(cost={"tokens": 10})
        assert await limit.settle(excess, {"tokens": 65})  # 30 + 65 = 95 counted
        assert not (await limit.peek(cost={"tokens": 6})).allowed
        await synced_store(one).sync()
        other = two.limit("100 tokens/d", key="llm")
        assert (await other.peek(cost={"tokens": 100})).allowed  # nothing synced here yet
        await synced_store(two).sync()  # fetches the totals of the counters it decided on
        assert (await other.peek(cost={"tokens": 5})).allowed
        assert not (await other.peek(cost={"tokens": 6})).allowed
    finally:
        await one.aclose()
        await two.aclose()
        for client in clients:
            await client.aclose()
