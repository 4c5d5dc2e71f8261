"""Take a command-engine lock and hold it until killed.

Run as ``python -m tests.lock_holder URL NAME TTL``. Prints ``held`` once the lock is taken,
then waits for ever: the test SIGKILLs it.
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from ratelimit.backends.redis.command.lock import RedisLock


async def main(url: str, name: str, ttl: float) -> None:
    client = aioredis.Redis.from_url(url)
    lock = RedisLock(client, name, ttl=ttl, polling_interval=0.01, timeout=5)
    await lock.acquire()
    print("held", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
