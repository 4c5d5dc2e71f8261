"""Leases: one hot shared limit decided in-process, never over the limit.

    python examples/leases.py                                     # memory://
    REDIS_URL=redis://localhost:6379/0 python examples/leases.py  # a real Redis

A partner's API key may make 5 000 calls a minute across every process. With ``lease=0.05``
each process takes a slice of the limit from the store in one decision (the store counts
the whole slice at once) and admits the calls that follow from it, with no round trip, for
at most 50 ms; what it did not use goes back when the lease ends. Near the limit, slices
shrink to one call: the last calls are decided one by one. Four limiters here stand for
four processes sharing one store, asking it a fraction of the time: together they never
admit more than 5 000. A few calls may be refused while other processes still hold room
in their leases (at most four leases' worth, each at most an eighth of what was left, for
at most 50 ms); once those leases end, calls made then take that room.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.backends import Backend
from ratelimit.decision import Decision
from ratelimit.plan import Plan

PROCESSES = 4
CALLS = 1600  # per process: 6 400 in all, against 5 000 a minute


class Counted(MemoryBackend):
    """``memory://`` that counts the decisions it is asked (a store's round trips)."""

    asked = 0

    async def decide(self, plan: Plan) -> Decision:
        Counted.asked += 1
        return await super().decide(plan)


def store() -> Backend | str:
    return os.environ.get("REDIS_URL") or Counted()


async def main() -> None:
    namespace = f"leases-{uuid.uuid4().hex[:8]}"
    shared = store()
    limiters = [
        RateLimit.from_url(shared, namespace, lease=0.05)
        if isinstance(shared, str)
        else RateLimit(shared, namespace, lease=0.05)
        for _ in range(PROCESSES)
    ]

    async def process(rl: RateLimit, calls: int) -> int:
        limit = rl.limit("apikey:5000/m", key="partner-api", apikey="partner-1")
        admitted = 0
        for _ in range(calls):
            try:
                async with limit:
                    admitted += 1
            except RateLimitExceeded:
                pass
            await asyncio.sleep(0)  # the others' turn, as processes run side by side
        return admitted

    first = await asyncio.gather(*(process(rl, CALLS) for rl in limiters))
    print(f"admitted {sum(first)} of {PROCESSES * CALLS} calls (limit 5000/m): {first}")
    await asyncio.sleep(0.1)  # the leases end, giving back the room they held
    later = await asyncio.gather(*(process(rl, 200) for rl in limiters))
    total = sum(first) + sum(later)
    print(f"{sum(later)} more once the leases ended: {total} in all, never more than 5000")
    assert 5000 - 4 * 5000 // 8 <= total <= 5000
    if isinstance(shared, Counted):
        print(f"the store decided {Counted.asked} times for {total} admissions")
        assert Counted.asked < total
    if isinstance(shared, str):  # each "process" gives back what its leases hold, and closes
        for rl in limiters:
            await rl.aclose()
    else:  # one store in this process: closed once, by the last
        await limiters[-1].aclose()


if __name__ == "__main__":
    asyncio.run(main())
