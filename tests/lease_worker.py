"""One OS process of the lease tests: coroutines hammering one hot limit with leases.

Run as ``python -m tests.lease_worker URL NAMESPACE ALGORITHM RULE SECONDS LEASE TASKS
[STORAGE]`` (``STORAGE``: the store's URL, a cluster's say, when it is not the Redis at
``URL`` that coordinates the start): it says it is ready, waits for the go signal (a
BLPOP), then ``TASKS`` coroutines call the limit of ``RULE`` (selector ``apikey``, value
``k``) for ``SECONDS`` seconds, each admitted
call recorded as the wall-clock times (``time.time()``, the clock Redis's ``TIME`` reads on
this machine) just before it was asked and just after it was admitted. Prints them as JSON,
with the number of calls made.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterable

import redis.asyncio as aioredis

from ratelimit import RateLimit


def per_window(
    admitted: Iterable[tuple[float, float]], span: float
) -> tuple[Counter[int], Counter[int]]:
    """Admissions, each (asked, admitted) wall-clock times, counted per window of ``span``
    seconds (window ``n`` starts at ``n * span``, as the fixed windows' stores align them):
    those surely admitted in it (asked and admitted within it), and those that may have
    been (asked or admitted within it, or across it)."""
    surely: Counter[int] = Counter()
    anywhere: Counter[int] = Counter()
    for asked, done in admitted:
        first, last = math.floor(asked / span), math.floor(done / span)
        if first == last:
            surely[first] += 1
        for window in range(first, last + 1):
            anywhere[window] += 1
    return surely, anywhere


async def main(
    url: str,
    namespace: str,
    algorithm: str,
    rule: str,
    seconds: float,
    lease: float,
    tasks: int,
    storage: str = "",
) -> dict[str, object]:
    rl = RateLimit.from_url(
        storage or url, namespace, algorithm=algorithm, lease=lease, timeout=None
    )
    limit = rl.limit(rule, key="hot", apikey="k")
    await rl.limit("1000/h", key="warm-up").decide()  # connections before the go
    control = aioredis.Redis.from_url(url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    admitted: list[tuple[float, float]] = []
    calls = 0
    ends = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal calls
        while time.monotonic() < ends:
            before = time.time()
            decision = await limit.decide()
            calls += 1
            if decision.allowed:
                assert not decision.degraded, "a degraded admission: the count says nothing"
                admitted.append((before, time.time()))
            else:
                await asyncio.sleep(0)  # the denial cache answers at once: let others run

    await asyncio.gather(*(worker() for _ in range(tasks)))
    await rl.aclose()
    await control.aclose()
    return {"admitted": admitted, "calls": calls}


if __name__ == "__main__":
    url, namespace, algorithm, rule, seconds, lease, tasks = sys.argv[1:8]
    result = asyncio.run(
        main(
            url, namespace, algorithm, rule, float(seconds), float(lease), int(tasks), *sys.argv[8:]
        )
    )
    print(json.dumps(result))
