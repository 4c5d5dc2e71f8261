"""The script engine and ``sync_rate`` keep each identifier of a tree that spreads under a
hash tag of its own when the engine spreads (``spread=True``, as on a Redis Cluster client;
here on one server): decisions, settles, resets, concurrency slots and syncs alike, with
the same answers as the pinned layout; trees that do not spread keep one tag per key."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.crc import key_slot

from ratelimit import RateLimit, RedisScriptBackend
from ratelimit.algorithms import ALGORITHMS
from ratelimit.backends.base import Push
from ratelimit.backends.redis.keys import spread_tag, tag
from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.batch import combine, tag_of
from ratelimit.backends.redis.script.scripts import command_of, plan_command, spread_command_of
from ratelimit.backends.synced import SyncedBackend
from ratelimit.core.plan import Identifier, cached_plan, compile_tree
from ratelimit.core.slots import claim_for, parse_slots
from ratelimit.rules.tree import to_tree
from tests.conftest import FakeClock, selecting
from tests.redis_server import RedisCluster

pytestmark = pytest.mark.timeout(30)

SPREADING = "user:5/m | user:100/h"
STORES = ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)]
USERS = ("alice", "bob", "carol")


@pytest.fixture(params=STORES)
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A client of fakeredis or of the test session's real Redis."""
    made: Any
    if request.param == "fakeredis":
        made = fakeredis.FakeAsyncRedis()
    else:
        made = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    yield made
    await made.aclose()


def limiter(
    client: Any, clock: FakeClock, spread: bool, algorithm: str = "sliding-log"
) -> RateLimit:
    """A limiter of a namespace of its own on the script engine (no denial cache: every
    answer is the store's)."""
    backend = RedisScriptBackend(client, clock=clock, spread=spread)
    return RateLimit(backend, f"sp-{uuid.uuid4().hex[:10]}", algorithm=algorithm, denial_cache=0)


async def keys_of(client: Any, namespace: str) -> set[str]:
    """Every key of ``namespace`` on the server."""
    return {k.decode() async for k in client.scan_iter(match=f"rl:{{{namespace}:*")}


def spread_prefix(namespace: str, key: str, user: str) -> str:
    return spread_tag(Identifier(namespace, key, "user", user))


def as_spread(key: str, namespace: str) -> str:
    """A pinned key of ``namespace`` with its identifier moved under its own tag (what the
    spread layout names the same thing), in namespace ``namespace``."""
    match = re.fullmatch(r"rl:\{[^:}]+:([^}]*)\}:(user=[^:!]*)(.*)", key)
    assert match is not None, key
    return f"rl:{{{namespace}:{match[1]}:{match[2]}}}{match[3]}"


def answer(decision: Any) -> tuple[bool, float, tuple[object, ...]]:
    return (
        decision.allowed,
        decision.retry_after,
        tuple((str(s.rule), s.limited, s.remaining, s.reset_after) for s in decision.states),
    )


async def run_sequence(
    rl: RateLimit, clock: FakeClock, rules: str, key: str
) -> list[tuple[bool, float, tuple[object, ...]]]:
    """A sequence of calls of three users past their limits, with time stepping."""
    answers = []
    for step in range(16):
        for user in USERS[: 1 + step % 3]:
            decision = await rl.limit(rules, user=user, key=key).decide(cost=1 + step % 2)
            answers.append(answer(decision))
        clock.advance(6.5)
    return answers


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_spreading_limit_keeps_each_identifier_under_its_own_tag(
    client: Any, algorithm: str
) -> None:
    pinned_clock, spread_clock = FakeClock(), FakeClock()
    pinned = limiter(client, pinned_clock, False, algorithm)
    spread = limiter(client, spread_clock, True, algorithm)
    try:
        expected = await run_sequence(pinned, pinned_clock, SPREADING, "login")
        assert await run_sequence(spread, spread_clock, SPREADING, "login") == expected
        assert any(not allowed for allowed, _, _ in expected)  # the limits were reached
        written = await keys_of(client, spread.namespace)
        assert written  # only keys under each user's own tag, and all of the same names
        assert written == {
            as_spread(k, spread.namespace) for k in await keys_of(client, pinned.namespace)
        }
        for user in USERS:
            prefix = spread_prefix(spread.namespace, "login", user)
            own = {k for k in written if k.startswith(prefix)}
            assert own
            assert {key_slot(k.encode()) for k in own} == {key_slot(prefix.encode())}
        assert (
            len({key_slot(spread_prefix(spread.namespace, "login", u).encode()) for u in USERS})
            == 3
        )
        # the pinned engine wrote what it always did: every key under the limit's tag
        pinned_tag = tag(pinned.namespace, "login")
        assert all(
            k.startswith(f"{pinned_tag}:user=") for k in await keys_of(client, pinned.namespace)
        )
    finally:
        await pinned.aclose()
        await spread.aclose()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("rules", ["user:5/m & 10/s", "user:5/m | ip:3/m"])
