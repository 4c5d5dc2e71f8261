"""The red team's tries at the direct path (``ratelimit/front/direct.py``,
``backends/memory/admit.py``): each compares a decorated call decided the direct way with the
same call decided the general way (``Limit._direct`` answering ``None``: the path of the code
before it), on the same sequence of calls, clock steps, overrides, resets, peeks and settles,
and asks for the same answers and the same counters. None of them found a difference; they
stay as the differential tests of the direct path."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis

from ratelimit import (
    BackendError,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
    RedisCommandBackend,
    RedisScriptBackend,
)
from ratelimit.errors import LimiterClosedError, SelectorNotFoundError
from ratelimit.front.limit import Limit
from tests.conftest import FakeClock, run_virtual, selecting
from tests.redis_server import free_port

Outcome = object
Work = Callable[..., Awaitable[Any]]


def general_only(limit: Limit, monkeypatch: pytest.MonkeyPatch) -> Limit:
    """``limit`` deciding every decorated call the general way (the code before the direct
    path)."""
    monkeypatch.setattr(limit, "_direct", lambda key, parameters: (None, None, None))
    return limit


async def outcome(work: Work, *args: Any, **kwargs: Any) -> Outcome:
    """What one call came to: its result, the refusal (rule, retry_after) or the error."""
    try:
        return await work(*args, **kwargs)
    except RateLimitExceeded as exc:
        return ("refused", exc.decision.rule, round(exc.decision.retry_after, 6))
    except (TypeError, ValueError, BackendError) as exc:
        return (type(exc).__name__, str(exc))


RULES = [
    "user:3/m",
    "user:2/s",
    "user:4/10s",
    "user:2/s burst 4",
    "user:3/m, user:5/h",
    "user:5/m | region:2/m",
    "user:2/m & region:3/m",
    "user:2/m | (user:5/m & region:3/m)",
    "3/m",
    "user:300 tokens/m",
    "user:3/m & user:300 tokens/m",
]
COSTS: list[Any] = [1, 1, 2, {"tokens": 40}, {"tokens": 100}]
VALUES: list[Any] = ["ann", "bob", 7, "7", b"7", None, "", 7.0, True, ["l"], {"d": 1}]
STEPS = [0.1, 0.5, 1, 5, 30, 61, -0.5, -3, -61, 0.000001]


async def scripted(seed: int, general: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """One random script of calls on ``memory://`` (fake clock): what each came to, and the
    store's counters after it."""
    chance = random.Random(seed)
    clock = FakeClock()
    algorithm = chance.choice(["sliding-log", "gcra", "sliding-window", "fixed-window"])
    rules = chance.choice(RULES)
    if "burst" in rules and algorithm != "gcra":
        rules = "user:2/s"
    cost = chance.choice(COSTS)
    backend = MemoryBackend(clock=clock)
    rl = RateLimit(backend, "red", algorithm=algorithm)
    limit: Any
    try:
        limit = rl.limit(rules, key="k", cost=cost, shadow=chance.random() < 0.1)
    except Exception as exc:  # a cost these rules cannot count: said alike either way
        await rl.aclose()
        return (type(exc).__name__,)
    if general:
        general_only(limit, monkeypatch)

    async def body(user: Any = None, region: Any = "eu", *rest: Any, **more: Any) -> int:
        return 1

    work: Work = limit(body)

    values = selecting(rules, user="ann", region="eu")
    settling = rl.limit(rules, key="k", settle=lambda used: used, **values)
    peeking = rl.limit(rules, key="k", **values)
    seen: list[Outcome] = []
    for _ in range(100):
        step = chance.random()
        if step < 0.1:
            clock.advance(chance.choice(STEPS))
        elif step < 0.13:
            user = chance.choice(["ann", "bob", "7"])
            if chance.random() < 0.5:
                new = chance.choice(["user:1/m", "user:6/m", "user:1/s"])
                await rl.overrides.set("k", new, user=user)
            else:
                await rl.overrides.delete("k", user=user)
        elif step < 0.15:
            await peeking.reset()
        elif step < 0.17:
            try:
                decision = await settling.decide()
            except Exception as exc:  # a unit cost the settling limit cannot count
                seen.append(type(exc).__name__)
                continue
            if decision.allowed:
                await settling.settle(decision, chance.choice([0, 3, 6]))
            seen.append(("other", decision.allowed))
        elif step < 0.19:
            peeked = await peeking.peek()
            seen.append(("peek", peeked.allowed, round(peeked.retry_after, 6)))
        else:
            user, region = chance.choice(VALUES), chance.choice(VALUES)
            form = chance.randrange(4)
            if form == 0:
                seen.append(await outcome(work, user))
            elif form == 1:
                seen.append(await outcome(work, user, region))
            elif form == 2:
                seen.append(await outcome(work, user=user, region=region))
            else:
                seen.append(await outcome(work, user, region=region))
    state = (backend.logs(), backend.arrivals(), backend.counters())
    await rl.aclose()
    return algorithm, rules, seen, state


