"""Issue 38: a limiter that spreads warns once per (namespace, key) when it finds counters
of the layout before spreading (``rl:{ns:key}:user=...``), which it no longer reads; it is
silent when there are none, and never raises when the server fails."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import fakeredis
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from ratelimit import RateLimit
from ratelimit.backends.redis.old_layout import LayoutCheck
from ratelimit.core.plan import Plan, cached_plan, compile_tree
from ratelimit.rules.tree import to_tree
from tests.redis_server import RedisCluster, free_port

SPREADS = compile_tree(to_tree("user:5/m | user:100/h"))


def plan(namespace: str, key: str, value: str = "alice", rules: str | None = None) -> Plan:
    compiled = SPREADS if rules is None else compile_tree(to_tree(rules))
    values = tuple(value for _ in compiled.selectors)
    return cached_plan(compiled, namespace, key, values, 1, "sliding-log")


async def write_old_layout(client: object, namespace: str, key: str) -> None:
    """Counters as the limiter before spreading (``spread=False``) kept them."""
    rl = RateLimit(client, namespace, spread=False)

    @rl.limit("user:5/m | user:100/h", key=key)
    async def work(user: str) -> None: ...

    for user in ("ann", "bob"):
        await work(user)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "layout before spreading" in r.getMessage()]


async def check_warns_once(
    client: object, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    await write_old_layout(client, namespace, "old")
    check = LayoutCheck(client)
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for value in ("alice", "ann", "carol"):  # one look per (namespace, key, selector)
            check.saw(plan(namespace, "old", value))
        check.saw(plan(namespace, "new"))  # a key with no old counters: silent
        check.saw(plan(namespace, "old", rules="user:5/m & 10/m"))  # warned once per key
        await check.wait()
        check.saw(plan(namespace, "old"))
        await check.wait()
    (warned,) = warnings_of(caplog)
    assert f"namespace {namespace!r}, key 'old'" in warned
    assert f"rl:{{{namespace}:old}}:user=" in warned  # the old counter it found
    assert f"rl:{{{namespace}:old:user=<value>}}" in warned  # where this limiter counts
    assert "spread=False (RATELIMIT_SPREAD=off" in warned
    assert "up to its limit again, once" in warned


async def test_fakeredis_warns_once_when_old_counters_are_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = fakeredis.FakeAsyncRedis()
    await check_warns_once(client, "fake", caplog)
    await client.aclose()


@pytest.mark.redis
@pytest.mark.timeout(30)
async def test_a_plain_redis_warns_once_when_old_counters_are_there(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    await check_warns_once(client, f"plain-{uuid.uuid4().hex[:8]}", caplog)
    await client.aclose()


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    with RedisCluster() as cluster:
        yield cluster.url


@pytest.fixture
async def cluster_client(cluster_url: str) -> AsyncIterator[AsyncRedisCluster]:
    client = AsyncRedisCluster.from_url(cluster_url)
    yield client
    await client.aclose()


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_a_cluster_warns_once_when_old_counters_are_there(
    cluster_client: AsyncRedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    await check_warns_once(cluster_client, f"cluster-{uuid.uuid4().hex[:8]}", caplog)


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_a_cluster_without_old_counters_is_silent(
    cluster_client: AsyncRedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    namespace = f"fresh-{uuid.uuid4().hex[:8]}"
    rl = RateLimit(cluster_client, namespace, spread=False)

    @rl.limit("user:5/m & 10/m", key="mixed")  # pinned keys of another tree and key
    async def work(user: str) -> None: ...

    await work("ann")
    check = LayoutCheck(cluster_client)
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for key in ("mixed-too", "k1", "k2"):
            check.saw(plan(namespace, key))
        await check.wait()
    assert warnings_of(caplog) == []


async def test_a_failing_server_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    client = aioredis.Redis(port=free_port(), socket_connect_timeout=1)
    check = LayoutCheck(client)
    with caplog.at_level(logging.DEBUG, logger="ratelimit"):
        check.saw(plan("down", "k"))
        await check.wait()
    assert warnings_of(caplog) == []
    assert any(
        "looking for counters of the old layout failed" in r.getMessage() for r in caplog.records
    )
    await client.aclose()


def test_saw_outside_an_event_loop_does_nothing() -> None:
    check = LayoutCheck(fakeredis.FakeAsyncRedis())
    check.saw(plan("no-loop", "k"))  # no running loop: no look, no error


async def test_cancel_gives_up_the_looks_still_running() -> None:
    client = fakeredis.FakeAsyncRedis()
    check = LayoutCheck(client)
    check.saw(plan("cancelled", "k"))
    check.cancel()
    await check.wait()  # ends: the look was cancelled, nothing raised
    await client.aclose()


@pytest.mark.parametrize("use_scripts", [True, False], ids=["scripts", "commands"])
async def test_a_limiter_that_spreads_warns_of_old_counters_from_its_decisions(
    use_scripts: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The engines call the check on their decisions: a limiter upgraded in place (here
    spread=True on one server, as a cluster client does by default) warns once."""
    client = fakeredis.FakeAsyncRedis()
    await write_old_layout(client, "up", "old")
    rl = RateLimit(client, "up", spread=True, use_scripts=use_scripts)

    @rl.limit("user:5/m | user:100/h", key="old")
    async def work(user: str) -> None: ...

    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for user in ("ann", "bob", "carol"):
            await work(user)
        layout = rl._decider.backend._layout  # type: ignore[attr-defined]
        await layout.wait()
    (warned,) = warnings_of(caplog)
    assert "namespace 'up', key 'old'" in warned
    await rl.aclose()
    await client.aclose()


