"""One OS process of the Postgres concurrency test: many coroutines on one limit.

``python -m tests.postgres_worker POSTGRES_URL REDIS_URL NAMESPACE COROUTINES``: says it is
ready on Redis (which only coordinates the start), waits for the go (a BLPOP), runs, and
prints how many calls were admitted under ``50/h`` (sliding window) on Postgres.
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from ratelimit import RateLimit, RateLimitExceeded


async def main(postgres_url: str, redis_url: str, namespace: str, coroutines: int) -> int:
    # No deadline: this counts admissions under contention (fail-open would admit)
    rl = RateLimit.from_url(
        postgres_url, namespace, algorithm="sliding-window", timeout=None, max_size=coroutines
    )

    @rl.limit("50/h", key="shared")
    async def work() -> None:
        return None

    async def one() -> int:
        try:
            await work()
        except RateLimitExceeded:
            return 0
        return 1

    await rl.limit("1000/h", key="warm-up").decide()  # the pool and the schema, before the go
    control = aioredis.Redis.from_url(redis_url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    admitted = sum(await asyncio.gather(*(one() for _ in range(coroutines))))
    await control.aclose()
    await rl.aclose()
    return admitted


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
