"""Automatic pipelining: decisions made at the same moment share one round trip to Redis.

    REDIS_URL=redis://localhost:6379/0 python examples/pipelining.py

A web server admitting many requests at once asks Redis about each; with ``auto_pipeline``
(the default) the scripts of the decisions made in one event-loop turn go out together in
one pipeline, each still atomic and answered on its own. Here 2 000 decisions, 64 at a
time, for 100 users under ``user:10/m`` run with and without it: 1 000 are admitted either way
(10 per user), in less time with it. Without REDIS_URL the memory backend decides (there
is nothing to pipeline).
"""

from __future__ import annotations

import asyncio
import os
import time

from ratelimit import Decision, Limit, RateLimit


async def burst(url: str, auto_pipeline: bool = True) -> tuple[int, float]:
    """2 000 decisions at once: (how many were admitted, seconds taken)."""
    namespace = f"pipelining-{time.time_ns()}"
    # A burst of 2 000 on a busy machine may keep a decision waiting past the default
    # 0.25 s deadline, which the fail-open policy would answer (degraded): this example
    # counts admissions, so it gives each decision 10 s on Redis.
    if url == "memory://":
        rl = RateLimit.from_url(url, namespace)
    else:
        rl = RateLimit.from_url(url, namespace, auto_pipeline=auto_pipeline, timeout=10.0)
    async with rl:
        limits = [rl.limit("user:10/m", key="api", user=f"user-{n % 100}") for n in range(2000)]
        in_flight = asyncio.Semaphore(64)  # a server handling 64 requests at a time

        async def request(limit: Limit) -> Decision:
            async with in_flight:
                return await limit.decide()

        started = time.perf_counter()
        decisions = await asyncio.gather(*(request(limit) for limit in limits))
        assert not any(d.degraded for d in decisions), "Redis failed or missed the deadline"
        return sum(d.allowed for d in decisions), time.perf_counter() - started


async def main() -> None:
    url = os.environ.get("REDIS_URL")
    if not url:
        admitted, seconds = await burst("memory://")
        print(f"memory://: {admitted} of 2000 admitted in {seconds * 1000:.0f} ms")
        print("auto_pipeline applies to Redis: set REDIS_URL to compare")
        return
    for auto_pipeline in (True, False):
        admitted, seconds = await burst(url, auto_pipeline=auto_pipeline)
        print(
            f"auto_pipeline={auto_pipeline}: {admitted} of 2000 admitted in {seconds * 1000:.0f} ms"
        )


if __name__ == "__main__":
    asyncio.run(main())
