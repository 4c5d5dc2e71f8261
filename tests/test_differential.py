"""Every engine gives the same decision on the same sequence of calls (DESIGN §4).

A seeded random trace of calls (rules trees with selectors, values, time steps of a few
milliseconds up to seconds) is run against each backend with one fake clock; every
``Decision`` must be equal, retry_after to the microsecond, and so must its per-rule
``states``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid

import fakeredis
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit import (
    MemoryBackend,
    RateLimit,
    RedisCommandBackend,
    RedisScriptBackend,
    Rule,
)
from ratelimit.algorithms import ALGORITHMS, gcra_burst
from ratelimit.backends.base import Backend
from ratelimit.backends.layout import gcra_field
from ratelimit.backends.redis.keys import arrival_key, counter_key, identifier_key
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Identifier, compile_tree
from ratelimit.rules.tree import Node, map_rules, to_tree
from tests.conftest import FakeClock, examples, seeds, selecting
from tests.strategies import trees

# Redis expires keys in real time even when decisions run on a fake clock, so every
# identifier of these trees also carries a span of 10 s or more: no key can expire while a
# trace runs, however slow the machine (see outlasts_the_test below).
TREES = [
    "3/s | 1000/10s",
    "2/100ms | 5/s | 1000/10s",
    "user:3/s & 2/s | user:1000/10s & 1000/10s",
    "apikey:4/2s & (3/s | 5/10s) | apikey:1000/10s",
    "(user:2/s | ip:3/s) & (5/s | user:4/3s) | ip:1000/10s & user:1000/10s & 1000/10s",
    "user:1/s | ip:2/500ms | 6/5s | ip:1000/10s & user:1000/10s & 1000/10s",
]
MIN_TTL_MS = 10_000


def outlasts_the_test(tree: Node) -> bool:
    """Whether every identifier of ``tree`` keeps its Redis key for 10 s or more."""
    longest: dict[str | None, int] = {}
    for rule in compile_tree(tree).rules:
        longest[rule.selector] = max(longest.get(rule.selector, 0), rule.span_ms)
    return min(longest.values()) >= MIN_TTL_MS


def test_the_seeded_trees_outlast_the_test() -> None:
    assert all(outlasts_the_test(to_tree(text)) for text in TREES)


USERS = ["alice", "bob", None, ""]
IPS = ["10.0.0.1", "10.0.0.2"]


async def run_trace(backend: Backend, clock: FakeClock, seed: int) -> list[Decision]:
    rng = random.Random(seed)
    rl = RateLimit(backend, f"diff-{uuid.uuid4().hex[:8]}")
    decisions = []
    for _ in range(250):
        clock.advance(rng.choice([0.0, 0.001, 0.013, 0.1, 0.25, 0.7, 1.5]))
        index = rng.randrange(len(TREES))
        values = selecting(TREES[index], user=rng.choice(USERS), ip=rng.choice(IPS), apikey="k1")
        limit = rl.limit(TREES[index], key=f"tree{index}", **values)
        decisions.append(await limit.decide())
    return decisions


async def compare(backends: dict[str, tuple[Backend, FakeClock]], seed: int) -> None:
    traces = {name: await run_trace(b, c, seed) for name, (b, c) in backends.items()}
    reference_name, reference = next(iter(traces.items()))
    assert sum(d.allowed for d in reference) not in (0, len(reference))  # a trace that decides
    for name, trace in traces.items():
        for step, (want, got) in enumerate(zip(reference, trace, strict=True)):
            assert got == want, f"{name} differs from {reference_name} at step {step}"
            assert got.states == want.states, f"{name}'s states differ at step {step}"


@pytest.mark.parametrize("seed", seeds(6, 2))
@pytest.mark.parametrize("engine", [RedisScriptBackend, RedisCommandBackend])
@pytest.mark.parametrize("server", ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
async def test_memory_and_redis_engines_decide_alike(
    seed: int,
    engine: type[RedisScriptBackend | RedisCommandBackend],
    server: str,
    request: pytest.FixtureRequest,
) -> None:
    client: aioredis.Redis = (
        fakeredis.FakeAsyncRedis()
        if server == "fakeredis"
        else aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    )
    memory_clock, redis_clock = FakeClock(), FakeClock()
    try:
        await compare(
            {
                "memory": (MemoryBackend(clock=memory_clock), memory_clock),
                f"{server}-{engine.__name__}": (engine(client, clock=redis_clock), redis_clock),
            },
            seed,
        )
    finally:
        await client.aclose()


# --- property: random trees and call sequences through memory, script and command engines ---

SELECTORS = [None, "user", "ip", "apikey", "org"]
VALUES = ["a", "b", "c", None, ""]
SPANS_MS = [1, 50, 1000, 3000, 10_000, 60_000]
COUNTS = [1, 2, 3, 5, 65, 70, 130]
STEPS = [0.0, 0.0, 0.0005, 0.001, 0.01, 0.3, 1.0, 2.5]

_rules = st.builds(
    Rule, st.sampled_from(COUNTS), st.sampled_from(SPANS_MS), st.sampled_from(SELECTORS)
)
_trees = trees(_rules, max_leaves=6).filter(outlasts_the_test)
_calls = st.lists(
    st.tuples(
        st.sampled_from(STEPS),
        st.integers(0, 4),
        st.integers(0, 4),
        st.integers(1, 8),
        st.sampled_from([1, 1, 1, 2, 3, 0.5, 0.1, 1.25]),
    ),
    min_size=1,
    max_size=40,
)


async def run_all_engines(
    tree: Node, calls: list[tuple[float, int, int, int, float]], algorithm: str
) -> None:
    script_client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    command_client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    clocks = [FakeClock(), FakeClock(), FakeClock()]
    memory = MemoryBackend(clock=clocks[0])
    backends: list[Backend] = [
        memory,
        RedisScriptBackend(script_client, clock=clocks[1]),
        RedisCommandBackend(command_client, clock=clocks[2]),
    ]
    limiters = [RateLimit(b, "prop", algorithm=algorithm) for b in backends]
    if algorithm == "gcra":
        tree = map_rules(tree, with_burst)
    try:
        smallest = min(gcra_burst(rule) for rule in compile_tree(tree).rules)
        for step, (advance, user, ip, repeat, drawn) in enumerate(calls):
            whole = algorithm in ("sliding-log", "gcra")
            cost = min(max(1, int(drawn)) if whole else drawn, smallest)
            for clock in clocks:
                clock.advance(advance)
            values = selecting(tree, user=VALUES[user], ip=VALUES[ip], apikey="k", org=VALUES[user])
            for _ in range(repeat):
                decisions = [
                    await rl.limit(tree, key="k", cost=cost, **values).decide() for rl in limiters
                ]
                assert decisions[1] == decisions[0], f"script differs at step {step}"
                assert decisions[2] == decisions[0], f"commands differ at step {step}"
                states = decisions[0].states
                assert decisions[1].states == states, f"script's states differ at step {step}"
                assert decisions[2].states == states, f"commands' states differ at step {step}"
        now = round(clocks[0]() * 1_000_000)
        if algorithm == "gcra":
            await compare_arrivals(tree, now, memory, script_client, command_client)
            return
        if algorithm != "sliding-log":
            await compare_counters(tree, now, memory, script_client, command_client)
            return
        # The final state: every stored log equal, once entries older than every span on the
        # identifier are set aside (memory forgets them on its fake clock; Redis keys expire
        # on the real one).
        keys = sorted(await script_client.keys("*"))
        lock_wakes = await command_client.keys("*:lock:wake")  # the lock's wake-ups
        assert keys == sorted(set(await command_client.keys("*")) - set(lock_wakes))
        logs = memory.logs()
        assert {identifier_key(i).encode() for i in logs} <= set(keys)
        for identifier in {*logs} | {i for i in all_identifiers(tree)}:
            key = identifier_key(identifier)
            horizon = now - max_span_us(tree, identifier.selector)
            stored = [[t for t in logs.get(identifier, ()) if t > horizon]]
            for client in (script_client, command_client):
                stored.append([int(t) for t in await client.lrange(key, 0, -1) if int(t) > horizon])
                ttl = await client.pttl(key)
                assert ttl == -2 or 0 < ttl <= 2 * 3_600_000, key  # absent, or expiring
            assert stored[1] == stored[0], key
            assert stored[2] == stored[0], key
    finally:
        await script_client.aclose()
        await command_client.aclose()


async def compare_counters(
    tree: Node, now: int, memory: MemoryBackend, *clients: aioredis.Redis
) -> None:
    """Every live window's count is equal in memory and in each Redis."""
    counters = memory.counters()
    for identifier in all_identifiers(tree):
        expected = {
            (size, index): count
            for (size, index), count in counters.get(identifier, {}).items()
            if index >= now // size - 1
        }
        for client in clients:
            raw = await client.hgetall(counter_key(identifier))
            fields = {_text(k): _text(v) for k, v in raw.items()}
            stored = {}
            for name, value in fields.items():
                if not name.endswith("w"):
                    size = int(name.split(":")[0])
                    index = int(fields[name + "w"])
                    if index >= now // size - 1:
                        stored[(size, index)] = float(value)
            assert stored == expected, counter_key(identifier)


