"""The command engine (``use_scripts=False``) in the spread layout (issue 38): where the tree
spreads, each identifier's keys and its lock under a hash tag of their own, so that two users
of one hot limit never share a slot or wait on each other's lock; a tree that mixes
selectors keeps one tag and one lock per (namespace, key), as before."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.crc import key_slot

from ratelimit import ConcurrencyLimitExceeded, Decision, RateLimit, RedisCommandBackend
from ratelimit.backends.redis.client import CLUSTER_TRANSACTIONS, redis_py_version
from ratelimit.backends.redis.keys import (
    lock_key,
    prefix_of,
    reset_key,
    revoked_key,
    slots_key,
    spread_tag,
    tag,
)
from ratelimit.backends.redis.overrides import overrides_key
from ratelimit.core.plan import Identifier, Plan
from ratelimit.core.slots import claim_for, parse_slots
from tests.conftest import FakeClock, admitted
from tests.redis_server import RedisCluster
from tests.workers import run_workers

pytestmark = pytest.mark.timeout(30)

ALGORITHMS = ["sliding-log", "sliding-window", "fixed-window", "gcra"]
USERS = ["alice", "bob", "carol"]
SPREADING = "user:3/m | user:5/h"
MIXED = "user:3/m | 10/h"

Make = Callable[..., RedisCommandBackend]


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[aioredis.Redis]:
    """A client of a store of this test's own: a fake server, or the real one (each test
    has a namespace of its own there)."""
    client: Any
    if request.param == "fakeredis":
        client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    else:
        client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    yield client
    await client.aclose()


@pytest.fixture
def make(store: aioredis.Redis) -> Make:
    """``make(spread=True, **settings)``: a command engine on the test's store."""

    def factory(spread: bool | None = True, **settings: Any) -> RedisCommandBackend:
        return RedisCommandBackend(store, spread=spread, **settings)

    return factory


def user(namespace: str, value: str, key: str = "login") -> Identifier:
    return Identifier(namespace, key, "user", value)


async def keys_of(client: aioredis.Redis, namespace: str) -> set[str]:
    """Every key the limiter wrote in ``namespace`` (the test's own)."""
    keys = {k.decode() async for k in client.scan_iter(match="rl:*")}
    return {k for k in keys if k.startswith((f"rl:{{{namespace}:", f"rl:{{{namespace}}}"))}


