"""Concurrency slots: at most N bodies at once, across every process on the same Redis.

    python examples/concurrency.py                                     # in-process memory://
    REDIS_URL=redis://localhost:6379/0 python examples/concurrency.py  # shared via Redis

``export`` runs at most 2 at once per user (a slot is held while the body runs and given
back when it ends, even on an error or a cancellation) and at most 20 a minute per user (a
rate limit stacked under it). Eight exports of one user start together: two run, the others
queue for a slot (``wait=``) or, without ``wait``, are refused at once.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from ratelimit import ConcurrencyLimitExceeded, RateLimit

running = peak = 0


async def main() -> None:
    global running, peak
    url = os.environ.get("REDIS_URL", "memory://")
    namespace = f"concurrency-{uuid.uuid4().hex[:8]}"  # a run of its own on a shared Redis
    async with RateLimit.from_url(url, namespace) as rl:

        @rl.concurrency("user:2", wait=30, lease=10)  # slots outside: a rate refusal frees it
        @rl.limit("user:20/m", key="export-rate")
        async def export(user: str, report: int) -> str:
            global running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.05)  # the export's work
            running -= 1
            return f"report {report}"

        done = await asyncio.gather(*(export("ann", n) for n in range(8)))
        print(f"queued: {len(done)} exports ran, at most {peak} at once under user:2")

        busy = rl.concurrency("user:2", key="busy", user="bob")
        async with busy, busy:  # bob holds both of his slots
            try:
                async with busy:
                    pass
            except ConcurrencyLimitExceeded as exc:
                print(f"refused: {exc}")
        async with busy as decision:
            print(f"after the others ended: admitted, {decision.remaining} slot left")


if __name__ == "__main__":
    asyncio.run(main())
