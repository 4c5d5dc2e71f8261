"""Window counters: O(1) memory per caller, Kong's counter API, and local counters synced
with Redis every `sync_rate` seconds.

    python examples/counters.py                                   # memory://
    REDIS_URL=redis://localhost:6379/0 python examples/counters.py   # adds the synced mode
"""

from __future__ import annotations

import asyncio
import os

from ratelimit import RateLimit, RateLimitExceeded


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    async with RateLimit.from_url(url, "counters-example", algorithm="sliding-window") as rl:

        @rl.limit("user:3/m", key="export")
        async def export(user: str) -> str:
            return f"{user}: exported"

        for _ in range(4):
            try:
                print(await export("vova"))
            except RateLimitExceeded as exc:
                print(f"vova: refused by {exc.rule}, retry in {exc.retry_after:.1f} s")

        # Kong's counter API on the same store: a job that failed gives its call back.
        print(f"uploads this minute: {await rl.increment('uploads', 60, 2.5):g}")
        print(f"after a refund: {await rl.increment('uploads', 60, -1):g}")
        print(f"as a fixed window: {await rl.sliding_window('uploads', 60, weight=0):g}")

    if not url.startswith("redis"):
        print("set REDIS_URL to see local counters synced with Redis (sync_rate)")
        return
    # Decide in-process, push and fetch counters once a second: no round trip per call.
    async with RateLimit.from_url(
        url, "counters-example", algorithm="sliding-window", sync_rate=1.0
    ) as rl:
        limit = rl.limit("100/m", key="search")
        allowed = sum([(await limit.decide()).allowed for _ in range(150)])
        print(f"synced mode: {allowed} of 150 admitted under 100/m, decided locally")
    # leaving the block made a last sync: Redis now holds the 100


if __name__ == "__main__":
    asyncio.run(main())
