"""One limiter made at import time, used by one event loop after another, on a tiny pool.

    python examples/event_loops.py                                   # in-process memory://
    REDIS_URL=redis://localhost:6379/0 python examples/event_loops.py   # one connection

A limiter often outlives the loop that first used it: a script that calls ``asyncio.run()``
twice, a test suite with a loop per test. Each run below uses the same limiter, and every
hit counts once. On Redis the client has a single connection: 300 calls at once wait for
it (they travel together, in batches) rather than fail, and still admit exactly the limit.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ratelimit import LimiterClosedError, RateLimit

URL = os.environ.get("REDIS_URL", "memory://")
OPTIONS: dict[str, Any] = {"max_connections": 1} if URL != "memory://" else {}
rl = RateLimit.from_url(URL, namespace="event-loops", **OPTIONS)  # made once, at import

search = rl.limit("100/h", key="search")


async def burst(calls: int) -> int:
    """Admitted calls out of ``calls`` made all at once."""
    decisions = await asyncio.gather(*(search.decide() for _ in range(calls)))
    degraded = sum(d.degraded for d in decisions)
    assert degraded == 0, f"{degraded} calls found no connection"  # back-pressure, no outage
    return sum(d.allowed for d in decisions)


async def last_run() -> None:
    print(f"run 3: {await burst(300)} of 300 admitted (the hour's 100 are used up)")
    await search.reset()  # so the example starts afresh next time
    await rl.aclose()
    try:
        await search.decide()
    except LimiterClosedError as exc:
        print(f"after aclose(): {type(exc).__name__}")


def main() -> None:
    where = "one Redis connection" if OPTIONS else "memory://"
    print(f"on {where}")
    print(f"run 1: {asyncio.run(burst(60))} of 60 admitted")
    print(f"run 2: {asyncio.run(burst(300))} of 300 admitted, 100 in all under 100/h")
    asyncio.run(last_run())


if __name__ == "__main__":
    main()
