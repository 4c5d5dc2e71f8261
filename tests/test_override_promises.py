"""Overrides keep the promises of DESIGN §9 on every store (memory, Redis with both engines,
PostgreSQL): the store orders them (never a writer's clock), a limit lowered below a call's
cost refuses it, and announcing the keys a process limits never blocks reading them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.backends.base import ANNOUNCED_FOR
from ratelimit.backends.postgres import PostgresBackend
from ratelimit.backends.redis.overrides import overrides_key
from ratelimit.overrides.cache import (
    ANNOUNCE_AGAIN,
    ANNOUNCED,
    MAX_ANNOUNCED,
    Override,
    OverrideCache,
    encode,
    override_id,
    winner,
)
from tests.conftest import FakeClock
from tests.test_overrides import Maker, admitted, make

__all__ = ["make"]  # the fixture, shared with tests/test_overrides.py

pytestmark = pytest.mark.timeout(60)


async def test_the_last_set_wins_whatever_the_setters_clocks(make: Maker) -> None:
    ahead, behind = FakeClock(), FakeClock()
    behind.advance(-30)  # 30 s of skew between two processes
    first, second = make(ahead), make(behind, override_refresh=0)
    limit = second.limit("apikey:2/m & user:2/m", key="search", apikey="abc", user="bob")
    await first.overrides.set("search", "apikey:3/m & user:3/m", apikey="abc")
    await second.overrides.set("search", "apikey:4/m & user:4/m", user="bob")  # set last
    assert str((await limit.peek()).rule).endswith(":4/m")
    found = await first.overrides.in_force("search", apikey="abc", user="bob")
    assert found is not None
    assert found.rules == "apikey:4/m & user:4/m"


async def test_the_last_set_wins_at_equal_instants(make: Maker, clock: FakeClock) -> None:
    rl = make(clock, override_refresh=0)
    limit = rl.limit("apikey:2/m & user:2/m", key="search", apikey="abc", user="bob")
    await rl.overrides.set("search", "apikey:5/m & user:5/m", user="bob")
    await rl.overrides.set("search", "apikey:6/m & user:6/m", apikey="abc")  # same instant
    assert str((await limit.peek()).rule).endswith(":6/m")
    await rl.overrides.set("search", "apikey:7/m & user:7/m", user="bob")
    assert str((await limit.peek()).rule).endswith(":7/m")
    other = make(clock)  # another process reads the store's order
    found = await other.overrides.in_force("search", apikey="abc", user="bob")
    assert found is not None
    assert found.rules == "apikey:7/m & user:7/m"


ALGORITHMS = ["sliding-log", "sliding-window", "fixed-window", "gcra"]


def _made(make: Maker, clock: FakeClock, algorithm: str) -> Any:
    """A limiter of ``algorithm`` on the store (``None``: the store decides no such)."""
    storage: Any = make(clock).storage
    decided = getattr(storage, "algorithms", None)
    if decided is not None and algorithm not in decided:
        pytest.skip(f"{type(storage).__name__} decides no {algorithm}")
    return make(clock, algorithm=algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_an_override_below_a_calls_cost_refuses_it(
    make: Maker, clock: FakeClock, algorithm: str
) -> None:
    rl = _made(make, clock, algorithm)
    limit = rl.limit("apikey:100/h", key="search", apikey="abc", cost=10)
    assert await admitted(limit, 1) == 1
    await rl.overrides.set("search", "apikey:5/h", apikey="abc")  # lowered below one call
    refused = await limit.decide()
    assert not refused.allowed
    assert refused.override
    assert str(refused.rule) == "apikey:5/h"
    assert 0 < refused.retry_after < float("inf")
    assert await admitted(limit, 3) == 0
    clock.advance(7200)  # however long it waits
    assert await admitted(limit, 1) == 0
    other = rl.limit("apikey:100/h", key="search", apikey="xyz", cost=10)
    assert await admitted(other, 1) == 1  # another caller keeps the limit's own rules


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_per_call_cost_above_an_override_is_refused(
    make: Maker, clock: FakeClock, algorithm: str
) -> None:
    rl = _made(make, clock, algorithm)
    limit = rl.limit("apikey:100 tokens/h", key="chat", apikey="abc", cost={"tokens": 1})
    await rl.overrides.set("chat", "apikey:50 tokens/h", apikey="abc")
    assert (await limit.decide(cost={"tokens": 40})).allowed
    refused = await limit.decide(cost={"tokens": 60})  # above the override's whole count
    assert not refused.allowed
    assert refused.override


async def test_waiting_under_an_override_below_the_cost_refuses_at_once(
    make: Maker, clock: FakeClock
) -> None:
    """``wait=True`` slept the refusing rule's whole span (an hour) before asking again,
    though waiting can never admit such a call: it raises at once."""
    rl = make(clock)
    limit = rl.limit("user:100/h", key="w", user="u", cost=5, wait=True)
    await rl.overrides.set("w", "user:2/h", user="u")

    @rl.limit("user:100/h", key="w", cost=5, wait=True)
    async def work(user: str) -> None:
        return None

    with pytest.raises(RateLimitExceeded):
        await asyncio.wait_for(work("u"), 5)
    with pytest.raises(RateLimitExceeded):
        await asyncio.wait_for(limit.acquire(), 5)
    with pytest.raises(RateLimitExceeded):
        async with asyncio.timeout(5), limit:
            pass


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_rule_of_an_override_below_a_calls_cost_refuses_it_under_and_too(
    make: Maker, clock: FakeClock, algorithm: str
) -> None:
    """``user:2/h & user:20/h`` for calls of 5: the override was dropped (the limit's own
    100/h admitted 20 calls, with a warning); its 2/h can never admit one, and refuses."""
    rl = _made(make, clock, algorithm)
    limit = rl.limit("user:100/h", key="k", user="u", cost=5)
    await rl.overrides.set("k", "user:2/h & user:20/h", user="u")
    assert await admitted(limit, 30) == 0
    refused = await limit.decide()
    assert refused.override
    assert str(refused.rule) == "user:2/h"


def _unannounceable(storage: object) -> list[str]:
    """Keys this store cannot keep in its table of announced keys."""
    kind = type(storage).__name__
    if "Postgres" in kind:
        return ["nul\x00byte", "k" * 4096]
    if "Redis" in kind:
        return ["lone\ud800surrogate"]
    return []


async def test_a_key_the_store_cannot_announce_never_stops_refreshes(
    make: Maker, clock: FakeClock
) -> None:
    setter, app = make(clock), make(clock, override_refresh=0)  # app reads at every decision
    storage: Any = app.storage
    bad = _unannounceable(storage)
    failing = False
    if not bad:  # memory keeps any key: its announcing fails instead
        announce = storage.overrides_announce

        async def refused(namespace: str, keys: Any) -> None:
            if failing:
                raise ConnectionError("announcing refused")
            await announce(namespace, keys)

        storage.overrides_announce = refused
        failing, bad = True, ["any"]
    for key in bad:
        await app.limit("10/h", key=key).peek()
    limit = app.limit("apikey:1/h", key="search", apikey="abc")
    assert await admitted(limit, 1) == 1
    await setter.overrides.set("search", "apikey:5/h", apikey="abc")  # set later
    assert await admitted(limit, 10) == 4  # 5 in all: the override was read
    await app.overrides.refresh()  # best effort too: reads, and raises nothing
    assert await setter.overrides.known("search") is not failing


async def test_the_announce_queue_is_bounded(make: Maker, clock: FakeClock) -> None:
    app = make(clock, override_refresh=60)
    storage: Any = app.storage

    async def down(namespace: str, keys: Any) -> None:
        raise ConnectionError("announcing refused")

    storage.overrides_announce = down
    cache: Any = app._decider.overrides
    assert cache is not None
    for n in range(MAX_ANNOUNCED + 50):
        cache.has(f"key-{n}")
    assert len(cache.pending) <= MAX_ANNOUNCED
    await cache.check()  # fails to announce: the queue does not keep growing
    assert len(cache.pending) <= MAX_ANNOUNCED


def test_overrides_written_before_the_store_kept_an_order_rank_below() -> None:
    legacy_new = Override("k", (("user", "bob"),), "1/m", None, at=2_000.0, version=0)
    legacy_old = Override("k", (("apikey", "abc"),), "2/m", None, at=1_000.0, version=0)
    assert winner([legacy_old, legacy_new]) is legacy_new  # among them: the latest `at`
    ordered = Override("k", (("apikey", "abc"),), "3/m", None, at=10.0, version=1)
    assert winner([legacy_new, ordered]) is ordered  # any the store ordered is later
    unread = Override("k", (("user", "bob"),), "4/m", None, at=5.0, version=None)
    assert winner([ordered, unread]) is unread  # written here, not yet read back: last
    table = {override_id("k", legacy_new.values): encode(legacy_new)}  # no "version"
    cache = OverrideCache(MemoryBackend(), "ns", 1.0, None)
    cache.load(1, table)
    assert cache.match("k", {"user": "bob"}) == legacy_new


@pytest.mark.postgres
async def test_postgres_adds_the_order_to_an_older_table(postgres_url: str, namespace: str) -> None:
    import asyncpg

    first = RateLimit(PostgresBackend(postgres_url), namespace, algorithm="sliding-window")
    await first.setup()
    db = await asyncpg.connect(postgres_url)
    try:  # the table as an older version left it: no column, an older mark
        await db.execute("ALTER TABLE ratelimit_overrides DROP COLUMN version")
        await db.execute("COMMENT ON TABLE ratelimit_counters IS 'ratelimit schema older'")
        record = encode(Override("search", (("apikey", "abc"),), "apikey:5/h", None, 1.0))
        identity = override_id("search", (("apikey", "abc"),))
        await db.execute(
            "INSERT INTO ratelimit_overrides (namespace, id, record) VALUES ($1, $2, $3)",
            namespace,
            identity,
            record,
        )
    finally:
        await db.close()
    await first.aclose()
    rl = RateLimit(PostgresBackend(postgres_url), namespace, algorithm="sliding-window")
    try:
        assert "updated" in await rl.setup()
        kept = await rl.overrides.get("search", apikey="abc")
        assert kept is not None
        assert kept.version == 0  # written before: ranks below any written now
        await rl.overrides.set("search", "apikey:7/h", user="bob")
        found = await rl.overrides.in_force("search", apikey="abc", user="bob")
        assert found is not None
        assert found.rules == "apikey:7/h"
        assert found.version is not None
        assert found.version > 0
    finally:
        await rl.aclose()


async def _plant(storage: Any, namespace: str, key: str, record: str) -> None:
    """An announcement of ``key`` as a store would keep it, with ``record`` (its time)."""
    identity = ANNOUNCED + key
    kind = type(storage).__name__
    if "Postgres" in kind:
        await storage._guarded(
            lambda db: db.execute(
                "INSERT INTO ratelimit_overrides (namespace, id, record) VALUES ($1, $2, $3)",
                namespace,
                identity,
                record,
            ),
            "plant",
        )
    elif "Redis" in kind:
        await storage.client.hset(overrides_key(namespace), identity, record)
    else:
        storage._table(namespace)[1][identity] = record


async def test_announced_keys_are_pruned_once_old(make: Maker, clock: FakeClock) -> None:
    app, operator = make(clock), make(clock)
    await app.limit("10/m", key="fresh").decide()
    await app.overrides.refresh()
    storage: Any = app.storage
    await _plant(storage, app.namespace, "stale", "1000.5")  # announced in 1970
    await _plant(storage, app.namespace, "undated", "")  # by a version that kept no time
    now = clock() if isinstance(storage, MemoryBackend) else time.time()  # the store's
    await _plant(storage, app.namespace, "kept", str(now - ANNOUNCED_FOR + 3600))
    await _plant(storage, app.namespace, "gone", str(now - ANNOUNCED_FOR - 3600))
    assert await operator.overrides.known("stale")
    await operator.overrides.set("other", "5/m")  # a process's first write prunes
    assert not await operator.overrides.known("stale")
    assert not await operator.overrides.known("undated")
    assert await operator.overrides.known("fresh")
    assert await operator.overrides.known("kept")  # ANNOUNCED_FOR, as every store reads it
    assert not await operator.overrides.known("gone")


async def test_a_process_announces_its_keys_again_every_day(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock))
    limit = rl.limit("10/m", key="search")
    await limit.decide()
    await rl.overrides.refresh()
    store: Any = rl.storage
    first = store._table(rl.namespace)[1][ANNOUNCED + "search"]
    clock.advance(ANNOUNCE_AGAIN + 1)
    await rl.overrides.refresh()  # a day on: the keys are told again as they are decided
    await limit.decide()
    await rl.overrides.refresh()
    assert float(store._table(rl.namespace)[1][ANNOUNCED + "search"]) > float(first)
    await rl.aclose()


async def test_a_route_lowered_below_its_cost_refuses(make: Maker, clock: FakeClock) -> None:
    from ratelimit.asgi import Route, header
    from tests.test_asgi import app_with, client

    rl = make(clock)
    route = Route("/a", "api:100/h", key="search", cost=10, api=header("x-api-key"))
    async with client(app_with(rl, [route])) as http:
        assert (await http.get("/a", headers={"x-api-key": "k"})).status_code == 200
        await rl.overrides.set("search", "api:5/h", api="k")
        refused = await http.get("/a", headers={"x-api-key": "k"})
        assert refused.status_code == 429
        assert refused.headers["ratelimit-policy"] == '"api:5/h";q=5;w=3600'
        assert (await http.get("/a", headers={"x-api-key": "j"})).status_code == 200


async def test_a_cost_callable_is_called_once_under_a_lowered_override(
    make: Maker, clock: FakeClock
) -> None:
    rl = make(clock)
    calls: list[str] = []

    def cost(apikey: str) -> int:
        calls.append(apikey)
        return 10

    @rl.limit("apikey:100/h", key="search", cost=cost)
    async def search(apikey: str) -> str:
        return apikey

    await rl.overrides.set("search", "apikey:5/h", apikey="abc")
    with pytest.raises(RateLimitExceeded) as refused:
        await search("abc")
    assert str(refused.value.rule) == "apikey:5/h"
    assert calls == ["abc"]
    assert await search("xyz") == "xyz"


async def test_concurrent_writes_each_get_a_version_of_their_own(
    make: Maker, clock: FakeClock
) -> None:
    setters = [make(clock) for _ in range(4)]
    await asyncio.gather(
        *(
            setter.overrides.set("search", f"apikey:{n + 1}/m", apikey=f"k{n}")
            for n in range(20)
            for setter in setters[n % 4 : n % 4 + 1]
        )
    )
    found = await make(clock).overrides.list("search")
    assert len(found) == 20
    versions = sorted(o.version or 0 for o in found)
    assert versions == list(range(versions[0], versions[0] + 20))  # one each, no gaps
