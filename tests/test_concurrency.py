"""Concurrency slots (``rl.concurrency``, issue 14): at most N bodies at once per identifier,
given back on return, exception and cancellation, leased so that a dead holder's slots come
back; on every backend, and across OS processes on a real Redis."""

from __future__ import annotations

import asyncio
import functools
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratelimit import (
    ConcurrencyLimitExceeded,
    ConfigurationError,
    LimiterClosedError,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
    RuleSyntaxError,
)
from ratelimit.backends.base import SlotStore
from ratelimit.core.plan import Identifier
from ratelimit.core.slots import SlotClaim, SlotLimit, parse_slots
from ratelimit.front.concurrency import Concurrency
from tests.conftest import FailingBackend, FakeClock, run_virtual
from tests.service_process import ROOT
from tests.workers import run_workers

pytestmark = pytest.mark.timeout(120)


def claim_in(
    token: str, count: int = 2, lease: float = 10.0, value: str = "u", namespace: str = "slots"
) -> SlotClaim:
    identifier = Identifier(namespace, "k", "user", value)
    return SlotClaim(namespace, "k", (identifier,), (count,), token, round(lease * 1_000_000))


async def enters(slots: Concurrency) -> bool:
    """Whether a call gets a slot now (given back at once)."""
    try:
        async with slots:
            return True
    except ConcurrencyLimitExceeded:
        return False


# --- the store's three operations, on every backend ---


