"""Decisions per second of the three Redis engines, side by side on one Redis in one run.

    python bench/bench_engines.py [--calls 3000] [--users 1000]

Engines: the Lua script (default), the command engine under its lock (``use_scripts=False``,
default lock settings, and with a 5 ms polling interval), and the command engine without the
lock (``disable_locks=True``). Each call is one admitted decision under ``user:100/m`` for
one of ``--users`` users of one function, so every decision of the locked engine takes the
same lock (one lock per key, as in seed 002). Prints decisions per second and the ratio to
the script engine, at concurrency 1 and 64.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis.asyncio as aioredis
from bench_decisions import measure, run

from ratelimit import RateLimit

ENGINES: dict[str, dict[str, Any]] = {
    "script": {},
    "locked commands": {"use_scripts": False},
    "locked, 5 ms polling": {"use_scripts": False, "lock_polling_interval": 0.005},
    "unlocked commands": {"use_scripts": False, "disable_locks": True},
}


async def rate(
    url: str, options: dict[str, Any], calls: int, users: int, concurrency: int
) -> float:
    client = aioredis.Redis.from_url(url, max_connections=128)
    rl = RateLimit(client, f"bench-{uuid.uuid4().hex[:8]}", **options)

    @rl.limit("user:100/m")
    async def work(user: str) -> bool:
        return True

    try:
        return await measure(work, calls, users, concurrency)
    finally:
        await client.aclose()


async def main(url: str, calls: int, users: int) -> None:
    print(f"{calls} admitted decisions over {users} users, user:100/m, redis at {url}")
    print(f"{'engine':<22} {'concurrency':>11} {'decisions/s':>12} {'vs script':>9}")
    for concurrency in (1, 64):
        script = 0.0
        for name, options in ENGINES.items():
            per_second = await rate(url, options, calls, users, concurrency)
            script = script or per_second
            print(f"{name:<22} {concurrency:>11} {per_second:>12.0f} {per_second / script:>9.2f}")


if __name__ == "__main__":
    run(main, __doc__.split("\n")[0], default_calls=3_000)
