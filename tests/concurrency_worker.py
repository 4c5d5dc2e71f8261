"""One OS process of the concurrency test: many coroutines calling one limited function.

Run as ``python -m tests.concurrency_worker URL NAMESPACE COROUTINES``. It says it is ready,
waits for the go signal (a BLPOP), runs, and prints how many calls were admitted.
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from ratelimit import RateLimit, RateLimitExceeded


async def main(url: str, namespace: str, coroutines: int) -> int:
    client = aioredis.Redis.from_url(url, max_connections=coroutines)
    rl = RateLimit(client, namespace)

    @rl.limit("50/10s", key="shared")
    async def work() -> None:
        return None

    async def one() -> int:
        try:
            await work()
        except RateLimitExceeded:
            return 0
        return 1

    control = aioredis.Redis.from_url(url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    admitted = sum(await asyncio.gather(*(one() for _ in range(coroutines))))
    await control.aclose()
    await client.aclose()
    return admitted


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
