"""One OS process of the lock contention test: many callers on one limit of the command
engine, under its lock, with every other setting at its default.

Run as ``python -m tests.lock_contention_worker URL NAMESPACE CALLERS``: the command engine
(``use_scripts=False``) with the default 0.25 s deadline, ``lock_timeout`` and polling
interval; says it is ready, waits for the go signal (a BLPOP), then makes CALLERS calls at
once of a function limited to ``30/h`` (a window that cannot move during the test). Prints
the calls admitted, refused by the rule, and degraded (admitted by the failure policy, or
refused because the lock stayed held past ``lock_timeout``).
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from ratelimit import RateLimit

RULE = "30/h"


async def main(url: str, namespace: str, callers: int) -> str:
    client = aioredis.Redis.from_url(url, max_connections=callers)
    rl = RateLimit(client, namespace, use_scripts=False)
    limit = rl.limit(RULE, key="shared")
    await rl.limit("1000/h", key="warm-up").decide()
    # Connections open before the go, as in a running application: a waiter blocks one, so
    # a holder, its release and the next try need their own (opening one takes round trips).
    await asyncio.gather(*(client.ping() for _ in range(5)))
    control = aioredis.Redis.from_url(url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    decisions = await asyncio.gather(*(limit.decide() for _ in range(callers)))
    await control.aclose()
    await rl.aclose()
    await client.aclose()
    admitted = sum(d.allowed and not d.degraded for d in decisions)
    refused = sum(not d.allowed and not d.degraded for d in decisions)
    degraded = sum(d.degraded for d in decisions)
    return f"{admitted} {refused} {degraded}"


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
