"""Slots kept for critical work (``rl.concurrency("100", reserve={"critical": 20})``, issue
39): ordinary calls take only what the reserve leaves, critical ones any slot; levels nest;
on every store that holds slots, across OS processes on a real Redis, validated when made."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

import ratelimit.sync
from ratelimit import (
    ConcurrencyLimitExceeded,
    ConfigurationError,
    RateLimit,
    SelectorNotFoundError,
)
from ratelimit.backends.base import SlotStore
from ratelimit.backends.postgres import PostgresBackend
from ratelimit.core.plan import Identifier
from ratelimit.core.slots import SlotClaim, SlotLimit, parse_slots
from ratelimit.front.concurrency import Concurrency
from tests.conftest import FakeClock
from tests.workers import run_workers

pytestmark = pytest.mark.timeout(120)

RESERVE = {"critical": 20, "high": 10}


class Holders:
    """Calls of one limiter whose bodies hold their slot until :meth:`end`."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running: list[asyncio.Task[Any]] = []

    async def take(self, slots: Concurrency, tries: int = 1) -> int:
        """How many of ``tries`` calls at once got a slot (their bodies hold it)."""

        async def one() -> int:
            entered = asyncio.get_running_loop().create_future()

            async def body() -> None:
                async with slots:
                    entered.set_result(None)
                    await self.release.wait()

            task = asyncio.create_task(body())
            await asyncio.wait([task, entered], return_when=asyncio.FIRST_COMPLETED)
            if entered.done():
                self.running.append(task)
                return 1
            with contextlib.suppress(ConcurrencyLimitExceeded):
                await task
            return 0

        return sum(await asyncio.gather(*(one() for _ in range(tries))))

    async def end(self) -> None:
        self.release.set()
        await asyncio.gather(*self.running)
        self.running.clear()
        self.release = asyncio.Event()


# --- made: bad reserves fail at construction, naming what and where ---


def test_bad_reserves_fail_when_made() -> None:
    rl = RateLimit.from_url("memory://")
    with pytest.raises(ConfigurationError, match=r"non-empty mapping .* not \[20\]"):
        rl.concurrency("100", reserve=[20])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="non-empty mapping"):
        rl.concurrency("100", reserve={})
    with pytest.raises(ConfigurationError, match="'critical' keeps a whole number .* not 0"):
        rl.concurrency("100", reserve={"critical": 0})
    with pytest.raises(ConfigurationError, match="not 2.5"):
        rl.concurrency("100", reserve={"critical": 2.5})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="not True"):
        rl.concurrency("100", reserve={"critical": True})
    with pytest.raises(ConfigurationError, match="a priority is non-empty text, not ''"):
        rl.concurrency("100", reserve={"": 1})
    with pytest.raises(
        ConfigurationError,
        match=r"concurrency\('100'\) keeps 100 slots \(critical 90, high 10\) of limit '100', "
        r"which has 100: at least 1 must be left for ordinary calls",
    ):
        rl.concurrency("100", reserve={"critical": 90, "high": 10})
    with pytest.raises(
        ConfigurationError, match="keeps 20 slots .* of limit 'user:5', which has 5"
    ):
        rl.concurrency("user:5 | 100", reserve={"critical": 20})
    with pytest.raises(ConfigurationError, match="reserve_by= .* must name a selector"):
        rl.concurrency("100", reserve={"critical": 1}, reserve_by="a-b")
    with pytest.raises(ConfigurationError, match="reserve_by='tier' .* but no reserve="):
        rl.concurrency("100", reserve_by="tier")
    with pytest.raises(ConfigurationError, match="reserve_by='user' .* also a selector"):
        rl.concurrency("user:5", reserve={"critical": 1}, reserve_by="user")
    assert rl.concurrency("100", reserve={"critical": 99}).limits == (SlotLimit(100),)