async def test_a_mixed_tree_keeps_each_identifier_under_its_own_tag(
    client: Any, algorithm: str, rules: str
) -> None:
    """Issue 47: where an identifier's keys live does not depend on the tree: a tree mixing
    selectors (or with a rule of none) keeps each user's keys under the user's own tag,
    each ip's under the ip's, and a rule of no selector under the key's."""
    clock = FakeClock()
    rl = limiter(client, clock, True, algorithm)
    try:
        for user in USERS:
            values = selecting(rules, user=user, ip="10.0.0.1")
            assert (await rl.limit(rules, key="mixed", **values).decide()).allowed
        written = await keys_of(client, rl.namespace)
        assert written
        own = [spread_tag(Identifier(rl.namespace, "mixed", "user", u)) for u in USERS]
        own.append(spread_tag(Identifier(rl.namespace, "mixed", "ip", "10.0.0.1")))
        own.append(tag(rl.namespace, "mixed"))
        assert all(k.split("}")[0] + "}" in own for k in written), written
        assert not any(k.startswith(f"{tag(rl.namespace, 'mixed')}:user=") for k in written)
    finally:
        await rl.aclose()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_tree_compiled_pinned_keeps_the_pinned_keys(client: Any, algorithm: str) -> None:
    clock = FakeClock()
    rl = limiter(client, clock, True, algorithm)
    try:
        compiled = compile_tree(to_tree(SPREADING), pinned=True)
        for user in USERS:
            assert (await rl.decide(compiled, "chosen", (user,))).allowed
        written = await keys_of(client, rl.namespace)
        assert written
        assert all(k.startswith(f"{tag(rl.namespace, 'chosen')}:user=") for k in written)
    finally:
        await rl.aclose()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_refund_and_a_reset_act_on_the_spread_keys(client: Any, algorithm: str) -> None:
    clock = FakeClock()
    rl = limiter(client, clock, True, algorithm)
    try:
        limit = rl.limit("user:3/m", user="alice", key="refund")
        first = await limit.decide()
        assert [(await limit.decide()).allowed for _ in range(2)] == [True, True]
        assert await limit.settle(first, 0)  # gives the first call's hit back
        assert (await limit.decide()).allowed
        assert not (await limit.decide()).allowed
        await limit.reset()
        assert (await limit.decide()).allowed  # admitted again after the reset
        prefix = spread_prefix(rl.namespace, "refund", "alice")
        written = await keys_of(client, rl.namespace)
        assert f"{prefix}:r" in written  # the reset mark, in the identifier's slot
        assert all(k.startswith(prefix) for k in written)
    finally:
        await rl.aclose()