@pytest.mark.parametrize("seed", range(0, 240, 8))
async def test_random_scripts_come_out_the_same_either_way(
    seed: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls of odd values (ints, bytes, ``None``, ``""``, unhashable ones), every algorithm,
    unit rules and cost mappings, overrides set and deleted later, resets, peeks, a settle's
    excess from another limit on the same identifiers, the clock stepping both ways."""
    for one in range(seed, seed + 8):
        direct = await scripted(one, False, monkeypatch)
        general = await scripted(one, True, monkeypatch)
        assert direct == general, f"seed {one}"


SIGNATURES = [
    "(user)",
    "(user, region='eu')",
    "(user='anon')",
    "(user, /)",
    "(user, /, region='eu')",
    "(user, /, **more)",
    "(user=None, /, **more)",
    "(user, *args)",
    "(user, *args, **more)",
    "(user, *, region)",
    "(user, *, region='eu')",
    "(self, user)",
    "(a, user, /, b=1, *c, region='x', **d)",
    "(user, region, /)",
    "(region, user='z', *rest)",
    "(*, user)",
    "(**user)",
    "(*user)",
    "(a=1, user=2, /)",
]
TREES = ["user:2/m", "user:2/m & region:3/m", "user:3/m | region:1/m", "4/m", "region:2/m"]


async def signed(seed: int, general: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    chance = random.Random(seed)
    signature, rules = chance.choice(SIGNATURES), chance.choice(TREES)
    namespace: dict[str, Any] = {}
    exec(f"async def work{signature}:\n    return 1", namespace)
    backend = MemoryBackend(clock=FakeClock())
    rl = RateLimit(backend, "red")
    limit = rl.limit(rules, key="k")
    if general:
        general_only(limit, monkeypatch)
    try:
        work: Work = limit(namespace["work"])
    except SelectorNotFoundError as exc:  # no call could give it: refused when decorating
        await rl.aclose()
        return signature, rules, str(exc)
    seen = []
    for _ in range(40):
        args = tuple(chance.choice(VALUES) for _ in range(chance.randrange(4)))
        names = chance.sample(["user", "region", "a", "b", "more", "zz"], chance.randrange(3))
        kwargs = {name: chance.choice(VALUES) for name in names}
        try:
            seen.append(await outcome(work, *args, **kwargs))
        except Exception as exc:  # SelectorNotFoundError and such: the same either way
            seen.append((type(exc).__name__, str(exc)))
    counted = sorted((str(i), len(hits)) for i, hits in backend.logs().items())
    await rl.aclose()
    return signature, rules, seen, counted


@pytest.mark.parametrize("seed", range(0, 200, 20))
async def test_every_signature_and_way_of_calling_counts_on_the_same_identifiers(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defaults, positional-only and keyword-only parameters, ``*args``/``**kwargs``, a
    selector named like ``*args``/``**kwargs``, calls that cannot bind: the same results, the
    same errors, the same identifiers counted."""
    for one in range(seed, seed + 20):
        assert await signed(one, False, monkeypatch) == await signed(one, True, monkeypatch)


async def test_odd_values_name_the_identifiers_the_general_path_names() -> None:
    backend = MemoryBackend()
    rl = RateLimit(backend, "red")

    @rl.limit("user:1/m", key="odd")
    async def work(user: Any) -> None: ...

    class Named:
        def __str__(self) -> str:
            return "named"

    for value in [7, b"bytes", Named(), ["unhashable"], {"a": 1}, 1.5, False]:
        await outcome(work, value)
        peeked = await rl.limit("user:1/m", key="odd", user=value).peek()
        assert not peeked.allowed, value  # counted on the identifier of its text
    for value in [None, ""]:  # no value: not limited, nothing counted
        assert [await outcome(work, value) for _ in range(3)] == [None] * 3
    assert len(backend) == 7


async def test_methods_classmethods_and_partials_count_on_their_argument() -> None:
    import functools

    rl = RateLimit(MemoryBackend(), "red")

    class Shop:
        @rl.limit("user:1/m", key="method")
        async def buy(self, user: str) -> str:
            return user

        @classmethod
        @rl.limit("user:1/m", key="class")
        async def sell(cls, user: str) -> str:
            return user

    async def rent(user: str, region: str) -> str:
        return region

    rented = rl.limit("region:1/m", key="partial")(functools.partial(rent, region="eu"))
    shop = Shop()
    assert await outcome(shop.buy, "ann") == "ann"
    assert await outcome(shop.buy, "bob") == "bob"  # not the instance: the argument
    assert await outcome(Shop.sell, "ann") == "ann"
    assert await outcome(rented, "ann") == "eu"
    assert await outcome(rented, "ann", region="us") == "us"
    again = [
        await outcome(shop.buy, user="ann"),
        await outcome(shop.sell, "ann"),
        await outcome(rented, "bob"),
        await outcome(rented, "bob", region="us"),
    ]
    assert [isinstance(r, tuple) and r[0] for r in again] == ["refused"] * 4


@pytest.mark.parametrize("algorithm", ["sliding-log", "gcra", "sliding-window"])
def test_threads_with_loops_of_their_own_on_one_memory_store_admit_exactly_the_count(
    algorithm: str,
) -> None:
    rl = RateLimit(MemoryBackend(), "red", algorithm=algorithm)

    @rl.limit("user:200/h")
    async def work(user: str) -> None: ...

    admitted: list[int] = []

    def calls() -> None:
        async def main() -> int:
            results = [await outcome(work, ("ann", "bob")[n % 2]) for n in range(400)]
            return results.count(None)

        admitted.append(asyncio.run(main()))

    threads = [threading.Thread(target=calls) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 400  # 200 each for ann and bob, of 2400 calls


def test_an_override_another_limiter_sets_reaches_the_direct_path_within_the_refresh() -> None:
    async def main() -> list[Any]:
        backend = MemoryBackend()
        mine = RateLimit(backend, "red", override_refresh=1.0)
        theirs = RateLimit(backend, "red", override_refresh=1.0)

        @mine.limit("user:5/m", key="search")
        async def work(user: str) -> None: ...

        seen = [await outcome(work, "ann") for _ in range(2)]
        await theirs.overrides.set("search", "user:2/m", user="ann")
        await asyncio.sleep(2.5)  # virtual time: two readings of the refresh task
        seen += [await outcome(work, "ann") for _ in range(2)]
        await theirs.overrides.delete("search", user="ann")
        await asyncio.sleep(2.5)
        seen += [await outcome(work, "ann") for _ in range(3)]
        await mine.aclose()
        await theirs.aclose()
        return [s is None for s in seen]

    assert run_virtual(main) == [True, True, False, False, True, True, True]


@pytest.mark.parametrize("engine", [RedisScriptBackend, RedisCommandBackend])
@pytest.mark.parametrize("on_error", ["allow", "deny", "raise"])
async def test_a_dead_redis_is_answered_by_the_failure_policy_as_the_general_path_does(
    engine: type[RedisScriptBackend] | type[RedisCommandBackend],
    on_error: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    answers: list[tuple[list[Any], bool, int]] = []
    for general in (False, True):
        client = aioredis.Redis.from_url(url, socket_connect_timeout=0.5)
        rl = RateLimit(engine(client), "red", on_error=on_error)
        limit = rl.limit("user:5/m")
        if general:
            general_only(limit, monkeypatch)

        @limit
        async def work(user: str) -> str:
            return "ran"

        seen = [await outcome(work, "ann") for _ in range(2)]
        answers.append((seen, rl.storage_failing, rl.cached_refusals))
        await rl.aclose()
        await client.aclose()
    assert answers[0] == answers[1]
    expected = {"allow": "ran", "deny": "refused", "raise": "BackendError"}[on_error]
    first = answers[0][0][0]
    assert (first if isinstance(first, str) else first[0]) == expected


async def test_expired_identifiers_stay_fewer_than_those_held_after_the_last_sweep() -> None:
    """The sweep comes every ``max(sweep_every, identifiers held)`` decisions: a stream of
    short-lived identifiers beside many long-lived ones leaves at most as many expired ones
    held as there were identifiers after the last sweep: bounded, at twice the live ones
    (here 4198 held at most; the sweep every ``sweep_every`` decisions before it: 2199)."""
    clock = FakeClock()
    backend = MemoryBackend(clock=clock, sweep_every=100)
    rl = RateLimit(backend, "red", denial_cache=0)

    @rl.limit("user:5/d")
    async def daily(user: str) -> None: ...

    @rl.limit("user:5/s")
    async def brief(user: str) -> None: ...

    for n in range(2000):
        await daily(f"long{n}")
    most = 0
    for n in range(8000):
        clock.advance(0.01)  # 100 a second, each alive 1 s: about 100 alive at once
        await brief(f"short{n}")
        most = max(most, len(backend))
    alive = 2000 + 101
    assert most <= 2 * alive  # the live ones, and as many expired at most


@pytest.mark.parametrize("overridden", [1, 3])
@pytest.mark.parametrize(
    ("own", "overriding"), [("user:5/m", "user:2/m"), ("user:2/m", "user:5/m")]
)
async def test_a_gcra_rate_an_override_changed_is_rescaled_on_the_direct_path(
    own: str, overriding: str, overridden: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrival times stored under an override's rate, read by the limit's own rules once it
    is deleted: carried on as the general path carries them (``gcra_rescaled``)."""
    answers = []
    for general in (False, True):
        clock = FakeClock()
        rl = RateLimit(MemoryBackend(clock=clock), "red", algorithm="gcra")
        limit = rl.limit(own, key="rescale")
        if general:
            general_only(limit, monkeypatch)

        @limit
        async def work(user: str) -> None: ...

        await rl.overrides.set("rescale", overriding, user="ann")
        seen = [await outcome(work, "ann") for _ in range(overridden)]
        await rl.overrides.delete("rescale", user="ann")
        for _ in range(3):
            seen += [await outcome(work, "ann") for _ in range(4)]
            clock.advance(7)
        answers.append((seen, rl.storage.arrivals()))  # type: ignore[attr-defined]
        await rl.aclose()
    assert answers[0] == answers[1]


@pytest.mark.parametrize("engine", [RedisScriptBackend, RedisCommandBackend])
async def test_a_limiter_closed_over_a_client_still_open_refuses_decorated_calls(
    engine: type[RedisScriptBackend] | type[RedisCommandBackend],
) -> None:
    """The store (a client the caller owns) still answers after the limiter closed: the
    direct path must not ask it."""
    client = fakeredis.FakeAsyncRedis()
    rl = RateLimit(engine(client), "red")

    @rl.limit("user:5/m")
    async def work(user: str) -> str:
        return user

    assert await work("ann") == "ann"
    await rl.aclose()
    with pytest.raises(LimiterClosedError):
        await work("ann")
    await client.aclose()


@pytest.mark.parametrize("algorithm", ["sliding-log", "gcra", "sliding-window", "fixed-window"])
def test_waiting_and_shadow_on_the_direct_path_come_out_as_on_the_general_path(
    algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refusals the store gives the direct path, remembered (under the general path's
    ``CallKey``), waited out under ``wait=`` or let through under ``shadow``, concurrently."""

    def scenario(general: bool) -> list[Any]:
        random.seed(5)  # the waits' jitter, alike for both

        async def main() -> list[Any]:
            loop = asyncio.get_running_loop()
            backend = MemoryBackend(clock=loop.time)
            rl = RateLimit(backend, "red", algorithm=algorithm)
            waiting = rl.limit("user:2/s", wait=1.6, key="waiting")
            shadowed = rl.limit("user:1/s", shadow=True, key="shadowed")
            if general:
                general_only(waiting, monkeypatch)
                general_only(shadowed, monkeypatch)

            async def body(user: str) -> float:
                return round(loop.time(), 4)

            wait: Work = waiting(body)
            shadow: Work = shadowed(body)
            await rl.limit("9/s", key="warm").decide()  # the overrides read: direct from here
            calls = [outcome(wait, user) for user in ["ann"] * 7 + ["bob"] * 3]
            seen = list(await asyncio.gather(*calls))
            seen += [await outcome(shadow, "ann") for _ in range(3)]
            seen.append(rl.cached_refusals)
            seen.append((backend.logs(), backend.arrivals(), backend.counters()))
            await rl.aclose()
            return seen

        return run_virtual(main)

    assert scenario(False) == scenario(True)
