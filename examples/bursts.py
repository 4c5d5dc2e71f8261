"""GCRA: a steady rate with room for bursts, beside the sliding log's hard window.

    python examples/bursts.py                                     # in-process memory://
    REDIS_URL=redis://localhost:6379/0 python examples/bursts.py  # shared via Redis

``10/s`` under GCRA sustains ten calls a second: ten may come at once, then one every
100 ms. ``burst`` sets how many may come at once without changing the rate: ``10/s burst 1``
spaces calls 100 ms apart, ``10/s burst 30`` lets a quiet client save up thirty. The clock
here is stepped by hand (a test's clock), so the figures are exact.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from ratelimit import MemoryBackend, RateLimit, RedisScriptBackend


class Clock:
    """Seconds, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def main() -> None:
    url = os.environ.get("REDIS_URL")
    clock = Clock()
    client = None
    if url:
        import redis.asyncio as redis

        client = redis.Redis.from_url(url)
        backend: MemoryBackend | RedisScriptBackend = RedisScriptBackend(client, clock=clock)
    else:
        backend = MemoryBackend(clock=clock)
    namespace = f"bursts-{uuid.uuid4().hex[:8]}"  # a run of its own on a shared Redis
    async with RateLimit(backend, namespace, algorithm="gcra", denial_cache=0) as rl:
        for rules in ("10/s", "10/s burst 1", "10/s burst 30"):
            limit = rl.limit(rules, key=rules)
            at_once = 0
            while (await limit.decide()).allowed:  # as many as pass in one instant
                at_once += 1
            decision = await limit.decide()
            print(
                f"{rules}: {at_once} at once, then one every {decision.retry_after * 1000:.0f} ms"
            )
        clock.now += 60  # a quiet minute: the bucket is full again
        limit = rl.limit("10/s burst 30", key="10/s burst 30")
        admitted = 0
        for _ in range(600):  # 60 calls a second for 10 s
            admitted += (await limit.decide()).allowed
            clock.now += 1 / 60
        print(
            f"10/s burst 30: {admitted} of 600 calls in 10 s at 60/s (30 saved, then 10 a second)"
        )
    if client is not None:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
