"""One OS process of the spread lock test: many callers of several users on one limit that
spreads, on the command engine with ``spread=True``, under its lock per user.

Run as ``python -m tests.spread_lock_worker URL NAMESPACE USERS CALLERS``: says it is ready,
waits for the go signal (a BLPOP), then makes CALLERS calls at once for each of USERS users
(``u0``, ``u1``, ...) of a function limited to ``user:5/h`` (a window that cannot move during
the test). Prints the calls admitted per user, then the degraded ones (admitted by the
failure policy, or refused because a lock stayed held past ``lock_timeout``).
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from ratelimit import RateLimit

RULE = "user:5/h"


async def main(url: str, namespace: str, users: int, callers: int) -> str:
    client = aioredis.Redis.from_url(url, max_connections=users * callers)
    # a generous deadline: an exact count must not rest on the machine's speed
    rl = RateLimit(client, namespace, use_scripts=False, spread=True, timeout=5)
    await rl.limit("1000/h", key="warm-up").decide()
    await asyncio.gather(*(client.ping() for _ in range(2 * users)))
    control = aioredis.Redis.from_url(url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    limits = [rl.limit(RULE, key="hot", user=f"u{n}") for n in range(users)]
    decisions = await asyncio.gather(*(limit.decide() for limit in limits for _ in range(callers)))
    await control.aclose()
    await rl.aclose()
    await client.aclose()
    admitted = [
        sum(d.allowed and not d.degraded for d in decisions[n * callers : (n + 1) * callers])
        for n in range(users)
    ]
    degraded = sum(d.degraded for d in decisions)
    return " ".join(map(str, [*admitted, degraded]))


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
