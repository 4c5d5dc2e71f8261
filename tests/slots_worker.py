"""One OS process of the concurrency-slot tests.

``python -m tests.slots_worker URL NAMESPACE COROUTINES ENGINE``, ENGINE ``script`` or
``locked`` (the command engine): says it is ready, waits for the go signal (a BLPOP), then
runs COROUTINES calls of a body limited to 5 at once, twice: once refusing (no wait), once
waiting. Each body counts itself in and out on Redis (INCR/DECR), so the largest count any
body saw is how many ran at once across every process. Prints: that peak, the bodies run
and refused in the first round, the bodies run in the second.

``ENGINE`` ``hold``: takes COROUTINES slots of key "held" (lease 1 s), says
``holding N`` and hangs, to be killed.

``ENGINE`` ``storm-script`` or ``storm-locked``: a cancellation storm. COROUTINES callers
each make :data:`STORM_CALLS` calls of a body limited to 5 at once (``wait=2``), every
other one cancelled 0 to 10 ms after it started; then the limiter is closed. Prints the
calls that ran, were cancelled and were refused.
"""

from __future__ import annotations

import asyncio
import random
import sys

import redis.asyncio as aioredis

from ratelimit import ConcurrencyLimitExceeded, RateLimit

STORM_CALLS = 30

ENGINES = {
    "script": {},
    "locked": {"use_scripts": False, "lock_timeout": 60.0, "lock_polling_interval": 0.01},
    "hold": {},
}


async def hold(rl: RateLimit, count: int) -> None:
    slots = rl.concurrency(str(count), key="held", lease=1.0)
    entered = 0
    for _ in range(count):
        await slots.__aenter__()
        entered += 1
    print(f"holding {entered}", flush=True)
    await asyncio.Event().wait()


async def storm(rl: RateLimit, control: aioredis.Redis, namespace: str, coroutines: int) -> str:
    outcomes = {"ran": 0, "cancelled": 0, "refused": 0}

    @rl.concurrency("5", key="storm", wait=2)
    async def body() -> None:
        await asyncio.sleep(0.001)

    async def caller() -> None:
        for call in range(STORM_CALLS):
            task = asyncio.create_task(body())
            if call % 2:
                await asyncio.sleep(random.uniform(0, 0.01))
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1
            except ConcurrencyLimitExceeded:
                outcomes["refused"] += 1
            else:
                outcomes["ran"] += 1

    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    await asyncio.gather(*(caller() for _ in range(coroutines)))
    await rl.aclose()  # give-backs still under way finish first
    return " ".join(str(n) for n in outcomes.values())


async def main(url: str, namespace: str, coroutines: int, engine: str) -> str:
    client = aioredis.Redis.from_url(url, max_connections=coroutines + 5)
    rl = RateLimit(
        client,
        namespace,
        timeout=None,
        **ENGINES[engine.removeprefix("storm-")],  # type: ignore[arg-type]
    )
    if engine == "hold":
        await hold(rl, coroutines)
    control = aioredis.Redis.from_url(url)
    if engine.startswith("storm-"):
        try:
            return await storm(rl, control, namespace, coroutines)
        finally:
            await control.aclose()
            await client.aclose()
    running = f"{namespace}:running"
    peak = 0

    async def body() -> None:
        nonlocal peak
        now = await control.incr(running)
        peak = max(peak, now)
        await asyncio.sleep(0.002)  # the body's work: others try meanwhile
        await control.decr(running)

    once = rl.concurrency("5", key="shared")(body)
    queued = rl.concurrency("5", key="shared", wait=True)(body)

    async def try_once() -> int:
        try:
            await once()
        except ConcurrencyLimitExceeded:
            return 0
        return 1

    async def wait_for_slot() -> int:
        await queued()
        return 1

    await control.incr(f"{namespace}:ready")
    await control.blpop([f"{namespace}:go"], timeout=30)
    ran = sum(await asyncio.gather(*(try_once() for _ in range(coroutines))))
    waited = sum(await asyncio.gather(*(wait_for_slot() for _ in range(coroutines))))
    await control.aclose()
    await client.aclose()
    return f"{peak} {ran} {coroutines - ran} {waited}"


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])))
