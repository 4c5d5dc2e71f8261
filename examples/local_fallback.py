"""``on_error="local"``: while the store is down, each process decides on its own share.

    python examples/local_fallback.py                                     # memory://
    REDIS_URL=redis://localhost:6379/0 python examples/local_fallback.py  # a real Redis

Four "processes" (four limiters here, each as one process would have it) share
``user:100/h`` through one store, each with ``local_share=0.25``. The store is unplugged
(a wrapper that fails on demand stands for a Redis being restarted): each limiter goes on
deciding on its quarter of the limit, so together they admit 100, not everything
(``on_error="allow"``) and not nothing (``"deny"``). Plugged back, the next decisions go to
the store again, which counts from what it had.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from ratelimit import RateLimit
from ratelimit.backends import Backend
from ratelimit.decision import Decision
from ratelimit.errors import BackendError
from ratelimit.plan import CounterUpdate, Plan

PROCESSES = 4


class Unplugged:
    """The store opened from the URL, failing (``BackendError``) while ``down``."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.down = False

    async def decide(self, plan: Plan) -> Decision:
        if self.down:
            raise BackendError("connection refused (unplugged by the example)")
        return await self.inner.decide(plan)

    async def reset(self, plan: Plan) -> None:
        await self.inner.reset(plan)

    async def update_counter(self, update: CounterUpdate) -> float:
        return await self.inner.update_counter(update)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    namespace = f"local-{uuid.uuid4().hex[:8]}"  # a run of its own on a shared Redis
    shared = RateLimit.from_url(url, namespace)  # memory:// is shared by passing its store
    stores = [
        Unplugged(shared.storage if url.startswith("memory") else RateLimit.from_url(url).storage)
        for _ in range(PROCESSES)
    ]
    limiters = [
        RateLimit(store, namespace, on_error="local", local_share=1 / PROCESSES) for store in stores
    ]
    searches = [rl.limit("user:100/h", key="search", user="ann") for rl in limiters]

    for store in stores:
        store.down = True
    admitted = [sum([(await s.decide()).allowed for _ in range(60)]) for s in searches]
    print(f"store down: {admitted} admitted of 60 each, {sum(admitted)} in all under user:100/h")

    for store in stores:
        store.down = False
    started = time.monotonic()
    back = [await s.decide() for s in searches]  # decided locally; each starts a probe
    while any(rl.storage_failing for rl in limiters):
        await asyncio.sleep(0.01)  # the probes' round trips (one every 0.2 s at most)
        back = [await s.decide() for s in searches]
    last = back[-1]
    print(
        f"store back: decided by the store again after {time.monotonic() - started:.2f} s "
        f"(degraded={last.degraded}); {last.remaining} left of 100, as the store counts"
    )
    for rl in limiters:
        await rl.aclose()
    await shared.aclose()


if __name__ == "__main__":
    asyncio.run(main())
