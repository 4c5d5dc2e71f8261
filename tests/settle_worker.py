"""One OS process of the settle test: coroutines that each reserve a random cost, then
settle a random real cost, many times, on one shared limit.

Run as ``python -m tests.settle_worker URL NAMESPACE ENGINE ALGORITHM SEED [STORAGE]`` with
ENGINE ``script``, ``locked`` (the command engine) or ``postgres`` (STORAGE its URL; URL
still the Redis that coordinates the start). It says it is ready, waits for the go signal
(a BLPOP), runs, and prints the sum of the real costs it settled. Every call must be
admitted (the limit is far above what the test counts) and every settle recorded.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from typing import Any

import redis.asyncio as aioredis

from ratelimit import RateLimit

CALLS = 60
COROUTINES = 4
RULE = "job:90000/d"


def limiter(url: str, namespace: str, engine: str, algorithm: str, storage: str) -> RateLimit:
    if engine == "postgres":
        return RateLimit.from_url(storage, namespace, algorithm=algorithm, timeout=None)
    client: Any = aioredis.Redis.from_url(url, max_connections=COROUTINES)
    options: dict[str, Any] = (
        {"use_scripts": False, "lock_timeout": 60.0} if engine == "locked" else {}
    )
    return RateLimit(client, namespace, algorithm=algorithm, timeout=None, **options)


async def main(
    url: str, namespace: str, engine: str, algorithm: str, seed: int, storage: str
) -> int:
    rl = limiter(url, namespace, engine, algorithm, storage)
    limit = rl.limit(RULE, key="settled", job="shared")
    coordinator = aioredis.Redis.from_url(url)
    await coordinator.incr(f"{namespace}:ready")
    await coordinator.blpop([f"{namespace}:go"], timeout=60)
    rng = random.Random(seed * 1_000_003 + os.getpid())

    async def worker() -> int:
        settled = 0
        for _ in range(CALLS):
            decision = await limit.decide(cost=rng.randint(1, 40))
            assert decision.allowed, decision
            real = rng.randint(0, 80)
            assert await limit.settle(decision, real)
            settled += real
        return settled

    totals = await asyncio.gather(*(worker() for _ in range(COROUTINES)))
    await rl.aclose()
    await coordinator.aclose()
    return sum(totals)


if __name__ == "__main__":
    url, namespace, engine, algorithm, seed = sys.argv[1:6]
    storage = sys.argv[6] if len(sys.argv) > 6 else ""
    print(asyncio.run(main(url, namespace, engine, algorithm, int(seed), storage)))
