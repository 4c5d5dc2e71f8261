"""One OS process of the reserved-slot tests (``tests/test_reserve.py``).

``python -m tests.reserve_worker URL NAMESPACE ENGINE``, ENGINE ``script`` or ``locked`` (the
command engine). Every process shares ``concurrency("100", key="shared",
reserve={"critical": 20, "high": 10})``. It says it is ready, waits for the go signal (a
BLPOP of ``<ns>:go``), then:

1. tries :data:`ORDINARY` ordinary calls at once, each body holding its slot (until step
   4); says so (RPUSH ``<ns>:phase1``) and waits for ``<ns>:go2``;
2. tries :data:`HIGH` high and :data:`ORDINARY` more ordinary calls at once, bodies held;
   says so (``<ns>:phase2``) and waits for ``<ns>:go3``;
3. tries :data:`CRITICAL` critical, :data:`HIGH` high and :data:`ORDINARY` calls of an
   unlisted priority (ordinary) at once, bodies held; says so (``<ns>:phase3``) and waits
   for ``<ns>:go4``;
4. lets every body end (each gives its slot back) and closes its limiter.

The priority is the body's own ``priority`` parameter.

Prints what each phase admitted: ordinary1, high2, ordinary2, critical3, high3, ordinary3.
The test holds the processes between phases (no timing), so every phase sees the slots of
all the phases before it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

import redis.asyncio as aioredis

from ratelimit import ConcurrencyLimitExceeded, RateLimit

ORDINARY = 30
HIGH = 10
CRITICAL = 10
RESERVE = {"critical": 20, "high": 10}

ENGINES = {
    "script": {},
    "locked": {"use_scripts": False, "lock_timeout": 60.0, "lock_polling_interval": 0.01},
}


async def main(url: str, namespace: str, engine: str) -> str:
    client = aioredis.Redis.from_url(url, max_connections=80)
    rl = RateLimit(client, namespace, timeout=5, on_error="raise", **ENGINES[engine])  # type: ignore[arg-type]
    control = aioredis.Redis.from_url(url)
    release = asyncio.Event()
    running: list[asyncio.Task[None]] = []

    @rl.concurrency("100", key="shared", reserve=RESERVE)
    async def body(priority: str | None, entered: asyncio.Future[None]) -> None:
        entered.set_result(None)  # holding its slot until the test lets every body end
        await release.wait()

    async def one(priority: str | None) -> int:
        entered = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(body(priority, entered))
        await asyncio.wait([task, entered], return_when=asyncio.FIRST_COMPLETED)
        if entered.done():
            running.append(task)
            return 1
        with contextlib.suppress(ConcurrencyLimitExceeded):
            await task
        return 0

    async def take(priority: str | None, tries: int) -> int:
        return sum(await asyncio.gather(*(one(priority) for _ in range(tries))))

    async def phase(done: str, go: str) -> None:
        await control.rpush(f"{namespace}:{done}", "done")
        await control.blpop([f"{namespace}:{go}"], timeout=60)

    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=60)
    counts = [await take(None, ORDINARY)]
    await phase("phase1", "go2")
    counts += await asyncio.gather(take("high", HIGH), take(None, ORDINARY))
    await phase("phase2", "go3")
    counts += await asyncio.gather(
        take("critical", CRITICAL), take("high", HIGH), take("unlisted", ORDINARY)
    )
    await phase("phase3", "go4")
    release.set()
    await asyncio.gather(*running)  # every body ends and gives its slot back
    await rl.aclose()
    await control.aclose()
    await client.aclose()
    return " ".join(map(str, counts))


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3])))
