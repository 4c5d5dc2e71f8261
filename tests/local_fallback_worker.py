"""One OS process deciding under ``on_error="local"`` while its Redis is killed and restarted.

``python -m tests.local_fallback_worker CONTROL_URL NAMESPACE DATA_URL SHARE AFTER``: makes a
limiter on DATA_URL (``on_error="local"``, ``local_share=SHARE``, ``timeout=5``), warms it
up, says it is ready on the control Redis and waits for the go (a BLPOP; the test kills the
data Redis first). Then decides ``user:100/h`` for one user at a caller's pace: once it has
made 200 local decisions it says so (``<namespace>:local``), and after the first decision
the store made again it makes AFTER more and stops. Prints: local decisions, local
admissions, the wall-clock time of the first store decision, the store's admissions after
it, and degraded decisions after it.
"""

from __future__ import annotations

import asyncio
import sys
import time

import redis.asyncio as aioredis

from ratelimit import RateLimit

RULE = "user:100/h"


async def main(control_url: str, namespace: str, data_url: str, share: float, after: int) -> str:
    rl = RateLimit.from_url(data_url, namespace, on_error="local", local_share=share, timeout=5.0)
    await rl.limit(RULE, key="hit", user="warm-up").decide()
    control = aioredis.Redis.from_url(control_url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    limit = rl.limit(RULE, key="hit", user="victim")
    local = local_admitted = store_admitted = degraded_after = store_calls = 0
    first_store = 0.0
    deadline = time.monotonic() + 60
    while store_calls < after and time.monotonic() < deadline:
        decision = await limit.decide()
        if first_store and decision.degraded:
            degraded_after += 1
        elif decision.degraded:
            local += 1
            local_admitted += decision.allowed
            if local == 200:
                await control.incr(f"{namespace}:local")
        else:
            first_store = first_store or time.time()
            store_calls += 1
            store_admitted += decision.allowed
        await asyncio.sleep(0.002)  # a caller's pace, not a wait for a window
    await control.aclose()
    await rl.aclose()
    return f"{local} {local_admitted} {first_store:.3f} {store_admitted} {degraded_after}"


if __name__ == "__main__":
    control_url, namespace, data_url, share, after = sys.argv[1:6]
    print(asyncio.run(main(control_url, namespace, data_url, float(share), int(after))))
