"""One OS process of the concurrency test: many coroutines calling one limited function.

Run as ``python -m tests.concurrency_worker URL NAMESPACE COROUTINES [ENGINE]`` with ENGINE
``script`` (default), ``valkey`` (the script engine on valkey-py's client), ``gcra`` (the
script engine on GCRA), ``locked`` or ``unlocked`` (the command engine with or without its
lock), or ``postgres STORAGE_URL``
(Postgres, URL still the Redis that coordinates the start). It says it is ready, waits for
the go signal (a BLPOP), runs, and prints how many calls were admitted. With
``postgres-first STORAGE_URL ON_ERROR DEADLINE`` (:func:`first_use`) it makes a fresh
database's first calls and prints how many were admitted and how many failed.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import redis.asyncio as aioredis
import valkey.asyncio as aiovalkey

from ratelimit import BackendError, RateLimit, RateLimitExceeded

ENGINES = {
    "script": {},
    "valkey": {},  # the script engine on valkey-py's client
    "locked": {"use_scripts": False, "lock_timeout": 60.0, "lock_polling_interval": 0.01},
    "unlocked": {"use_scripts": False, "disable_locks": True},
    "gcra": {"algorithm": "gcra"},  # the script engine, GCRA's one-rule script
}


def limiter(url: str, namespace: str, coroutines: int, engine: str, storage: str) -> RateLimit:
    # No deadline: this counts admissions under contention, and a decision that missed the
    # default 0.25 s on a loaded machine would be admitted by the fail-open policy. Postgres
    # raises what fails (a count that includes a degraded admission says nothing): 10
    # connections a process (4 processes of 50 opened 200, the server's maximum, and a pool
    # that gave none within the 5 s setup_timeout on a loaded machine admitted one degraded).
    if engine == "postgres":
        return RateLimit.from_url(
            storage, namespace, algorithm="sliding-window", timeout=None, max_size=10,
            setup_timeout=120.0, on_error="raise",
        )  # fmt: skip
    client: Any = (aiovalkey.Valkey if engine == "valkey" else aioredis.Redis).from_url(
        url, max_connections=coroutines
    )
    return RateLimit(client, namespace, timeout=None, **ENGINES[engine])  # type: ignore[arg-type]


async def main(
    url: str, namespace: str, coroutines: int, engine: str = "script", storage: str = ""
) -> int:
    rl = limiter(url, namespace, coroutines, engine, storage)

    @rl.limit("50/h", key="shared")
    async def work() -> None:
        return None

    async def one() -> int:
        try:
            await work()
        except RateLimitExceeded:
            return 0
        return 1

    await rl.limit("1000/h", key="warm-up").decide()  # connections (and a schema) before the go
    control = aioredis.Redis.from_url(url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    admitted = sum(await asyncio.gather(*(one() for _ in range(coroutines))))
    await control.aclose()
    await rl.aclose()
    if engine != "postgres":
        await rl.storage.client.aclose()  # type: ignore[attr-defined]  # passed in: ours to close
    return admitted


async def first_use(
    url: str, namespace: str, coroutines: int, storage: str, on_error: str, deadline: float
) -> tuple[int, int]:
    """``postgres-first``: a limiter with default settings but ``on_error`` and ``timeout``
    (``deadline``), whose first calls, ``coroutines`` at once on ``<coroutines>/h``, are its
    first use of the database: no warm-up. Returns how many were admitted and how many
    raised ``BackendError``."""
    rl = RateLimit.from_url(
        storage, namespace, algorithm="sliding-window", on_error=on_error, timeout=deadline
    )
    limit = rl.limit(f"{coroutines}/h", key="shared")

    async def one() -> tuple[int, int]:
        try:
            return int((await limit.decide()).allowed), 0
        except BackendError:
            return 0, 1

    control = aioredis.Redis.from_url(url)
    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    results = await asyncio.gather(*(one() for _ in range(coroutines)))
    await control.aclose()
    await rl.aclose()
    return sum(a for a, _ in results), sum(f for _, f in results)


if __name__ == "__main__":
    if sys.argv[4:5] == ["postgres-first"]:  # ... postgres-first DSN ON_ERROR DEADLINE
        url, namespace, coroutines, _, dsn, on_error, deadline = sys.argv[1:8]
        admitted, failed = asyncio.run(
            first_use(url, namespace, int(coroutines), dsn, on_error, float(deadline))
        )
        print(admitted, failed)
    else:
        print(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])))
