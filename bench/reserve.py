"""What a reserve costs per take: ``rl.concurrency("100")`` against the same limit with
``reserve={"critical": 20}`` (ordinary and critical calls), on ``memory://`` and a real Redis.

Each row runs one ``async with`` (take and give back) after another, the rows taking
turns for a few rounds, and prints takes and give-backs per second and the client CPU per
pair (``process_time``: the server's CPU is not counted). The figure to read is the ratio
to the plain limit: the reserve adds one selector to resolve and a lookup per call, and no
store work. Starts a redis-server of its own (``tests.redis_server``) unless ``REDIS_URL``
is set. On code without ``reserve=``, the same rows all run the plain limit (the unknown
keywords are unused selectors): a baseline.

    PYTHONPATH=. python3 bench/reserve.py [--seconds 1.0] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from contextlib import ExitStack

from ratelimit import RateLimit
from ratelimit.front.concurrency import Concurrency
from tests.redis_server import RedisServer

CASES = {
    "plain": {},
    "reserve, ordinary call": {"reserve": {"critical": 20}, "priority": None},
    "reserve, critical call": {"reserve": {"critical": 20}, "priority": "critical"},
}


async def pairs(slots: Concurrency, seconds: float) -> tuple[float, float]:
    """Pairs per second and client CPU microseconds per pair, for ``seconds``."""
    start, cpu, n = time.perf_counter(), time.process_time(), 0
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            async with slots:
                pass
        n += 100
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n * 1e6


async def main(redis_url: str, seconds: float, rounds: int) -> None:
    print("| store | limit | takes+give-backs/s | client CPU µs each | of plain |")
    print("|---|---|---:|---:|---:|")
    for store, url in (("memory://", "memory://"), ("Redis (scripts)", redis_url)):
        rl = RateLimit.from_url(url, namespace=f"bench-{uuid.uuid4().hex[:8]}")
        cases = {
            name: rl.concurrency("100", key="bench", **options)  # type: ignore[arg-type]
            for name, options in CASES.items()
        }
        for slots in cases.values():
            await pairs(slots, seconds / 4)  # warm up (scripts loaded, connections made)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(rounds):  # the cases take turns: drift on a shared machine cancels
            for name, slots in cases.items():
                runs[name].append(await pairs(slots, seconds))
        plain = statistics.median(cpu for _, cpu in runs["plain"])
        for name, measured in runs.items():
            rate = statistics.median(r for r, _ in measured)
            cpu = statistics.median(c for _, c in measured)
            print(f"| {store} | {name} | {rate:,.0f} | {cpu:.1f} | {cpu / plain:.2f} |")
        await rl.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    with ExitStack() as stack:
        url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        asyncio.run(main(url, options.seconds, options.rounds))
