"""The application's connection pool: a small or busy one is back-pressure, never an outage.

The limiter borrows connections from the client it is given, so it shares the pool's limit
with the application. Waiting for one of its own connections to come back is not a Redis
failure: it must not fail open, and it must give every connection back.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from ratelimit import Decision, RateLimit

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("redis_path")]


async def burst(rl: RateLimit, calls: int) -> list[Decision | BaseException]:
    limit = rl.limit("50/h", key="pool")
    return await asyncio.gather(*(limit.decide() for _ in range(calls)), return_exceptions=True)


def tally(outcomes: list[Decision | BaseException]) -> tuple[int, int, int]:
    """(admitted, degraded, errors)."""
    decisions = [o for o in outcomes if isinstance(o, Decision)]
    return (
        sum(d.allowed and not d.degraded for d in decisions),
        sum(d.degraded for d in decisions),
        len(outcomes) - len(decisions),
    )


@pytest.mark.parametrize("auto_pipeline", [True, False], ids=["pipelined", "alone"])
@pytest.mark.parametrize("max_connections", [1, 2, 3])
async def test_a_small_pool_admits_exactly_the_limit(
    redis_url: str, namespace: str, max_connections: int, auto_pipeline: bool
) -> None:
    client = aioredis.Redis.from_url(redis_url, max_connections=max_connections)
    rl = RateLimit(client, namespace, auto_pipeline=auto_pipeline, timeout=5)
    assert tally(await burst(rl, 500)) == (50, 0, 0)  # was 500 / 421 / 293 admitted, degraded
    await rl.aclose()
    await client.aclose()


async def test_a_blocking_pool_admits_exactly_the_limit(redis_url: str, namespace: str) -> None:
    pool = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=2, timeout=1)
    client = aioredis.Redis(connection_pool=pool)
    rl = RateLimit(client, namespace, on_error="raise", timeout=5)
    assert tally(await burst(rl, 500)) == (50, 0, 0)  # was 256 BackendErrors
    await rl.aclose()
    await client.aclose()
    await pool.disconnect()  # a pool given to the client is not closed by it


async def test_the_command_engine_on_a_small_pool_admits_exactly_the_limit(
    redis_url: str, namespace: str
) -> None:
    client = aioredis.Redis.from_url(redis_url, max_connections=10)
    rl = RateLimit(
        client, namespace, use_scripts=False, timeout=5, lock_timeout=60, lock_polling_interval=0.01
    )
    assert tally(await burst(rl, 200)) == (50, 0, 0)  # was 200 admitted, degraded
    await rl.aclose()
    await client.aclose()


@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
async def test_the_limiter_gives_every_connection_back(
    redis_url: str, namespace: str, use_scripts: bool
) -> None:
    client = aioredis.Redis.from_url(redis_url, max_connections=4)
    rl = RateLimit(client, namespace, use_scripts=use_scripts, timeout=5, lock_timeout=60)
    assert tally(await burst(rl, 300))[0] == 50
    pool = client.connection_pool
    # every connection is back: the application can have its whole pool at once (was:
    # MaxConnectionsError)
    holders = [await pool.get_connection() for _ in range(4)]  # type: ignore[no-untyped-call]
    for connection in holders:
        await pool.release(connection)
    await asyncio.gather(*(client.get("app") for _ in range(4)))
    await rl.aclose()
    await client.aclose()
