"""Penalties: a client refused too often is held back for a while, in every process.

    python examples/penalties.py                                     # in-process memory://
    REDIS_URL=redis://localhost:6379/0 python examples/penalties.py  # shared via Redis

A login allows ``ip:3/m``. A client that keeps going past it (five refusals within ten
minutes) is then refused outright for an hour, whatever the per-minute rule says, while
other clients go on as before. On Redis the hold is kept in the store, so every process
(every limiter on that Redis) refuses the client at once. The clock here is stepped by hand
(a test's clock), so the figures are exact.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from ratelimit import Limit, MemoryBackend, RateLimit, RedisScriptBackend


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
    namespace = f"penalties-{uuid.uuid4().hex[:8]}"  # a run of its own on a shared Redis
    async with RateLimit(backend, namespace) as rl, RateLimit(backend, namespace) as other:
        rules, penalty = "ip:3/m", "5 refusals/10m for 1h"

        def login(limiter: RateLimit, ip: str) -> Limit:
            return limiter.limit(rules, key="login", ip=ip, penalty=penalty)

        outcomes = []
        for _ in range(12):  # a guesser: one try every 10 s
            decision = await login(rl, "203.0.113.9").decide()
            if decision.allowed:
                outcomes.append("ok")
            elif decision.penalty is None:
                outcomes.append("refused")
            else:
                outcomes.append(f"held {decision.penalty:.0f} s")
            clock.now += 10
        print("guesser, one try every 10 s:", ", ".join(outcomes))
        seen = await login(other, "203.0.113.9").peek()  # another limiter: the store's hold
        print(f"another process sees the hold: retry after {seen.retry_after:.0f} s")
        print("a neighbour:", (await login(rl, "203.0.113.10").decide()).allowed)
        for hold in await rl.penalties.list():
            print(f"held: {hold.key} {hold.selector}={hold.value}, {hold.left:.0f} s left")
        await rl.penalties.lift("login", ip="203.0.113.9")  # other processes: within 1 s
        print("after lift:", (await login(rl, "203.0.113.9").decide()).allowed)
    if client is not None:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