def with_burst(rule: Rule) -> Rule:
    """GCRA traces also try bursts: none, 1 (strict spacing), or above the count."""
    choice = SPANS_MS.index(rule.span_ms) % 3
    return dataclasses.replace(rule, burst=(None, 1, rule.count + 3)[choice])


async def compare_arrivals(
    tree: Node, now: int, memory: MemoryBackend, *clients: aioredis.Redis
) -> None:
    """Every arrival time still ahead of now is equal in memory and in each Redis."""
    rules = compile_tree(tree).rules
    for identifier in all_identifiers(tree):
        entry = memory._arrivals.get(identifier)
        for rule in (r for r in rules if r.selector == identifier.selector):
            for field in (gcra_field(rule),):
                us, rem = (0, 0) if entry is None else entry.tats.get(field, (0, 0))
                count = None if entry is None else entry.rates.get(field)
                ahead = (us, rem) > (now, 0)
                expected = f"{us}:{rem}:{count}" if ahead else None
                for client in clients:
                    stored = await client.get(arrival_key(identifier, rule, field))
                    text = None if stored is None else _text(stored)
                    if text is not None:
                        us_text, _, rest = text.partition(":")
                        if (int(us_text), int(rest.partition(":")[0] or 0)) <= (now, 0):
                            text = None  # passed: as good as gone
                    assert text == expected, arrival_key(identifier, rule, field)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def max_span_us(tree: Node, selector: str | None) -> int:
    return 1000 * max(r.span_ms for r in compile_tree(tree).rules if r.selector == selector)


def all_identifiers(tree: Node) -> list[Identifier]:
    selectors = {r.selector for r in compile_tree(tree).rules}
    return [
        Identifier("prop", "k", s, None if s is None else v)
        for s in selectors
        for v in (["x"] if s is None else ["a", "b", "c", "k"])
    ]


@settings(
    max_examples=examples(90, 30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(_trees, _calls, st.sampled_from(ALGORITHMS))
def test_every_engine_decides_and_stores_alike(
    tree: Node, calls: list[tuple[float, int, int, int, float]], algorithm: str
) -> None:
    asyncio.run(run_all_engines(tree, calls, algorithm))