async def test_a_limiter_that_does_not_spread_never_looks() -> None:
    client = fakeredis.FakeAsyncRedis()
    rl = RateLimit(client, "up")  # one server, spread unset: today's layout, no check
    assert rl._decider.backend._layout is None  # type: ignore[attr-defined]
    await rl.aclose()
    await client.aclose()


async def test_old_counters_are_found_among_many_other_keys(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A busy database: a sample of it would miss the old counters; the exact old keys of
    the identifiers decided first find them (the first one decided has none here)."""
    client = fakeredis.FakeAsyncRedis()
    await client.mset({f"other:{i}": 1 for i in range(5_000)})
    await write_old_layout(client, "busy", "old")
    check = LayoutCheck(client)
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for value in ("alice", "carol", "ann"):
            check.saw(plan("busy", "old", value))
        await check.wait()
    (warned,) = warnings_of(caplog)
    assert "rl:{busy:old}:user=ann" in warned
    await client.aclose()


def test_a_decision_made_without_a_running_loop_leaves_the_look_to_a_later_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sync API's direct path decides with no running loop, where no look can start:
    that decision must not count as the look (before, the key was marked seen and never
    looked at, so threaded code never got the warning)."""
    client = fakeredis.FakeAsyncRedis()
    asyncio.run(write_old_layout(client, "noloop", "old"))
    check = LayoutCheck(client)
    check.saw(plan("noloop", "old"))  # no running loop: nothing started, nothing noted

    async def later() -> None:
        check.saw(plan("noloop", "old"))
        await check.wait()

    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        asyncio.run(later())
    assert len(warnings_of(caplog)) == 1


async def test_slots_and_reset_marks_of_the_key_are_no_old_counters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A concurrency limit mixing ``user`` with a cap (``user:1 | 3``) keeps its slots in the
    key's one slot today, and a reset leaves marks only: neither is a counter the spreading
    limit no longer reads (before, either warned of old counters)."""
    client = fakeredis.FakeAsyncRedis()
    rl = RateLimit(client, "slots", spread=True)
    async with rl.concurrency("user:1 | 3", user="alice", key="jobs", lease=60):
        check = LayoutCheck(client)
        with caplog.at_level(logging.WARNING, logger="ratelimit"):
            check.saw(plan("slots", "jobs"))
            await check.wait()
    assert not warnings_of(caplog)
    await rl.aclose()


async def test_penalty_keys_of_the_key_are_no_old_counters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A penalty's refusals and hold stay under the key's hash tag whatever the counters do
    (:mod:`ratelimit.backends.redis.penalties`): no counters of the old layout (before,
    a spreading limit with ``penalty=`` warned of them)."""
    client = fakeredis.FakeAsyncRedis()
    rl = RateLimit(client, "held", spread=True)
    limit = rl.limit("user:1/m", key="login", user="alice", penalty="user: 2 refusals/m for 1h")
    for _ in range(3):
        await limit.decide()
    assert await client.exists("rl:{held:login}:user=alice:ph")
    await client.set("rl:{held:login}:user=bob:pl", 1)  # a refusal log, for the sample
    check = LayoutCheck(client)
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        check.saw(plan("held", "login", rules="user:1/m"))
        await check.wait()
    assert not warnings_of(caplog)
    await rl.aclose()


@pytest.mark.parametrize("use_scripts", [True, False], ids=["scripts", "commands"])
async def test_new_rules_beside_old_ones_are_no_old_layout(
    use_scripts: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 47, item 7: ``user:3/h | 1000/h`` and ``user:3/h`` decided at one key by a
    limiter that spreads (a rolling deploy of new rules) write one layout, each user's
    counters under the user's tag: nothing of the layout before spreading, no warning (it
    fired before: the mixed tree kept its users in the key's slot)."""
    client = fakeredis.FakeAsyncRedis()
    new = RateLimit(client, "roll", spread=True, use_scripts=use_scripts)
    old = RateLimit(client, "roll", spread=True, use_scripts=use_scripts)
    mixed, alone = compile_tree(to_tree("user:3/h | 1000/h")), compile_tree(to_tree("user:3/h"))
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for user in ("ann", "bob", "carol"):
            await new.decide(mixed, "k", (user,))
            await old.decide(alone, "k", (user,))
        for rl in (new, old):
            await rl._decider.backend._layout.wait()  # type: ignore[attr-defined]
    assert not warnings_of(caplog)
    keys = {k if isinstance(k, str) else k.decode() for k in await client.keys("*")}
    assert not any(k.startswith("rl:{roll:k}:user=") for k in keys), keys
    await new.aclose()
    await old.aclose()
    await client.aclose()