async def test_a_priority_no_call_can_give_fails_when_decorating() -> None:
    rl = RateLimit.from_url("memory://")
    with pytest.raises(SelectorNotFoundError, match="priority selector 'priority' of reserve="):

        @rl.concurrency("10", reserve={"critical": 2})
        async def export(user: str) -> None: ...

    with pytest.raises(SelectorNotFoundError, match="priority selector 'tier'"):

        @rl.concurrency("10", reserve={"critical": 2}, reserve_by="tier")
        async def report(user: str) -> None: ...

    with pytest.raises(ConfigurationError, match="priority= names no selector"):
        rl.concurrency("10", reserve={"critical": 2}, reserve_by="tier", priority="critical")

    with pytest.raises(SelectorNotFoundError, match="selector 'priority' of key 'b'"):
        async with rl.concurrency("10", key="b", reserve={"critical": 2}):
            pass  # a block has no call to look in: the priority comes with the limit

    @rl.concurrency("10", reserve={"critical": 2})
    async def by_parameter(priority: str) -> None: ...

    @rl.concurrency("10", reserve={"critical": 2}, reserve_by="tier", tier=lambda: "critical")
    async def by_keyword(user: str) -> None: ...


def test_caps_per_priority_nest_in_the_order_given() -> None:
    from ratelimit.front.reserve import Reserve  # here: the other tests run on code without it

    reserve = Reserve(RESERVE, "priority", parse_slots("user:40 | 100"), "here")
    assert reserve.limits_for("critical") == parse_slots("user:40 | 100")
    assert reserve.limits_for("high") == parse_slots("user:20 | 80")
    for ordinary in (None, "low", "Critical"):
        assert reserve.limits_for(ordinary) == parse_slots("user:10 | 70")


def test_a_priority_no_level_lists_is_ordinary_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ratelimit.front.reserve import UNLISTED_WARNED, Reserve

    reserve = Reserve(RESERVE, "priority", parse_slots("100"), "here")
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for _ in range(3):
            assert reserve.limits_for("Priority.CRITICAL") == parse_slots("70")
        assert reserve.limits_for("") == parse_slots("70")
        assert reserve.limits_for("critical") == parse_slots("100")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1
    assert "'Priority.CRITICAL' is not one of reserve=" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for n in range(UNLISTED_WARNED * 2):
            reserve.limits_for(f"p{n}")
    assert len(caplog.records) == UNLISTED_WARNED - 1  # bounded: a header may say anything


@pytest.mark.postgres
async def test_postgresql_refuses_a_reserve_as_it_refuses_slots(postgres_url: str) -> None:
    rl = RateLimit(PostgresBackend(postgres_url), algorithm="sliding-window")
    with pytest.raises(ConfigurationError, match="holds no concurrency slots"):
        rl.concurrency("100", reserve={"critical": 20})
    with pytest.raises(ConfigurationError, match="holds no concurrency slots"):
        rl.concurrency("100", reserve={"critical": 20}, reserve_by="tier", tier="critical")
    await rl.aclose()


# --- the stores: two claims of different counts on one identifier ---


