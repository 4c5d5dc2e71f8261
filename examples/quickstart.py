"""Quickstart: a decorator, a rule tree, and what a refused call tells you.

    python examples/quickstart.py                                   # in-process memory://
    REDIS_URL=redis://localhost:6379/0 python examples/quickstart.py   # shared via Redis

With ``REDIS_URL`` set, every process running this shares the same counters: start two at
once and together they get five pings a second, not five each.
"""

from __future__ import annotations

import asyncio
import os

from ratelimit import RateLimit, RateLimitExceeded


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    async with RateLimit.from_url(url, namespace="quickstart") as rl:

        @rl.limit("5/s")
        async def ping() -> str:
            return "pong"

        for n in range(1, 8):
            try:
                print(f"ping {n}: {await ping()}")
            except RateLimitExceeded as exc:
                print(f"ping {n}: refused by {exc.rule}, retry in {exc.retry_after:.2f} s")

        async def api_key() -> str:  # an async callable: looked up on every call
            return "key-123"

        # Limited only once the key has 100 calls in the hour AND (3 in a second OR 10 in a
        # minute) has been reached: the 4th call here passes, the key has calls left.
        @rl.limit("apikey:100/h & (3/s | 10/m)", apikey=api_key, key="search")
        async def search(query: str) -> str:
            return f"results for {query!r}"

        for query in ("cats", "dogs", "owls", "bats"):
            print(await search(query))

        # decide(): the same decision as a value, no exception (it counts as a call if allowed)
        decision = await rl.limit(key="search").decide()
        print(f"allowed={decision.allowed} remaining={decision.remaining} rule={decision.rule}")


if __name__ == "__main__":
    asyncio.run(main())