async def test_concurrency_slots_and_a_revoked_mark_land_in_the_identifier_s_slot(
    client: Any,
) -> None:
    namespace = f"sp-{uuid.uuid4().hex[:10]}"
    backend = RedisScriptBackend(client, clock=FakeClock(), spread=True)
    slots = parse_slots("user:2")
    claims = [
        claim_for(slots, namespace, "c", {"user": "alice"}, f"t{n}", 60_000_000) for n in range(3)
    ]
    assert claims[0].spreads
    assert [(await backend.acquire_slots(c))[0] for c in claims] == [True, True, False]
    prefix = spread_prefix(namespace, "c", "alice")
    assert await keys_of(client, namespace) == {f"{prefix}:c"}
    await backend.release_slots(claims[0])
    await backend.release_slots(claims[1], revoke=True)
    assert await keys_of(client, namespace) == {f"{prefix}:revoked:t1"}  # slots all given back
    assert key_slot(f"{prefix}:revoked:t1".encode()) == key_slot(f"{prefix}:c".encode())
    assert (await backend.acquire_slots(claims[2]))[0]
    assert not (await backend.acquire_slots(claims[1]))[0]  # revoked: its take is refused
    mixed = claim_for(parse_slots("user:2 | 9"), namespace, "m", {"user": "alice"}, "t", 60_000_000)
    assert (await backend.acquire_slots(mixed))[0]
    assert {k for k in await keys_of(client, namespace) if ":m" in k} == {
        f"{spread_prefix(namespace, 'm', 'alice')}:c",  # alice's under her own tag
        f"{tag(namespace, 'm')}:c",  # the limit of no selector's under the key's
    }


async def test_rl_concurrency_holds_spread_slots(client: Any) -> None:
    rl = limiter(client, FakeClock(), True)
    try:
        async with rl.concurrency("user:2", user="alice", key="jobs"):
            written = await keys_of(client, rl.namespace)
        assert written == {f"{spread_prefix(rl.namespace, 'jobs', 'alice')}:c"}
    finally:
        await rl.aclose()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_spread_false_writes_today_s_keys(algorithm: str) -> None:
    client = fakeredis.FakeAsyncRedis()
    rl = limiter(client, FakeClock(), False, algorithm)
    try:
        await rl.limit(SPREADING, user="alice", key="k").decide()
        name = f"rl:{{{rl.namespace}:k}}:user=alice"
        today = {
            "sliding-log": {name, f"{name}:n"},
            "sliding-window": {f"{name}:w"},
            "fixed-window": {f"{name}:w"},
            "gcra": {f"{name}:g:60000", f"{name}:g:3600000"},
        }
        assert await keys_of(client, rl.namespace) == today[algorithm]
    finally:
        await rl.aclose()
        await client.aclose()


def test_each_engine_s_plan_cache_gives_its_layout() -> None:
    spreading = compile_tree(to_tree(SPREADING))
    plan = cached_plan(spreading, "ns", "k", ("alice",), 1, "sliding-log")
    mixed = cached_plan(compile_tree(to_tree("user:5/m & 10/s")), "ns", "k", ("alice",), 1, "gcra")
    assert command_of(plan).keys == ["rl:{ns:k}:user=alice", "rl:{ns:k}:user=alice:n"]
    assert spread_command_of(plan).keys == ["rl:{ns:k:user=alice}", "rl:{ns:k:user=alice}:n"]
    assert spread_command_of(plan) is spread_command_of(plan)  # built once per plan
    assert spread_command_of(mixed).keys == [  # each identifier under its own tag
        "rl:{ns:k:user=alice}:g:60000",
        "rl:{ns:k}:g:1000",
    ]
    pinned = cached_plan(
        compile_tree(to_tree(SPREADING), pinned=True), "ns", "k", ("alice",), 1, "sliding-log"
    )
    assert spread_command_of(pinned).keys == command_of(pinned).keys  # a key declared pinned
    assert plan_command(plan, FakeClock(), True).keys == spread_command_of(plan).keys
    assert (
        RedisScriptBackend(fakeredis.FakeAsyncRedis(), spread=True)._command_of is spread_command_of
    )
    assert RedisScriptBackend(fakeredis.FakeAsyncRedis())._command_of is command_of