async def test_slots_are_taken_renewed_and_given_back(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    clock = FakeClock()
    store = make_backend(clock)
    claim = functools.partial(claim_in, namespace=namespace)
    assert isinstance(store, SlotStore)
    assert await store.acquire_slots(claim("a")) == (True, (0,))
    assert await store.acquire_slots(claim("b")) == (True, (1,))
    assert await store.acquire_slots(claim("c")) == (False, (2,))
    assert await store.acquire_slots(claim("c", value="other")) == (True, (0,))
    await store.release_slots(claim("a"))
    assert await store.acquire_slots(claim("c")) == (True, (1,))
    clock.advance(9)
    assert await store.renew_slots(claim("b"))  # b's lease now ends 10 s from here
    clock.advance(9)  # c's lease ended; b's did not
    assert await store.acquire_slots(claim("d")) == (True, (1,))
    assert not await store.renew_slots(claim("c"))  # c's slot went to d
    assert await store.acquire_slots(claim("e")) == (False, (2,))
    await store.release_slots(claim("zz"))  # a token that holds nothing: nothing happens


async def test_a_take_that_arrives_after_its_revoking_give_back_takes_nothing(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    """A give-back with ``revoke`` (its take failed or its caller left before the answer)
    may reach the store before the take itself: that take then takes nothing."""
    store = make_backend(FakeClock())
    claim = functools.partial(claim_in, namespace=namespace)
    await store.release_slots(claim("late"), revoke=True)  # overtook its own take
    assert await store.acquire_slots(claim("late")) == (False, (0,))
    assert await store.acquire_slots(claim("other")) == (True, (0,))
    await store.release_slots(claim("other"), revoke=True)  # after its take: given back
    assert await store.acquire_slots(claim("next")) == (True, (0,))
    await store.release_slots(claim("next"))  # a plain give-back revokes nothing
    assert await store.acquire_slots(claim("next")) == (True, (0,))


async def test_a_claim_on_several_identifiers_takes_all_or_none(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    store = make_backend(FakeClock())
    user = Identifier(namespace, "k", "user", "u")
    everyone = Identifier(namespace, "k", None, None)

    def both(token: str) -> SlotClaim:
        return SlotClaim(namespace, "k", (user, everyone), (1, 3), token, 10_000_000)

    def alone(token: str) -> SlotClaim:
        return SlotClaim(namespace, "k", (everyone,), (3,), token, 10_000_000)

    assert await store.acquire_slots(both("a")) == (True, (0, 0))
    assert await store.acquire_slots(both("b")) == (False, (1, 1))  # the user's one is held
    assert await store.acquire_slots(alone("c")) == (True, (1,))  # b took nothing
    assert await store.acquire_slots(alone("d")) == (True, (2,))
    assert await store.acquire_slots(alone("e")) == (False, (3,))  # a, c and d hold them
    await store.release_slots(both("a"))  # both of a's slots come back
    assert await store.acquire_slots(both("b")) == (True, (0, 2))
    assert await store.acquire_slots(alone("e")) == (False, (3,))


# --- the front end ---


async def test_at_most_n_bodies_run_and_the_rest_are_refused() -> None:
    rl = RateLimit.from_url("memory://")
    running, peak, started = 0, 0, asyncio.Event()
    release = asyncio.Event()

    @rl.concurrency("user:3", user=lambda: "ann")
    async def body() -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            started.set()
        await release.wait()
        running -= 1
        return "done"

    tasks = [asyncio.create_task(body()) for _ in range(3)]
    await started.wait()
    with pytest.raises(ConcurrencyLimitExceeded, match="by 'user:3' \\(3 running\\)") as refused:
        await body()
    assert isinstance(refused.value, RateLimitExceeded)
    assert refused.value.limit == SlotLimit(3, "user")
    release.set()
    assert await asyncio.gather(*tasks) == ["done"] * 3
    assert await body() == "done"  # every slot came back
    assert peak == 3


async def test_a_slot_comes_back_on_exception_and_on_cancellation() -> None:
    rl = RateLimit.from_url("memory://")
    slots = rl.concurrency("1", key="one")
    with pytest.raises(ValueError, match="boom"):
        async with slots:
            raise ValueError("boom")
    entered = asyncio.Event()

    async def holds() -> None:
        async with slots:
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(holds())
    await entered.wait()
    with pytest.raises(ConcurrencyLimitExceeded):
        async with slots:
            pass
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with slots as decision:  # the cancelled holder gave it back
        assert decision.allowed
        assert decision.remaining == 0


async def test_a_waiting_call_gets_the_slot_a_body_gives_back() -> None:
    rl = RateLimit.from_url("memory://")
    order: list[str] = []
    gate = asyncio.Event()

    @rl.concurrency("1", key="queue", wait=30)
    async def body(name: str) -> None:
        order.append(f"start {name}")
        if name == "first":
            await gate.wait()
        order.append(f"end {name}")

    first = asyncio.create_task(body("first"))
    await asyncio.sleep(0)  # let it take the slot
    second = asyncio.create_task(body("second"))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, second)
    assert order == ["start first", "end first", "start second", "end second"]
    assert rl.concurrency("1", key="queue", wait=0.01)._wait == 0.01


def test_a_body_longer_than_its_lease_keeps_its_slot() -> None:
    """In a loop with its own clock (no real time passes): the lease is renewed every third
    of it while the body runs, and the slot frees when the body ends."""

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        rl = RateLimit(MemoryBackend(clock=loop.time))
        slots = rl.concurrency("1", key="long", lease=1.0)
        done = asyncio.Event()

        async def long_body() -> None:
            async with slots:
                await asyncio.sleep(10)  # ten leases
            done.set()

        task = asyncio.create_task(long_body())

        seen = []
        for _ in range(9):
            await asyncio.sleep(1.0)
            seen.append(await enters(slots))
        await done.wait()
        await task
        seen.append(await enters(slots))
        return seen

    assert run_virtual(main) == [False] * 9 + [True]


def test_a_dead_holders_slot_frees_after_its_lease() -> None:
    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        backend = MemoryBackend(clock=loop.time)
        rl = RateLimit(backend, "slots")  # the claim's namespace
        dead = claim_in("dead", count=1, lease=2.0)  # taken, never renewed nor given back
        assert (await backend.acquire_slots(dead))[0]
        slots = rl.concurrency("user:1", key="k", user="u", lease=2.0)

        await asyncio.sleep(1.9)
        before = await enters(slots)
        await asyncio.sleep(0.2)
        after = await enters(slots)
        return before, after

    assert run_virtual(main) == (False, True)


async def test_bad_limits_fail_when_made() -> None:
    rl = RateLimit.from_url("memory://")
    with pytest.raises(RuleSyntaxError, match="a span \\('/s'\\) belongs to rate rules"):
        rl.concurrency("user:5/s")
    with pytest.raises(RuleSyntaxError, match="count must be an integer from 1"):
        rl.concurrency("user:0")
    with pytest.raises(ConfigurationError, match="lease must be seconds"):
        rl.concurrency("5", lease=0)
    with pytest.raises(ConfigurationError, match="wait must be seconds"):
        rl.concurrency("5", wait=-1)
    with pytest.raises(ConfigurationError, match="holds no concurrency slots"):
        RateLimit(FailingBackend()).concurrency("5")
    with pytest.raises(TypeError, match="generator function .*stream: the slot would be given"):

        @rl.concurrency("5")
        async def stream() -> Any:
            yield 1

    assert parse_slots("user:5 | 100") == (SlotLimit(5, "user"), SlotLimit(100))
    assert str(SlotLimit(5, "user")) == "user:5"


async def test_no_selector_value_no_limit_and_a_failing_store_follows_on_error() -> None:
    rl = RateLimit.from_url("memory://")
    async with rl.concurrency("user:1", user=None) as decision:
        assert decision.remaining is None
        async with rl.concurrency("user:1", user=None):
            pass  # nothing limits a call whose selector has no value

    class Down(FailingBackend):
        async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
            raise BackendError("storage down")

        async def renew_slots(self, claim: SlotClaim) -> bool:
            raise BackendError("storage down")

        async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
            raise BackendError("storage down")

    from ratelimit import BackendError

    async with RateLimit(Down()).concurrency("1") as decision:
        assert decision.degraded  # fail-open: the body runs, holding nothing
    with pytest.raises(ConcurrencyLimitExceeded, match="on_error='deny'"):
        async with RateLimit(Down(), on_error="deny").concurrency("1"):
            pass
    with pytest.raises(BackendError):
        async with RateLimit(Down(), on_error="raise").concurrency("1"):
            pass


async def test_closing_the_limiter_under_a_running_body_ends_it_quietly() -> None:
    rl = RateLimit.from_url("memory://")
    async with rl.concurrency("1", key="closing") as decision:
        await rl.aclose()
    assert decision.allowed  # leaving the block raised nothing
    with pytest.raises(LimiterClosedError):
        async with rl.concurrency("1", key="closing"):
            pass


async def test_slots_and_rates_stack_on_one_function() -> None:
    rl = RateLimit.from_url("memory://", denial_cache=0)

    @rl.concurrency("user:1", user=lambda: "ann")
    @rl.limit("user:2/m", user=lambda: "ann")
    async def export() -> str:
        return "csv"

    assert [await export(), await export()] == ["csv", "csv"]
    with pytest.raises(RateLimitExceeded) as refused:
        await export()  # the rate refuses; the slot it held for the call came back
    assert not isinstance(refused.value, ConcurrencyLimitExceeded)
    assert (await rl.storage.acquire_slots(claim_in("x", 1)))[0]  # type: ignore[attr-defined]


# --- several OS processes on a real Redis ---


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.parametrize("engine", ["script", "locked"])
async def test_four_processes_never_run_a_sixth_body(
    redis_client: aioredis.Redis, redis_url: str, namespace: str, engine: str
) -> None:
    outputs = await run_workers(
        redis_client, namespace, "tests.slots_worker", redis_url, namespace, "50", engine
    )
    results = [[int(n) for n in out.split()] for out in outputs]
    peak = max(r[0] for r in results)
    ran = sum(r[1] for r in results)
    refused = sum(r[2] for r in results)
    waited = sum(r[3] for r in results)
    assert peak <= 5, f"{peak} bodies ran at once under a limit of 5"
    assert ran + refused == 200  # the first round: each call once, no waiting
    assert refused > 0
    assert waited == 200  # the second round: every call waited for its slot and ran
    assert not await redis_client.exists(f"rl:{{{namespace}:shared}}:c")  # all given back


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.parametrize("engine", ["script", "locked"])
async def test_a_cancellation_storm_leaves_no_slot_held(
    redis_client: aioredis.Redis, redis_url: str, namespace: str, engine: str
) -> None:
    """4 processes x 20 callers (10 on the locked engine) x 30 calls on
    ``concurrency("5", wait=2)``, every other call cancelled 0 to 10 ms in (while it takes
    its slot, waits for one, or runs). Once every process has closed its limiter and
    exited, no slot may be held: a give-back that reached Redis before its own take (on
    another connection) left that take holding a slot for the whole lease (30 s)."""
    callers = 20 if engine == "script" else 10  # every try of the locked one takes the lock
    outputs = await run_workers(
        redis_client, namespace, "tests.slots_worker", redis_url, namespace, str(callers),
        f"storm-{engine}",
    )  # fmt: skip
    counts = [[int(n) for n in out.split()] for out in outputs]
    ran, cancelled, refused = (sum(column) for column in zip(*counts, strict=True))
    assert ran + cancelled + refused == 4 * callers * 30
    assert ran > 0
    assert cancelled > 0
    held = await redis_client.zrange(f"rl:{{{namespace}:storm}}:c", 0, -1, withscores=True)
    assert held == [], f"{len(held)} slots still held after every process exited"


@pytest.mark.long
@pytest.mark.redis
def test_a_killed_holders_slots_come_back_after_the_lease(redis_url: str) -> None:
    namespace = f"slots-{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.slots_worker", redis_url, namespace, "5", "hold"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding 5"
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)

        async def after_kill() -> tuple[bool, float]:
            client = aioredis.Redis.from_url(redis_url)
            async with RateLimit(client, namespace) as rl:
                slots = rl.concurrency("5", key="held", lease=1.0)
                refused = False
                try:
                    async with slots:
                        pass
                except ConcurrencyLimitExceeded:
                    refused = True  # the dead process's leases still run
                started = time.monotonic()
                async with rl.concurrency("5", key="held", wait=30):
                    waited = time.monotonic() - started
            await client.aclose()
            return refused, waited

        refused, waited = asyncio.run(after_kill())
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
    assert refused
    assert waited < 20  # the lease is 1 s: its slots came back, not the 30 s wait's end


@pytest.mark.redis
async def test_slots_take_the_lock_even_with_disable_locks(redis_url: str) -> None:
    """``disable_locks=True`` trades a bounded overshoot of rate limits for speed; slots
    are a hard cap, so their read-then-write still runs under the lock. 40 concurrent takes
    of ``concurrency("5")`` hold at most 5 at once."""
    client = aioredis.Redis.from_url(redis_url)
    rl = RateLimit(client, f"nolock-{uuid.uuid4().hex[:8]}", use_scripts=False, disable_locks=True)
    entered, refused, peak, running = 0, 0, 0, 0
    release, settled = asyncio.Event(), asyncio.Event()

    def settle() -> None:
        if entered + refused == 40:
            settled.set()

    @rl.concurrency("5")
    async def body() -> None:
        nonlocal entered, running, peak
        entered += 1
        running += 1
        peak = max(peak, running)
        settle()
        await release.wait()
        running -= 1

    async def one() -> None:
        nonlocal refused
        try:
            await body()
        except ConcurrencyLimitExceeded:
            refused += 1
            settle()

    tasks = [asyncio.create_task(one()) for _ in range(40)]
    await asyncio.wait_for(settled.wait(), 60)
    release.set()
    await asyncio.gather(*tasks)
    assert (entered, refused, peak) == (5, 35, 5)
    await rl.aclose()
    await client.aclose()
