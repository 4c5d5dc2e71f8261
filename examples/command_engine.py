"""The command engine: no Lua, for Redis-compatible servers and proxies that refuse scripts.

    REDIS_URL=redis://localhost:6379/0 python examples/command_engine.py

Decisions are the same as the default script engine's; they take more round trips, under a
Redis lock per (namespace, key). Needs a real Redis: without REDIS_URL it only says so.
"""

from __future__ import annotations

import asyncio
import os

from ratelimit import LockTimeoutError, RateLimit, RateLimitExceeded


async def main(url: str) -> None:
    async with RateLimit.from_url(
        url,
        namespace="commands-example",
        use_scripts=False,  # plain commands only: SET NX PX, LRANGE, MULTI/EXEC, WATCH
        lock_ttl=5.0,  # a crashed holder blocks this key for at most 5 s
        lock_timeout=2.0,  # give up waiting after 2 s: LockTimeoutError, never an admission
    ) as rl:

        @rl.limit("user:3/10s", key="upload")
        async def upload(user: str) -> str:
            return f"{user}: uploaded"

        for _ in range(4):
            try:
                print(await upload("vova"))
            except RateLimitExceeded as exc:
                print(f"vova: refused by {exc.rule}, retry in {exc.retry_after:.1f} s")
            except LockTimeoutError as exc:
                print(f"busy: {exc}")

    # Without the lock: faster, but decisions in flight at the same moment can all be
    # admitted. Here 20 concurrent calls against 5/10s.
    async with RateLimit.from_url(
        url, namespace="commands-example", use_scripts=False, disable_locks=True
    ) as rl:
        limit = rl.limit("5/10s", key="burst")
        decisions = await asyncio.gather(*(limit.decide() for _ in range(20)))
        print(f"without the lock: {sum(d.allowed for d in decisions)} of 20 admitted under 5/10s")


if __name__ == "__main__":
    url = os.environ.get("REDIS_URL")
    if url:
        asyncio.run(main(url))
    else:
        print("the command engine needs Redis: set REDIS_URL=redis://host:port/db to run it")
