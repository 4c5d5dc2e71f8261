"""Red-team tests of the fused direct path on ``memory://`` (``ratelimit/front/fused.py``)
that the differential suites (``tests/test_direct_fused.py``, ``tests/test_direct_admits.py``,
``tests/test_direct_redteam.py``) leave out: selector values that are ``str`` in all but
class (a ``str`` enum, a ``str`` subclass with its own ``__str__``, an object whose
``__str__`` names a user); an override set by another limiter object sharing the backend,
read at every decision (``override_refresh=0``; on Redis too, for ``admits`` under
``ratelimit.front.direct.asker``, with an ``int`` value and its text); threads deciding through
the sync API and the fused path at once."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

import ratelimit.sync as rsync
from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded
from tests.conftest import FakeClock

ALGORITHMS = ["sliding-log", "gcra"]


class Named(enum.StrEnum):
    ANN = "ann"


class Renamed(str):
    def __str__(self) -> str:
        return "other"


class Spoken:
    def __str__(self) -> str:
        return "ann"


VALUES: list[Any] = ["ann", Named.ANN, Renamed("ann"), Spoken(), "ann", 5, "5", Renamed("bob")]


def stored(backend: MemoryBackend) -> object:
    logs = {k: (list(v.hits), v.kept, v.expires_us) for k, v in backend._logs.items()}
    arrivals = {k: (dict(v.tats), v.expires_us) for k, v in backend._arrivals.items()}
    return logs, arrivals


async def run(fused: bool, algorithm: str) -> object:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock, sweep_every=1)
    rl = RateLimit(backend, "hot", algorithm=algorithm)
    limit = rl.limit("user:3/m", key="k")
    if not fused:  # the general path: no direct path at all
        limit._direct = lambda key, parameters: (None, None, None)  # type: ignore[method-assign]

    @limit
    async def work(user: Any) -> int:
        return 1

    answers: list[object] = []
    for value in VALUES * 2:
        try:
            answers.append(await work(value))
        except RateLimitExceeded as exc:
            answers.append(("refused", round(exc.decision.retry_after, 6)))
        clock.advance(1)
    return answers, stored(backend)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_values_str_in_all_but_class_decide_as_the_general_path(algorithm: str) -> None:
    assert await run(True, algorithm) == await run(False, algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_an_override_set_by_another_limiter_on_the_backend(algorithm: str) -> None:
    """Two limiter objects on one ``MemoryBackend``: the one that did not set the override
    decides as its general path does."""

    async def run(fused: bool) -> list[object]:
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        mine = RateLimit(backend, "hot", algorithm=algorithm, override_refresh=0)
        theirs = RateLimit(backend, "hot", algorithm=algorithm)
        limit = mine.limit("user:2/m", key="k")
        if not fused:
            limit._direct = lambda key, parameters: (None, None, None)  # type: ignore[method-assign]

        @limit
        async def work(user: str) -> int:
            return 1

        answers: list[object] = []
        for step in range(12):
            if step == 3:
                await theirs.overrides.set("k", "user:5/m", user="ann")
            if step == 8:
                await theirs.overrides.delete("k", user="ann")
            try:
                answers.append(await work("ann"))
            except RateLimitExceeded:
                answers.append("refused")
            clock.advance(2)
        return [*answers, stored(backend)]

    fused = await run(True)
    assert fused.count(1) == 2 + 3  # the override seen at once
    assert fused == await run(False)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_threads_of_the_sync_api_and_fused_loops_admit_the_limit_exactly(
    algorithm: str,
) -> None:
    clock = FakeClock()  # frozen: exactly the limit is admitted
    backend = MemoryBackend(clock=clock, sweep_every=1)
    sync_rl = rsync.RateLimit(backend, "hot", algorithm=algorithm)
    async_rl = RateLimit(backend, "hot", algorithm=algorithm)

    @sync_rl.limit("user:50/h", key="k")
    def plain(user: str) -> int:
        return 1

    @async_rl.limit("user:50/h", key="k")
    async def fused(user: str) -> int:
        return 1

    admitted: list[int] = []

    def sync_worker() -> None:
        n = 0
        for _ in range(30):
            with contextlib.suppress(RateLimitExceeded):
                n += plain("ann")
        admitted.append(n)

    async def calls() -> int:
        n = 0
        for _ in range(30):
            with contextlib.suppress(RateLimitExceeded):
                n += await fused("ann")
            await asyncio.sleep(0)
        return n

    def async_worker() -> None:
        admitted.append(asyncio.run(calls()))

    threads = [threading.Thread(target=w) for w in [sync_worker, async_worker] * 3]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sync_rl.close()
    assert sum(admitted) == 50


@pytest.mark.redis
@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_an_override_set_by_another_limiter_on_redis(redis_url: str, algorithm: str) -> None:
    async def run(direct: bool, namespace: str) -> list[object]:
        clock = FakeClock()
        clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
        mine, theirs = (
            RateLimit(
                c,
                namespace,
                algorithm=algorithm,
                on_error="raise",
                timeout=5,
                clock=clock,
                override_refresh=refresh,
            )
            for c, refresh in zip(clients, (0, 1), strict=True)
        )
        limit = mine.limit("user:2/m", key="k")
        if not direct:
            limit._direct = lambda key, parameters: (None, None, None)  # type: ignore[method-assign]

        @limit
        async def work(user: Any) -> int:
            return 1

        answers: list[object] = []
        try:
            for step in range(14):
                if step == 3:
                    await theirs.overrides.set("k", "user:5/m", user=7)
                if step == 9:
                    await theirs.overrides.delete("k", user="7")
                for value in (7, "7"):
                    try:
                        answers.append(await work(value))
                    except RateLimitExceeded as exc:
                        answers.append(("refused", round(exc.decision.retry_after, 3)))
                clock.advance(1.5)
        finally:
            await mine.aclose()
            await theirs.aclose()
            for client in clients:
                await client.aclose()
        return answers

    tag = f"hot-{algorithm}-{uuid.uuid4().hex[:8]}"
    fast = await run(True, tag + "-direct")
    assert fast.count(1) == 2 + 3  # the override seen at once
    assert fast == await run(False, tag + "-general")