def spy_locks(backend: RedisCommandBackend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of every lock ``backend`` takes from now on."""
    taken: list[str] = []
    lock = backend.lock

    def spy(*args: Any) -> Any:
        held = lock(*args)
        taken.append(held.name)
        return held

    monkeypatch.setattr(backend, "lock", spy)
    return taken


def outcome(decision: Decision) -> tuple[bool, float, float | None, str | None]:
    rule = None if decision.rule is None else str(decision.rule)
    return decision.allowed, decision.retry_after, decision.remaining, rule


async def run_sequence(
    backend: RedisCommandBackend, clock: FakeClock, namespace: str, algorithm: str, rules: str
) -> list[tuple[bool, float, float | None, str | None]]:
    """One trace of calls by three users, the clock moving between them."""
    rl = RateLimit(backend, namespace, algorithm=algorithm)
    seen = []
    for step in range(14):
        name = USERS[step % 3] if step < 9 else "alice"
        limit = rl.limit(rules, key="login", user=name)
        seen.append(outcome(await limit.decide(cost=2 if step == 4 else 1)))
        clock.advance(7)
    return seen


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_spreading_limit_writes_only_keys_of_each_users_own_tag(
    make: Make, store: aioredis.Redis, algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = f"sp-{uuid.uuid4().hex[:8]}"
    clock, pinned_clock = FakeClock(), FakeClock()
    backend = make(clock=clock)
    locks = spy_locks(backend, monkeypatch)
    spread = await run_sequence(backend, clock, namespace, algorithm, SPREADING)
    tags = {spread_tag(user(namespace, name)): name for name in USERS}
    assert set(locks) == {lock_key(t) for t in tags}  # one per user, none per key
    written = await keys_of(store, namespace)
    owners = {k: next((t for t in tags if k.startswith(t)), None) for k in written}
    assert None not in owners.values(), sorted(written)
    assert set(owners.values()) == set(tags)  # every user's keys exist
    for key, owner in owners.items():
        assert owner is not None
        assert key_slot(key.encode()) == key_slot(owner.encode())
    for prefix in tags:  # each user's lock beside its keys
        assert key_slot(lock_key(prefix).encode()) == key_slot(prefix.encode())
    assert len({key_slot(t.encode()) for t in tags}) == len(tags)  # three slots, not one
    # the same trace in the pinned layout decides the same, call for call
    pinned_namespace = f"pin-{uuid.uuid4().hex[:8]}"
    pinned = await run_sequence(
        make(spread=False, clock=pinned_clock), pinned_clock, pinned_namespace, algorithm,
        SPREADING,
    )  # fmt: skip
    assert spread == pinned
    assert [allowed for allowed, *_ in spread].count(False) > 0  # the trace reaches limits
    assert all(k.startswith(tag(pinned_namespace, "login")) for k in
               await keys_of(store, pinned_namespace))  # fmt: skip


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("spread", [True, False, None])
async def test_a_mixed_tree_or_spread_off_keeps_todays_keys_and_lock(
    make: Make,
    store: aioredis.Redis,
    algorithm: str,
    spread: bool | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``spread`` off (or unset, on a client of one server) every tree keeps its keys
    and its lock under the limit's one tag; with it on, a tree mixing a selector with a
    rule of none keeps each user's keys under the user's tag and the rule's under the
    key's, and takes the lock of each (issue 47: the layout is the identifier's)."""
    namespace = f"mx-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    backend = make(spread, clock=clock)
    locks = spy_locks(backend, monkeypatch)
    rules = MIXED if spread else SPREADING
    await run_sequence(backend, clock, namespace, algorithm, rules)
    written = await keys_of(store, namespace)
    assert written
    pinned = f"rl:{{{namespace}:login}}"
    if not spread:
        assert set(locks) == {f"{pinned}:lock"}  # as before
        assert all(k.startswith(pinned) for k in written), sorted(written)
        return
    users = {f"rl:{{{namespace}:login:user={u}}}" for u in USERS}
    assert set(locks) == {f"{t}:lock" for t in users | {pinned}}
    assert all(k.split("}")[0] + "}" in users | {pinned} for k in written), sorted(written)
    assert any(k.startswith(pinned) for k in written)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_settle_and_reset_act_on_the_spread_keys(
    make: Make, store: aioredis.Redis, algorithm: str
) -> None:
    namespace = f"st-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    rl = RateLimit(make(clock=clock), namespace, algorithm=algorithm)
    alice = rl.limit("user:5/h", key="login", user="alice")
    bob = rl.limit("user:5/h", key="login", user="bob")
    reserved = await alice.decide(cost=4)
    assert reserved.allowed
    assert await admitted(bob, 1) == 1
    assert await alice.settle(reserved, 1)  # a refund of 3 on alice's own keys
    assert await admitted(alice, 6) == 4
    assert await admitted(bob, 6) == 4  # bob's counted apart
    await alice.reset()
    mark = reset_key(user(namespace, "alice"), True)
    assert await store.exists(mark)
    prefix = spread_tag(user(namespace, "alice"))
    left = {k for k in await keys_of(store, namespace) if k.startswith(prefix)}
    assert left <= {mark, f"{prefix}:lock:wake"}  # everything else of alice's forgotten
    assert await admitted(alice, 6) == 5
    assert await admitted(bob, 1) == 0  # bob's untouched
    assert all(
        k.startswith((prefix, spread_tag(user(namespace, "bob"))))
        for k in await keys_of(store, namespace)
        if k != overrides_key(namespace)  # the reset told other processes (a new version)
    )


async def test_concurrency_slots_of_one_selector_spread(
    make: Make, store: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = f"cc-{uuid.uuid4().hex[:8]}"
    backend = make()
    locks = spy_locks(backend, monkeypatch)
    rl = RateLimit(backend, namespace)
    alice = rl.concurrency("user:2", key="pool", user="alice")
    key = slots_key(user(namespace, "alice", "pool"), True)
    async with alice, alice:
        assert await store.zcard(key) == 2
        with pytest.raises(ConcurrencyLimitExceeded):
            async with rl.concurrency("user:2", key="pool", user="alice"):
                pass
        async with rl.concurrency("user:2", key="pool", user="bob"):
            assert await store.zcard(slots_key(user(namespace, "bob", "pool"), True)) == 1
    assert await store.zcard(key) == 0
    prefix = spread_tag(user(namespace, "alice", "pool"))
    assert lock_key(prefix) in locks
    assert lock_key(tag(namespace, "pool")) not in locks
    # a claim given back before its take landed: the mark under the claim's own tag
    claim = claim_for(parse_slots("user:2"), namespace, "pool", {"user": "alice"}, "ab12", 10**7)
    assert claim.spreads
    await backend.release_slots(claim, revoke=True)
    assert await store.exists(revoked_key(prefix, "ab12"))
    assert await backend.acquire_slots(claim) == (False, (0,))
    # slots that mix a selector with a limit of none: alice's under her own tag, the
    # limit of none's under the key's, each under its own lock (issue 47)
    async with rl.concurrency("user:2 | 5", key="mixed", user="alice"):
        assert await store.zcard(slots_key(user(namespace, "alice", "mixed"), True)) == 1
        assert await store.zcard(slots_key(Identifier(namespace, "mixed", None, None))) == 1
    assert lock_key(tag(namespace, "mixed")) in locks
    assert lock_key(spread_tag(user(namespace, "alice", "mixed"))) in locks
    await rl.aclose()


# --- the lock: per user where the limit spreads ---


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_held_lock_of_one_user_delays_that_user_only(
    make: Make, store: aioredis.Redis, algorithm: str
) -> None:
    """Alice's lock held by another process: a decision of bob goes through at once, one of
    alice waits and is refused (degraded) when ``lock_timeout`` passes."""
    namespace = f"lk-{uuid.uuid4().hex[:8]}"
    rl = RateLimit(make(lock_timeout=0.1, clock=FakeClock()), namespace, algorithm=algorithm)
    await store.set(lock_key(spread_tag(user(namespace, "alice"))), "another", px=60_000)
    bob = await rl.limit(SPREADING, key="login", user="bob").decide()
    assert bob.allowed
    assert not bob.degraded
    alice = await rl.limit(SPREADING, key="login", user="alice").decide()
    assert not alice.allowed
    assert alice.degraded  # refused by the lock's timeout, never admitted
    assert not any(k.startswith(spread_tag(user(namespace, "alice")) + ":w") or
                   k == spread_tag(user(namespace, "alice"))
                   for k in await keys_of(store, namespace))  # fmt: skip
    await rl.aclose()


async def test_a_held_lock_of_a_mixed_tree_delays_every_user(
    make: Make, store: aioredis.Redis
) -> None:
    namespace = f"lm-{uuid.uuid4().hex[:8]}"
    rl = RateLimit(make(lock_timeout=0.1, clock=FakeClock()), namespace)
    await store.set(lock_key(tag(namespace, "login")), "another", px=60_000)
    for name in ("alice", "bob"):
        decision = await rl.limit(MIXED, key="login", user=name).decide()
        assert not decision.allowed
        assert decision.degraded
    # a pinned lock is no lock of a spreading tree's users
    await store.set(lock_key(tag(namespace, "hot")), "another", px=60_000)
    assert (await rl.limit(SPREADING, key="hot", user="bob").decide()).allowed
    await rl.aclose()


async def test_a_slow_holder_delays_its_own_users_next_call_only(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice's first decision holds her lock until the test lets it go: bob's decision
    completes meanwhile; alice's second waits in the process and is refused when
    ``lock_timeout`` passes; the first is admitted once let go."""
    namespace = f"sl-{uuid.uuid4().hex[:8]}"
    backend = make(lock_timeout=0.1, clock=FakeClock())
    rl = RateLimit(backend, namespace)
    inside, go = asyncio.Event(), asyncio.Event()
    decide = backend._decide

    async def slow(plan: Plan, may_write: bool = True) -> Decision:
        if plan.identifiers[0].value == "alice" and not inside.is_set():
            inside.set()
            await go.wait()
        return await decide(plan, may_write)

    monkeypatch.setattr(backend, "_decide", slow)
    monkeypatch.setattr(backend, "timeout", None)  # the held round trip is the test's
    first = asyncio.create_task(rl.limit(SPREADING, key="login", user="alice").decide())
    await inside.wait()
    bob = await asyncio.wait_for(rl.limit(SPREADING, key="login", user="bob").decide(), 5)
    assert bob.allowed
    assert not bob.degraded
    second = await rl.limit(SPREADING, key="login", user="alice").decide()
    assert not second.allowed
    assert second.degraded
    assert not first.done()
    go.set()
    assert (await first).allowed
    await rl.aclose()


# --- many processes on one spreading limit ---

PER_USER = 5


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.timeout(120)
async def test_processes_on_a_spreading_limit_admit_exactly_its_count_per_user(
    redis_client: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    """3 processes x 4 users x 6 callers at once on ``user:5/h``, spread, under the lock
    per user: exactly 5 per user in total, none degraded, every key under its user's tag."""
    users = 4
    outputs = await run_workers(
        redis_client, namespace, "tests.spread_lock_worker", redis_url, namespace, str(users),
        "6", count=3,
    )  # fmt: skip
    per_user = [0] * users
    degraded = 0
    for out in outputs:
        *counts, lost = (int(n) for n in out.split())
        degraded += lost
        per_user = [a + b for a, b in zip(per_user, counts, strict=True)]
    assert per_user == [PER_USER] * users
    assert degraded == 0
    for n in range(users):
        name = spread_tag(Identifier(namespace, "hot", "user", f"u{n}"))
        assert await redis_client.llen(name) == PER_USER
        assert not await redis_client.exists(lock_key(name))
    assert not await redis_client.exists(tag(namespace, "hot"))
    keys = {k.decode() async for k in redis_client.scan_iter(match=f"rl:{{{namespace}:h*")}
    assert all(k.startswith(f"rl:{{{namespace}:hot:user=u") for k in keys), sorted(keys)


# --- a real Redis Cluster: the command engine spreads there by default ---


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL points at one server; the cluster test starts its own nodes")
    with RedisCluster() as cluster:
        yield cluster.url


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.timeout(60)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_on_a_cluster_each_user_decides_on_its_own_node(
    cluster_url: str, namespace: str, algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spread`` unset on a cluster client: each user's keys, lock and ``TIME`` on the node
    of that user's slot (no CROSSSLOT, no MOVED left unanswered), users over several nodes,
    exact counts; decide, settle, reset and slots alike."""
    if redis_py_version() < CLUSTER_TRANSACTIONS:
        pytest.skip("the command engine on a cluster needs redis-py 6.2 or later")
    client = await AsyncRedisCluster.from_url(cluster_url).initialize()
    rl = RateLimit(
        client, namespace, use_scripts=False, algorithm=algorithm, on_error="raise", timeout=5
    )
    assert rl.storage.spread  # type: ignore[attr-defined]
    asked: list[str] = []
    execute = client.execute_command

    async def spy(*args: Any, **kwargs: Any) -> Any:
        if args[0] == "TIME":
            asked.append(kwargs["target_nodes"].name)
        return await execute(*args, **kwargs)

    monkeypatch.setattr(client, "execute_command", spy)
    try:
        await decide_on_nodes(rl, client, namespace, asked)
    finally:
        await rl.aclose()
        await client.aclose()


async def decide_on_nodes(
    rl: RateLimit, client: AsyncRedisCluster, namespace: str, asked: list[str]
) -> None:
    by_node: dict[str, list[str]] = {}  # two users on each node
    for name in (f"u{n}" for n in range(200)):
        slot = key_slot(spread_tag(user(namespace, name)).encode())
        users = by_node.setdefault(client.nodes_manager.get_node_from_slot(slot).name, [])
        if len(users) < 2:
            users.append(name)
    assert len(by_node) == 3
    for node, name in ((node, name) for node, names in by_node.items() for name in names):
        limit = rl.limit("user:3/m | user:50 tokens/h", key="login", user=name)
        asked.clear()
        reserved = await limit.decide(cost={"tokens": 40})
        assert reserved.allowed
        assert await limit.settle(reserved, {"tokens": 10})
        assert [(await limit.decide()).allowed for _ in range(3)] == [True, True, False]
        await limit.reset()
        assert (await limit.decide()).allowed
        async with rl.concurrency("user:1", key="login", user=name):
            pass
        assert asked
        assert set(asked) == {node}  # the store's clock of the user's own node


def test_the_lock_prefix_of_a_pinned_plan_is_todays() -> None:
    ident = Identifier("shop", "search", "user", "vova")
    assert lock_key(prefix_of("shop", "search", (ident,), False)) == "rl:{shop:search}:lock"
    assert lock_key(prefix_of("shop", "search", (ident,), True)) == (
        "rl:{shop:search:user=vova}:lock"
    )