def test_batching_finds_the_spread_tag() -> None:
    def call(*keys: str) -> Command:
        decided = command_of(
            cached_plan(compile_tree(to_tree("user:5/m")), "ns", "key", ("a",), 1, "gcra")
        )
        return Command(decided.script, list(keys), decided.args, decided.packed_args)

    alice, bob = "rl:{ns:key:user=alice}", "rl:{ns:key:user=bob}"
    assert tag_of(call(f"{alice}:n")) == "ns:key:user=alice"
    assert tag_of(call(f"{alice}!tokens:w")) == "ns:key:user=alice"
    # on a cluster: one batch per tag, so spread calls of two users go alone, one user's join
    sent, layout = combine([call(alice), call(bob), call(f"{alice}:n")], by_slot=True)
    assert layout == [[0, 2], [1]]
    sent, layout = combine([call(alice), call(bob)], by_slot=False)  # one server: one batch
    assert layout == [[0, 1]]
    assert len(sent) == 1


@pytest.mark.parametrize("server", ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
async def test_spread_decisions_of_many_users_are_batched_on_one_server(
    server: str, request: pytest.FixtureRequest
) -> None:
    client: Any = (
        fakeredis.FakeAsyncRedis()
        if server == "fakeredis"
        else aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    )
    rl = limiter(client, FakeClock(), True)
    backend = rl.storage
    assert isinstance(backend, RedisScriptBackend)
    try:
        decisions = await asyncio.gather(
            *[rl.limit("user:5/m", user=f"u{n}", key="many").decide() for n in range(40)]
        )
        assert all(d.allowed for d in decisions)
        # batched calls, though every user's tag differs; on Python 3.13 fakeredis answers a
        # lone call without yielding to the loop, so every call goes alone (test_batch.py)
        if server == "redis" or sys.version_info < (3, 13):
            assert max(backend.calls_per_script) > 1, backend.calls_per_script
        assert len(await keys_of(client, rl.namespace)) == 80
    finally:
        await rl.aclose()
        await client.aclose()


async def _forever(_: float) -> None:
    await asyncio.Event().wait()


def synced_limiter(client: Any, clock: FakeClock, namespace: str, algorithm: str) -> RateLimit:
    """``sync_rate`` over a script engine that spreads, synced by hand (:meth:`sync`)."""
    engine = RedisScriptBackend(client, clock=clock, spread=True)
    backend = SyncedBackend(engine, 1.0, clock=clock, sleep=_forever)
    return RateLimit(backend, namespace, algorithm=algorithm, denial_cache=0)


@pytest.mark.parametrize("algorithm", ["sliding-window", "fixed-window"])
async def test_sync_rate_writes_spread_counters_that_processes_share(
    client: Any, algorithm: str
) -> None:
    clock = FakeClock()
    namespace = f"sp-{uuid.uuid4().hex[:10]}"
    one, two = (synced_limiter(client, clock, namespace, algorithm) for _ in range(2))
    try:
        first = one.limit(SPREADING, user="alice", key="s")
        second = two.limit(SPREADING, user="alice", key="s")
        assert [(await first.decide()).allowed for _ in range(3)] == [True] * 3
        assert [(await second.decide()).allowed for _ in range(2)] == [True] * 2
        for made in (one, two, one):
            storage = made.storage
            assert isinstance(storage, SyncedBackend)
            await storage.sync()
        assert not (await first.decide()).allowed  # each sees the other's hits: 5 of 5
        assert not (await second.decide()).allowed
        prefix = spread_prefix(namespace, "s", "alice")
        assert await keys_of(client, namespace) == {f"{prefix}:w"}
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_push_spreads_only_where_the_engine_does() -> None:
    client = fakeredis.FakeAsyncRedis()
    alice = Identifier("ns", "k", "user", "alice")
    pushes = [
        Push(alice, [(60_000_000, 5, 1.0)], True),
        Push(alice._replace(value="bob"), [(60_000_000, 5, 2.0)]),
    ]
    spread, pinned = (RedisScriptBackend(client, spread=s) for s in (True, False))
    await spread.sync_counters(pushes)
    await pinned.sync_counters(pushes[:1])
    assert {k.decode() async for k in client.scan_iter()} == {
        "rl:{ns:k:user=alice}:w",  # spread: its tree spreads, and the engine does
        "rl:{ns:k}:user=bob:w",  # its tree does not spread
        "rl:{ns:k}:user=alice:w",  # the engine does not spread
    }
    await client.aclose()


def test_push_stays_a_pair_for_stores_that_ignore_the_layout() -> None:
    push = Push(Identifier("ns", "k", None, None), [(1, 2, 3.0)])
    assert push.spreads is False
    identifier, entries, _ = push
    assert identifier.key == "k"
    assert entries == [(1, 2, 3.0)]


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL points at one server; this test starts its own cluster")
    with RedisCluster() as cluster:
        yield cluster.url


@pytest.mark.long
@pytest.mark.redis
async def test_every_spread_call_runs_on_a_real_cluster(cluster_url: str) -> None:
    """On a cluster client the engine spreads by default: decisions, settles, resets, slots
    and a sync of many users go to the users' own slots on several nodes, none CROSSSLOT."""
    client = AsyncRedisCluster.from_url(cluster_url)
    namespace = f"sp-{uuid.uuid4().hex[:10]}"
    clock = FakeClock()
    engine = RedisScriptBackend(client, clock=clock, timeout=10)
    assert engine.spread
    rl = RateLimit(engine, namespace, denial_cache=0, on_error="raise")
    synced = synced_limiter(client, clock, namespace, "sliding-window")
    users = [f"u{n}" for n in range(12)]
    try:
        for user in users:
            limit = rl.limit("user:2/m | user:100 tokens/m", user=user, key="llm")
            decision = await limit.decide(cost={"tokens": 60})
            assert await limit.settle(decision, {"tokens": 10})
            assert (await limit.decide(cost={"tokens": 90})).allowed  # 50 back: 100 of 100
            assert not (await limit.decide(cost={"tokens": 1})).allowed
            await limit.reset()
            assert (await limit.decide(cost={"tokens": 1})).allowed
            async with rl.concurrency("user:1", user=user, key="jobs"):
                pass
            assert (await synced.limit("user:5/m", user=user, key="s").decide()).allowed
        storage = synced.storage
        assert isinstance(storage, SyncedBackend)
        await storage.sync()  # raises if a push failed as a whole; logs one that failed
        assert storage.unsynced() == 0  # every push landed
        nodes = {
            client.nodes_manager.get_node_from_slot(
                key_slot(spread_prefix(namespace, "llm", u).encode())
            ).name
            for u in users
        }
        assert len(nodes) > 1
        for user in users:
            for key in ("llm", "s"):
                prefix = spread_prefix(namespace, key, user)
                assert await client.exists(f"{prefix}:w" if key == "s" else prefix)
    finally:
        await rl.aclose()
        await synced.aclose()
        await client.aclose()


@pytest.mark.redis
def test_the_sync_api_s_direct_path_spreads(redis_url: str) -> None:
    """Threaded code decides on a twin of the script engine (its calls sent by the calling
    thread): the twin keeps the engine's layout."""
    import redis

    from ratelimit.sync import RateLimit as SyncRateLimit

    namespace = f"sp-{uuid.uuid4().hex[:10]}"
    with SyncRateLimit.from_url(redis_url, namespace, spread=True, denial_cache=0, timeout=5) as rl:
        assert rl.direct is not None
        limit = rl.limit("user:2/m", user="alice", key="threads")
        assert [limit.decide().allowed for _ in range(3)] == [True, True, False]
    client = redis.Redis.from_url(redis_url)
    prefix = spread_prefix(namespace, "threads", "alice")
    assert {k.decode() for k in client.scan_iter(match=f"rl:{{{namespace}:*")} == {
        prefix,
        f"{prefix}:n",
    }
    client.close()