async def test_claims_of_different_caps_share_one_identifier(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    """A take compares the holders with its own count; renew and give-back ignore it."""
    store = make_backend(FakeClock())
    assert isinstance(store, SlotStore)
    identifier = Identifier(namespace, "k", "user", "ann")

    def claim(token: str, count: int) -> SlotClaim:
        return SlotClaim(namespace, "k", (identifier,), (count,), token, 10_000_000, True)

    assert [(await store.acquire_slots(claim(f"o{i}", 3)))[0] for i in range(4)] == [
        *[True] * 3,
        False,
    ]
    assert await store.acquire_slots(claim("c1", 5)) == (True, (3,))
    assert await store.acquire_slots(claim("c2", 5)) == (True, (4,))
    assert await store.acquire_slots(claim("c3", 5)) == (False, (5,))
    assert await store.renew_slots(claim("c1", 5))
    await store.release_slots(claim("o0", 3))
    assert await store.acquire_slots(claim("o4", 3)) == (False, (4,))  # 4 held, 3 ordinary
    await store.release_slots(claim("c1", 5))
    assert await store.acquire_slots(claim("o4", 3)) == (False, (3,))
    assert await store.acquire_slots(claim("c3", 5)) == (True, (3,))


async def test_ordinary_calls_stop_at_what_the_reserve_leaves(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    """``"user:100"`` keeping 20 for critical and 10 for high: 70 ordinary holders, then
    10 high, then 20 critical; each released slot goes to whoever may take it."""
    rl = RateLimit(make_backend(), namespace, on_error="raise")  # no timeout: exact

    def slots(priority: str | None) -> Concurrency:
        return rl.concurrency("user:100", key="k", reserve=RESERVE, user="ann", priority=priority)

    ordinary, high, critical = slots(None), slots("high"), slots("critical")
    holders = Holders()
    assert await holders.take(ordinary, 75) == 70
    assert await holders.take(slots("unlisted")) == 0
    assert await holders.take(high, 15) == 10
    assert await holders.take(ordinary, 5) == 0
    assert await holders.take(critical, 25) == 20
    assert await holders.take(high) == 0
    async with rl.concurrency("user:100", key="k", reserve=RESERVE, user="bob", priority=None):
        pass  # another user's slots are their own
    await holders.end()
    assert await holders.take(critical, 30) == 30  # critical calls may take ordinary slots
    assert await holders.take(ordinary, 45) == 40  # up to 70 holders in all
    assert await holders.take(high, 15) == 10
    assert await holders.take(critical, 25) == 20
    await holders.end()
    await rl.aclose()


async def test_memory_holds_the_caps_over_many_tasks_at_once() -> None:
    """90 ordinary and 30 critical calls at once, in any order: at most 80 ordinary holders,
    at most 100 in all, and the critical calls get at least the 20 kept for them."""
    rl = RateLimit.from_url("memory://", on_error="raise")

    def slots(priority: str | None) -> Concurrency:
        return rl.concurrency("100", key="m", reserve={"critical": 20}, priority=priority)

    holders = Holders()
    ordinary, critical = await asyncio.gather(
        holders.take(slots(None), 90), holders.take(slots("critical"), 30)
    )
    assert ordinary <= 80
    assert ordinary + critical <= 100
    assert critical >= 20
    await holders.end()
    await rl.aclose()


def test_the_sync_api_passes_the_reserve_through() -> None:
    rl = ratelimit.sync.RateLimit.from_url("memory://")
    try:
        with pytest.raises(ConfigurationError, match="keeps 5 slots .* of limit '5'"):
            rl.concurrency("5", reserve={"critical": 5})
        ordinary = rl.concurrency("3", key="s", reserve={"critical": 1}, priority=None)
        critical = rl.concurrency("3", key="s", reserve={"critical": 1}, priority="critical")
        with ordinary, ordinary:
            with pytest.raises(ConcurrencyLimitExceeded), ordinary:
                pass
            with critical:
                pass
    finally:
        rl.close()


# --- several OS processes on a real Redis ---


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.parametrize("engine", ["script", "locked"])
async def test_four_processes_keep_the_reserve(
    redis_client: aioredis.Redis, redis_url: str, namespace: str, engine: str
) -> None:
    """4 processes share ``concurrency("100", reserve={"critical": 20, "high": 10})``,
    bodies held open until the test lets them end (tests/reserve_worker.py). Together:
    120 ordinary calls get exactly 70 slots; then 40 high calls 10 and 120 more ordinary
    ones none; then 40 critical calls 20, while high and unlisted ones get none."""

    async def phase(done: str, go: str) -> None:
        for _ in range(4):  # each process says it is done with the phase
            assert await redis_client.blpop([f"{namespace}:{done}"], timeout=60)
        await redis_client.rpush(f"{namespace}:{go}", *["go"] * 4)

    async def phases() -> None:
        await phase("phase1", "go2")
        await phase("phase2", "go3")
        await phase("phase3", "go4")

    outputs = await run_workers(
        redis_client, namespace, "tests.reserve_worker", redis_url, namespace, engine,
        after_go=phases,
    )  # fmt: skip
    counts = [[int(n) for n in out.split()] for out in outputs]
    totals = [sum(column) for column in zip(*counts, strict=True)]
    ordinary1, high2, ordinary2, critical3, high3, ordinary3 = totals
    assert ordinary1 == 70, f"{ordinary1} ordinary holders where the reserve leaves 70"
    assert (high2, ordinary2) == (10, 0)
    assert (critical3, high3, ordinary3) == (20, 0, 0)
    assert not await redis_client.exists(f"rl:{{{namespace}:shared}}:c")  # all given back
