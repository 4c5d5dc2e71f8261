"""A rolling deploy of new rules: old processes limit each user to 3 searches an hour, new
ones add a cap for the whole endpoint. While both run, every user still gets 3 in all: a
user's counter is one, whatever rules a process holds, on a Redis Cluster too (each user's
counters in a slot of their own, the endpoint's in its key's; a call of the new rules spans
both and is decided by parts).

    python examples/rolling_rules.py                                    # memory://
    REDIS_URL=redis://localhost:6379/0 python examples/rolling_rules.py    # keys spread

On Redis the example spreads keys as a cluster client does (``spread=True``); point
``REDIS_URL`` at a cluster (``redis+cluster://host:port``) to see the parts land on nodes.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded

OLD = "user:3/h"
NEW = "user:3/h | 1000/h"


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    namespace = f"rolling-example-{uuid.uuid4().hex[:6]}"  # a fresh start on every run
    memory = MemoryBackend()  # on memory://, the one store both "processes" share

    def process() -> RateLimit:
        if url.startswith("memory"):
            return RateLimit(memory, namespace)
        return RateLimit.from_url(url, namespace, spread=True)

    # two processes of one application, one deployed before the change and one after
    async with process() as old, process() as new:

        @old.limit(OLD, key="search")
        async def search_old(user: str) -> str:
            return "old"

        @new.limit(NEW, key="search")
        async def search_new(user: str) -> str:
            return "new"

        for user in ("ann", "bob"):
            served = []
            for search in (search_old, search_new) * 3:  # a load balancer alternating
                try:
                    served.append(await search(user))
                except RateLimitExceeded:
                    served.append("429")
            print(f"{user}: {' '.join(served)}")
            assert served.count("429") == 3, served  # 3 in all, not 3 per deploy


if __name__ == "__main__":
    asyncio.run(main())
