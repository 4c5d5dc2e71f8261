"""``async with`` blocks, and ``decide()`` for a decision without an exception.

python examples/context_manager.py    # memory://, or Redis with REDIS_URL set
"""

from __future__ import annotations

import asyncio
import math
import os

from ratelimit import RateLimit, RateLimitExceeded


async def login(rl: RateLimit, username: str) -> str:
    try:
        # key= gives this block counters of its own; without it, every block shares "".
        async with rl.limit("username:3/5m", username=username, key="login") as decision:
            return f"{username} logged in (attempts left: {decision.remaining})"
    except RateLimitExceeded as exc:
        return f"{username} must wait {exc.retry_after:.0f} s"


async def main() -> None:
    async with RateLimit.from_url(os.environ.get("REDIS_URL", "memory://"), "cm") as rl:
        for _ in range(4):
            print(await login(rl, "vova"))
        print(await login(rl, "dima"))

        # decide() returns the Decision and never raises for a denial: handy for a 429.
        limit = rl.limit("ip:2/s", ip="198.51.100.1", key="http")
        for _ in range(3):
            decision = await limit.decide()
            if decision.allowed:
                print("200 OK")
            else:
                # Retry-After is whole seconds, rounded up: never ask to come back too early
                print(f"429 Too Many Requests, Retry-After: {math.ceil(decision.retry_after)}")


if __name__ == "__main__":
    asyncio.run(main())
