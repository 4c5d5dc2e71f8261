"""Slots kept for critical work: ordinary calls fill only what the reserve leaves.

    python examples/reserved_slots.py                                     # in-process memory://
    REDIS_URL=redis://localhost:6379/0 python examples/reserved_slots.py  # shared via Redis

``render`` runs at most 10 at once; critical calls keep 2 slots for themselves and high
ones 3 more (``reserve={"critical": 2, "high": 3}``, most critical first). Twenty calls of
each priority start together while every body is held open: ordinary calls get 5 slots,
high ones 3 more, critical ones the last 2. Then the bodies end, every slot comes back, and
a critical call finds the pool empty enough to run at once.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from ratelimit import ConcurrencyLimitExceeded, RateLimit

RESERVE = {"critical": 2, "high": 3}


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    namespace = f"reserved-{uuid.uuid4().hex[:8]}"  # a run of its own on a shared Redis
    async with RateLimit.from_url(url, namespace) as rl:
        release = asyncio.Event()

        @rl.concurrency("10", key="render", reserve=RESERVE, lease=10)
        async def render(priority: str | None, entered: asyncio.Future[None]) -> str:
            entered.set_result(None)
            await release.wait()  # the render's work, held until every call has tried
            return "rendered"

        async def call(priority: str | None) -> asyncio.Task[str] | None:
            """Start a call; its task while its body holds a slot, ``None`` if refused."""
            entered = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(render(priority, entered))
            await asyncio.wait([task, entered], return_when=asyncio.FIRST_COMPLETED)
            if entered.done():
                return task
            try:
                await task
            except ConcurrencyLimitExceeded:
                return None
            raise AssertionError("a body ended before it entered")

        running: list[asyncio.Task[str]] = []
        for priority in (None, "high", "critical"):  # ordinary calls come first
            started = await asyncio.gather(*(call(priority) for _ in range(20)))
            got = [task for task in started if task is not None]
            running += got
            print(
                f"{priority or 'ordinary':>8}: {len(got):2} of 20 got a slot, {len(running)} held"
            )
        release.set()
        await asyncio.gather(*running)
        release.clear()
        later = await call("critical")
        print(f"after every body ended, a critical call runs: {later is not None}")
        release.set()
        if later is not None:
            await later


if __name__ == "__main__":
    asyncio.run(main())
