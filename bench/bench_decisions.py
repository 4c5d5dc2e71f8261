"""Decisions per second: ``@rl.limit`` against ``limits``' async moving window, same Redis.

    python bench/bench_decisions.py [--calls 20000] [--users 1000]

Both sides keep a sliding log per user (a Redis list) and make one EVALSHA per decision,
with redis-py as the client. Each call is one decision for one of ``--users`` users under
``100/m``, so every decision is admitted and recorded (the costlier path). Runs at
concurrency 1 and 64, in one process, against one private redis-server (or ``REDIS_URL``),
and prints decisions per second and the ratio ours / limits. Needs the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio as aioredis
from limits import RateLimitItemPerMinute
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter

from ratelimit import RateLimit
from tests.redis_server import RedisServer

Decide = Callable[[str], Awaitable[bool]]


async def ours(url: str) -> tuple[Decide, Callable[[], Awaitable[None]]]:
    client = aioredis.Redis.from_url(url, max_connections=128)
    rl = RateLimit(client, f"bench-{uuid.uuid4().hex[:8]}")

    @rl.limit("user:100/m")
    async def work(user: str) -> bool:
        return True

    return work, client.aclose


async def peer(url: str) -> tuple[Decide, Callable[[], Awaitable[None]]]:
    storage = RedisStorage(
        url.replace("redis://", "async+redis://"),
        implementation="redispy",
        key_prefix=f"bench-{uuid.uuid4().hex[:8]}",
        max_connections=128,
    )
    limiter = MovingWindowRateLimiter(storage)
    item = RateLimitItemPerMinute(100)

    async def work(user: str) -> bool:
        allowed: bool = await limiter.hit(item, "work", user)
        return allowed

    async def close() -> None:
        await storage.reset()

    return work, close


async def measure(decide: Decide, calls: int, users: int, concurrency: int) -> float:
    names = [f"user-{i}" for i in range(users)]
    await asyncio.gather(*(decide(n) for n in names[: min(users, 64)]))  # warm up pools, scripts
    queue = iter(range(calls))

    async def runner() -> None:
        for i in queue:
            assert await decide(names[i % users])

    started = time.perf_counter()
    await asyncio.gather(*(runner() for _ in range(concurrency)))
    return calls / (time.perf_counter() - started)


async def main(url: str, calls: int, users: int) -> None:
    print(f"{calls} admitted decisions over {users} users, 100/m each, redis at {url}")
    print(f"{'concurrency':>11} {'ratelimit/s':>12} {'limits/s':>10} {'ratio':>6}")
    for concurrency in (1, 64):
        rates = []
        for factory in (ours, peer):
            decide, close = await factory(url)
            rates.append(await measure(decide, calls, users, concurrency))
            await close()
        print(f"{concurrency:>11} {rates[0]:>12.0f} {rates[1]:>10.0f} {rates[0] / rates[1]:>6.2f}")


def run(
    main: Callable[[str, int, int], Coroutine[Any, Any, None]],
    description: str,
    default_calls: int,
) -> None:
    """Parse ``--calls`` and ``--users``, then run ``main`` against ``REDIS_URL`` or a
    private redis-server started for this run."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--calls", type=int, default=default_calls)
    parser.add_argument("--users", type=int, default=1_000)
    options = parser.parse_args()
    with ExitStack() as stack:
        url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        asyncio.run(main(url, options.calls, options.users))


if __name__ == "__main__":
    run(main, __doc__.split("\n")[0], default_calls=20_000)
