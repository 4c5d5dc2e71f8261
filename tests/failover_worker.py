"""One OS process deciding on a Redis Cluster while a master fails over.

``python -m tests.failover_worker CONTROL_URL NAMESPACE SECONDS CLUSTER_URL LAYOUT``
(LAYOUT ``spread``: the default ``spread=None``, or ``pinned``: ``spread=False``): says it is
ready on the control Redis, waits for the go (a BLPOP), then for SECONDS decides in a loop on
``user:100000/h`` (timeout 0.25 s, fail-open), and on past them until a decision is answered
by Redis again (at most ``RESUME_WITHIN`` seconds more: a loaded machine's failover may end
after SECONDS), and prints: decisions, degraded ones, the slowest call in ms, the wall-clock
time of its last degraded decision (0 for none), and 1 when its last decision was answered by
Redis (0 when the cluster did not come back in time).
"""

from __future__ import annotations

import asyncio
import sys
import time

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ratelimit import RateLimit

RESUME_WITHIN = 30.0


async def main(
    control_url: str, namespace: str, seconds: float, cluster_url: str, layout: str
) -> str:
    client = RedisCluster.from_url(cluster_url)
    rl = RateLimit(client, namespace, timeout=0.25, spread=None if layout == "spread" else False)
    await rl.limit("user:100000/h", key="hit", user="warm-up").decide()
    control = aioredis.Redis.from_url(control_url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    decisions = degraded = 0
    slowest = last_degraded = 0.0
    end = time.monotonic() + seconds
    resumed = False
    while time.monotonic() < end or (not resumed and time.monotonic() < end + RESUME_WITHIN):
        started = time.monotonic()
        decision = await rl.limit("user:100000/h", key="hit", user=f"u{decisions % 50}").decide()
        slowest = max(slowest, time.monotonic() - started)
        decisions += 1
        resumed = not decision.degraded
        if decision.degraded:
            degraded += 1
            last_degraded = time.time()
            await asyncio.sleep(0.01)  # a caller's pace, not a wait for a window
    await control.aclose()
    await client.aclose()
    return f"{decisions} {degraded} {slowest * 1000:.1f} {last_degraded:.3f} {int(resumed)}"


if __name__ == "__main__":
    control_url, namespace, seconds, cluster_url, layout = sys.argv[1:6]
    print(asyncio.run(main(control_url, namespace, float(seconds), cluster_url, layout)))
