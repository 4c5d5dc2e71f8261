"""Overrides (``rl.overrides``): rules of a key replaced at run time for some callers, kept
in the store, on every store (memory, Redis with both engines, PostgreSQL), seen by other
limiters within ``override_refresh`` and by another OS process at its next decisions."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratelimit import (
    ConfigurationError,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
    RedisCommandBackend,
    RedisScriptBackend,
    RuleSyntaxError,
)
from ratelimit.backends.postgres import PostgresBackend
from ratelimit.backends.redis.overrides import overrides_key
from ratelimit.overrides.cache import Override, OverrideCache, encode, override_id
from tests.conftest import FakeClock
from tests.workers import ROOT

pytestmark = pytest.mark.timeout(60)

STORES = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-commands", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
Maker = Callable[..., RateLimit]


@pytest.fixture(params=STORES)
async def make(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[Maker]:
    """``make(clock=None, **settings)``: limiters of one namespace on one store kind, each
    with its own connection (as separate processes have), sharing one memory backend."""
    kind: str = request.param
    made: list[RateLimit] = []
    memory: list[MemoryBackend] = []

    def factory(clock: Callable[[], float] | None = None, **settings: Any) -> RateLimit:
        backend: Any
        algorithm = "sliding-log"
        if kind == "memory":
            if not memory:
                memory.append(MemoryBackend(clock=clock))
            backend = memory[0]
        elif kind == "postgres":
            backend = PostgresBackend(request.getfixturevalue("postgres_url"), clock=clock)
            algorithm = "sliding-window"
        else:
            client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
            engine = RedisCommandBackend if kind == "redis-commands" else RedisScriptBackend
            backend = engine(client, clock=clock, owns_client=True)
        settings.setdefault("algorithm", algorithm)
        limiter = RateLimit(backend, namespace, **settings)
        made.append(limiter)
        return limiter

    yield factory
    for limiter in made:
        if kind != "memory" or limiter is made[-1]:
            await limiter.aclose()


async def admitted(limit: Any, calls: int) -> int:
    """How many of ``calls`` decisions ``limit`` admits."""
    return sum([(await limit.decide()).allowed for _ in range(calls)])


async def test_set_get_list_delete(make: Maker, clock: FakeClock) -> None:
    rl = make(clock)
    assert await rl.overrides.list() == []
    done = await rl.overrides.set("search", "apikey:1000/h", apikey="abc", ttl=60)
    assert (done.key, done.values, done.rules) == ("search", (("apikey", "abc"),), "apikey:1000/h")
    assert done.expires == clock.now + 60
    assert await rl.overrides.get("search", apikey="abc") == done
    assert await rl.overrides.get("search", apikey="xyz") is None
    every = await rl.overrides.set("search", "50/s")  # no values: every call of the key
    other = await rl.overrides.set("login", "user:1/m", user="eve")
    assert await rl.overrides.list() == [other, every, done]
    assert await rl.overrides.list("search") == [every, done]
    assert await rl.overrides.delete("search", apikey="abc") is True
    assert await rl.overrides.delete("search", apikey="abc") is False
    assert await rl.overrides.list("search") == [every]


async def test_an_override_applies_and_counters_carry_on(make: Maker, clock: FakeClock) -> None:
    rl = make(clock)
    limit = rl.limit("apikey:2/m", key="search", apikey="abc")
    assert await admitted(limit, 1) == 1
    await rl.overrides.set("search", "apikey:5/m", apikey="abc")
    decision = await limit.decide()
    assert decision.allowed
    assert decision.override
    assert str(decision.rule) == "apikey:5/m"
    assert decision.remaining == 3  # 2 counted of 5, on the same counter
    assert await admitted(limit, 10) == 3  # 5 in all, not 5 more
    refused = await limit.decide()
    assert not refused.allowed
    assert refused.override
    other = rl.limit("apikey:2/m", key="search", apikey="xyz")  # another caller: own rules
    decision = await other.decide()
    assert not decision.override
    assert str(decision.rule) == "apikey:2/m"
    await rl.overrides.delete("search", apikey="abc")
    back = await limit.decide()
    assert not back.override
    assert not back.allowed


async def test_a_decorated_call_under_an_override_raises_with_its_rule(
    make: Maker, clock: FakeClock
) -> None:
    rl = make(clock)

    @rl.limit("apikey:5/m", key="search")
    async def search(apikey: str) -> str:
        return apikey

    await rl.overrides.set("search", "apikey:1/m", apikey="abc")
    assert await search("abc") == "abc"
    with pytest.raises(RateLimitExceeded) as refused:
        await search("abc")
    assert refused.value.decision.override
    assert str(refused.value.rule) == "apikey:1/m"
    assert await search("xyz") == "xyz"


async def overridden(limit: Any, wanted: bool) -> None:
    """Decide with ``limit`` until its decisions say ``override`` is ``wanted``: another
    limiter's task reads the store every ``override_refresh`` seconds (real ones here); the
    deadline is a margin, never the claim."""
    deadline = time.monotonic() + 20
    while (await limit.decide()).override is not wanted:
        assert time.monotonic() < deadline, "the change never reached the other limiter"
        await asyncio.sleep(0.01)  # another limiter's task reads the store meanwhile


async def test_another_limiter_applies_a_change_by_its_own_task(
    make: Maker, clock: FakeClock
) -> None:
    setter, other = make(clock), make(clock, override_refresh=0.05)
    limit = other.limit("apikey:1000/m", key="search", apikey="abc")
    assert not (await limit.decide()).override  # its first decision read the store
    await setter.overrides.set("search", "apikey:900/m", apikey="abc")
    await overridden(limit, True)
    await setter.overrides.delete("search", apikey="abc")
    await overridden(limit, False)


async def test_decisions_do_not_ask_the_store_but_the_first(make: Maker, clock: FakeClock) -> None:
    setter, other = make(clock), make(clock, override_refresh=60)
    store: Any = other.storage
    asked: list[str] = []
    version = store.overrides_version

    async def counted(namespace: str) -> int:
        asked.append(namespace)
        return int(await version(namespace))

    store.overrides_version = counted
    limit = other.limit("apikey:2/m", key="search", apikey="abc")
    assert not (await limit.decide()).override
    await setter.overrides.set("search", "apikey:9/m", apikey="abc")
    for _ in range(5):
        assert not (await limit.decide()).override  # the copy: read once, a minute ago
    assert len(asked) == 1
    await other.overrides.refresh()  # now
    assert (await limit.decide()).override


async def test_a_reset_lifts_every_limiters_cached_refusals(make: Maker, clock: FakeClock) -> None:
    resetter, other = make(clock), make(clock, override_refresh=60)
    limit = other.limit("apikey:2/m", key="search", apikey="abc")
    assert [(await limit.decide()).allowed for _ in range(3)] == [True, True, False]
    assert other.cached_refusals == 1
    await resetter.limit("apikey:2/m", key="search", apikey="abc").reset()
    assert not (await limit.decide()).allowed  # its copy was read a minute ago: cached
    await other.overrides.refresh()  # what its task does every override_refresh
    assert other.cached_refusals == 0
    assert (await limit.decide()).allowed


def test_a_reset_lifts_the_cached_refusals_of_a_threaded_limiter() -> None:
    """The sync API decides on a denial cache of its own (safe across threads): a reset
    elsewhere lifts its refusals too."""
    import ratelimit.sync

    backend = MemoryBackend()
    with ratelimit.sync.RateLimit(backend, "threads", override_refresh=60) as threaded:
        limit = threaded.limit("apikey:1/m", key="search", apikey="abc")
        assert [limit.decide().allowed for _ in range(2)] == [True, False]
        assert threaded.limiter.cached_refusals == 1

        async def reset() -> None:
            resetter = RateLimit(backend, "threads")
            await resetter.limit("apikey:1/m", key="search", apikey="abc").reset()

        asyncio.run(reset())
        threaded.portal.run(threaded.limiter.overrides.refresh)
        assert threaded.limiter.cached_refusals == 0
        assert limit.decide().allowed


async def test_a_reset_reaches_another_limiter_by_its_own_task(
    make: Maker, clock: FakeClock
) -> None:
    resetter, other = make(clock), make(clock, override_refresh=0.05)
    limit = other.limit("apikey:1/m", key="search", apikey="abc")
    assert [(await limit.decide()).allowed for _ in range(2)] == [True, False]
    await resetter.limit("apikey:1/m", key="search", apikey="abc").reset()
    deadline = time.monotonic() + 20  # a margin, never the claim
    while not (await limit.decide()).allowed:
        assert time.monotonic() < deadline, "the reset never reached the other limiter"
        await asyncio.sleep(0.01)  # its task reads the store meanwhile


async def test_refresh_zero_asks_before_every_decision(make: Maker, clock: FakeClock) -> None:
    setter, other = make(clock), make(clock, override_refresh=0)
    limit = other.limit("apikey:2/m", key="search", apikey="abc")
    assert not (await limit.decide()).override
    await setter.overrides.set("search", "apikey:9/m", apikey="abc")
    assert (await limit.decide()).override


async def test_ttl_expires_without_a_write(make: Maker, clock: FakeClock) -> None:
    rl = make(clock)
    limit = rl.limit("apikey:2/m", key="search", apikey="abc")
    await rl.overrides.set("search", "apikey:9/m", ttl=30, apikey="abc")
    assert (await limit.decide()).override
    clock.advance(29)
    assert (await limit.decide()).override
    clock.advance(1)
    assert not (await limit.decide()).override
    assert await rl.overrides.get("search", apikey="abc") is None
    assert await rl.overrides.list() == []


async def test_expired_overrides_are_pruned_by_the_next_write(
    make: Maker, clock: FakeClock
) -> None:
    rl = make(clock)
    await rl.overrides.set("search", "apikey:9/m", ttl=5, apikey="abc")
    clock.advance(10)
    other = make(clock)  # a process of its own: its first write prunes
    await other.overrides.set("search", "apikey:9/m", apikey="keep")
    store: Any = rl.storage
    _, table = await store.overrides_load(rl.namespace)
    kept = [identity for identity in table if identity.startswith("[")]
    assert kept == ['["search", [["apikey", "keep"]]]']


async def test_the_most_specific_override_wins_then_the_last_set(
    make: Maker, clock: FakeClock
) -> None:
    rl = make(clock)
    limit = rl.limit("apikey:2/m & user:2/m", key="search", apikey="abc", user="bob")
    await rl.overrides.set("search", "apikey:3/m & user:3/m")
    assert str((await limit.peek()).rule).endswith(":3/m")
    clock.advance(1)
    await rl.overrides.set("search", "apikey:4/m & user:4/m", apikey="abc")
    clock.advance(1)
    await rl.overrides.set("search", "apikey:5/m & user:5/m", user="bob")
    assert str((await limit.peek()).rule).endswith(":5/m")  # one value each: set last
    clock.advance(1)
    await rl.overrides.set("search", "apikey:6/m & user:6/m", apikey="abc", user="bob")
    clock.advance(1)
    await rl.overrides.set("search", "apikey:7/m & user:7/m", apikey="abc")
    assert str((await limit.peek()).rule).endswith(":6/m")  # two values beat one
    assert (await rl.overrides.in_force("search", apikey="abc", user="bob")) is not None


async def test_an_override_may_name_another_selector_resolved_from_the_call(
    make: Maker, clock: FakeClock
) -> None:
    rl = make(clock)

    @rl.limit("apikey:100/m", key="export")
    async def export(apikey: str, user: str) -> None: ...

    await rl.overrides.set("export", "user:1/m", apikey="abc")
    await export("abc", "bob")
    with pytest.raises(RateLimitExceeded) as refused:
        await export("abc", "bob")
    assert str(refused.value.rule) == "user:1/m"
    await export("abc", "eve")  # per user, under the override


async def test_an_override_the_limit_cannot_resolve_keeps_its_own_rules(
    make: Maker, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    rl = make(clock)
    limit = rl.limit("apikey:2/m", key="search", apikey="abc")
    await rl.overrides.set("search", "region:9/m", apikey="abc")
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        decision = await limit.decide()
        await limit.decide()
    assert not decision.override
    assert str(decision.rule) == "apikey:2/m"
    warned = [r for r in caplog.records if "not applied" in r.getMessage()]
    assert len(warned) == 1
    assert "region" in warned[0].getMessage()


async def test_tiers_take_overrides_on_their_selector(make: Maker, clock: FakeClock) -> None:
    rl = make(clock)
    tiers = {"free": "apikey:1/m", "pro": "apikey:3/m"}
    limit = rl.limit(tiers, key="search", tier="pro", apikey="abc")
    await rl.overrides.set("search", "apikey:5/m", tier="pro")
    decision = await limit.decide()
    assert decision.override
    assert str(decision.rule) == "apikey:5/m"
    free = rl.limit(tiers, key="search", tier="free", apikey="xyz")
    assert str((await free.decide()).rule) == "apikey:1/m"


async def test_a_unit_cost_needs_the_unit_in_the_override(make: Maker, clock: FakeClock) -> None:
    rl = make(clock)
    limit = rl.limit("apikey:100 tokens/m", key="chat", apikey="abc", cost={"tokens": 10})
    await rl.overrides.set("chat", "apikey:1000 tokens/m", apikey="abc")
    decision = await limit.decide()
    assert decision.override
    assert decision.remaining == 990
    await rl.overrides.set("chat", "apikey:5/m", apikey="abc")  # counts calls, not tokens
    decision = await limit.decide()
    assert not decision.override
    assert str(decision.rule) == "apikey:100 tokens/m"


async def test_bad_overrides_fail_before_anything_is_written(make: Maker) -> None:
    rl = make()
    with pytest.raises(RuleSyntaxError):
        await rl.overrides.set("search", "apikey:10/")
    with pytest.raises(ConfigurationError, match="burst"):
        await rl.overrides.set("search", "apikey:10/m burst 3")
    with pytest.raises(TypeError, match="key"):
        await rl.overrides.set("", "10/m")
    with pytest.raises(ValueError, match="empty"):
        await rl.overrides.set("search", "10/m", apikey="")
    with pytest.raises(ValueError, match="ttl"):
        await rl.overrides.set("search", "10/m", ttl=0)
    with pytest.raises(TypeError, match="ttl"):
        await rl.overrides.set("search", "10/m", ttl="1h")  # type: ignore[arg-type]
    assert await rl.overrides.list() == []


async def test_bursts_are_allowed_under_gcra(make: Maker) -> None:
    rl = make(algorithm="gcra") if "Postgres" not in type(make().storage).__name__ else None
    if rl is None:
        pytest.skip("Postgres decides no gcra")
    done = await rl.overrides.set("search", "apikey:10/m burst 3")
    assert done.rules == "apikey:10/m burst 3"


async def test_known_keys_are_those_a_process_decided(make: Maker, clock: FakeClock) -> None:
    app, operator = make(clock), make(clock)
    await app.limit("10/m", key="search").decide()
    assert not await operator.overrides.known("search")  # told at its next reading
    await app.overrides.refresh()
    assert await operator.overrides.known("search")
    assert not await operator.overrides.known("serach")


def test_override_refresh_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="override_refresh"):
        RateLimit(MemoryBackend(), override_refresh=-1)
    with pytest.raises(ConfigurationError, match="override_refresh"):
        RateLimit(MemoryBackend(), override_refresh=61)


async def test_a_store_without_overrides_says_so() -> None:
    from tests.conftest import FailingBackend

    rl = RateLimit(FailingBackend())
    with pytest.raises(ConfigurationError, match="keeps no overrides"):
        await rl.overrides.set("search", "10/m")
    assert await rl.overrides.find("search", {}) is None


async def test_a_failing_store_leaves_the_copy_and_decisions_go_on(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    rl = RateLimit(MemoryBackend(clock=clock), override_refresh=0)  # a reading per decision
    limit = rl.limit("apikey:2/m", key="search", apikey="abc")
    await rl.overrides.set("search", "apikey:9/m", apikey="abc")
    assert (await limit.decide()).override

    async def down(namespace: str) -> int:
        raise ConnectionError("store down")

    rl.storage.overrides_version = down  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        assert (await limit.decide()).override  # the last copy read stays
    assert any("not refreshed" in r.getMessage() for r in caplog.records)


@pytest.mark.redis
async def test_redis_keeps_one_hash_per_namespace(redis_url: str, namespace: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    rl = RateLimit(client, namespace)
    await rl.overrides.set("search", "apikey:9/m", apikey="abc")
    stored = await client.hgetall(overrides_key(namespace))
    assert stored[b""] == b"1"
    assert b'["search", [["apikey", "abc"]]]' in stored
    await client.aclose()


async def _line(stream: asyncio.StreamReader) -> str:
    return (await asyncio.wait_for(stream.readline(), 30)).decode().strip()


@pytest.mark.long
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "engine",
    [
        pytest.param("script", marks=pytest.mark.redis),
        pytest.param("locked", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
async def test_another_os_process_applies_a_change_at_its_next_decisions(
    engine: str, request: pytest.FixtureRequest
) -> None:
    namespace = f"ov-{uuid.uuid4().hex[:8]}"
    url = request.getfixturevalue("postgres_url" if engine == "postgres" else "redis_url")
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.override_worker",
        url,
        namespace,
        engine,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert worker.stdout is not None
    if engine == "postgres":
        rl = RateLimit.from_url(url, namespace, algorithm="sliding-window")
    else:
        rl = RateLimit.from_url(url, namespace, use_scripts=engine == "script")
    try:
        assert await _line(worker.stdout) == "own apikey:1000/h"
        await rl.overrides.set("search", "apikey:7/h", apikey="abc")
        assert await _line(worker.stdout) == "override apikey:7/h"
        await rl.overrides.delete("search", apikey="abc")
        assert await _line(worker.stdout) == "own apikey:1000/h"
        assert await asyncio.wait_for(worker.wait(), 30) == 0
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
        await rl.aclose()


async def test_the_task_reads_while_decisions_come_and_stops_when_idle() -> None:
    store = MemoryBackend()
    cache = OverrideCache(store, "ns", 1.0, None)
    ticks: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(seconds: float) -> None:
        await ticks.get()  # one interval passes when the test says so

    async def interval() -> None:
        await ticks.put(None)
        for _ in range(20):  # the task's reading: in memory, no I/O to wait for
            await asyncio.sleep(0)

    cache.sleep = sleep
    assert cache.stale()
    await cache.current()  # the first decision: reads, and starts the task
    assert not cache.stale()
    override = Override("k", (("user", "bob"),), "user:9/m")
    await store.overrides_write("ns", override_id("k", override.values), encode(override), None)
    assert not cache.has("k")  # a decision looked: the copy is as read
    await interval()
    assert cache.match("k", {"user": "bob"}) == override  # read by the task
    await interval()  # no decision looked meanwhile: the task stops, reading nothing
    assert cache.stale()
    await store.overrides_write("ns", override_id("k", override.values), None, None)
    await cache.current()  # the next decision reads first
    assert cache.match("k", {"user": "bob"}) is None
    await cache.aclose()
