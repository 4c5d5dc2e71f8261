"""One script call carries a batch: each call in it decided exactly as alone.

Seeded traces of concurrent calls (every algorithm, costs, settles) run through the script
engine with batching on and against the in-process reference, on fakeredis and a real
redis-server; a call that errs inside a batch errs alone; the batch script comes back after
``SCRIPT FLUSH``; on Redis Cluster a batch holds one slot's calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import uuid
from collections.abc import Coroutine
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ratelimit import BackendError, Limit, MemoryBackend, RateLimit, RedisScriptBackend
from ratelimit.algorithms import ALGORITHMS
from ratelimit.backends.base import Backend
from ratelimit.backends.redis.resp import Command, Script, pack, pack_args
from ratelimit.backends.redis.script.batch import BATCH, BATCHED, SHARED, combine, split, tag_of
from ratelimit.core.decision import Decision
from tests.conftest import FakeClock, seeds, selecting

pytestmark = pytest.mark.timeout(120)

TREES = {
    "sliding-log": ["user:3/s | 1000/10s", "user:2/s & ip:3/s | ip:1000/10s & user:1000/10s"],
    "sliding-window": ["user:3/s | 1000/10s", "user:2/s & ip:3/s | ip:1000/10s"],
    "fixed-window": ["user:3/s | 1000/10s", "user:2/s & ip:3/s | ip:1000/10s"],
    "gcra": ["user:3/s burst 2 | 1000/10s", "user:2/s & ip:3/s burst 3 | ip:1000/10s"],
}
USERS = ["alice", "bob", "carol"]
IPS = ["10.0.0.1", "10.0.0.2"]


# --- combine and split, without a server ---


def _command(script: Script, *keys: str) -> Command:
    args = (b"", b"x")
    return Command(script, list(keys), args, pack_args(args))


OTHER = Script("return 1")


def test_every_batched_script_leaves_its_cache_to_the_batch() -> None:
    """The batch drops each script's own ``parsed`` line so that its calls share one: a
    script without that line would miss it silently (and parse alone). A script that
    parses nothing into it (``sliding_log_one.lua``) has neither the cache nor the line."""
    for script in BATCHED:
        source = script.source.decode()
        assert source.count(SHARED) == (1 if "numbers(" in source else 0)
    assert SHARED not in BATCH.source.decode()


def test_batchable_calls_go_as_one_call_where_the_first_was() -> None:
    decide, settle = BATCHED[0], BATCHED[1]
    commands = [
        _command(OTHER, "rl:{a:k}:s"),
        _command(decide, "rl:{a:k}:1"),
        _command(OTHER, "rl:{a:j}:s"),
        _command(settle, "rl:{a:j}:2", "rl:{a:j}:3"),
        _command(decide, "rl:{a:k}:4"),
    ]
    sent, layout = combine(commands, by_slot=False)
    assert layout == [[0], [1, 3, 4], [2]]
    assert [c.script for c in sent] == [OTHER, BATCH, OTHER]
    batch = sent[1]
    assert batch.keys == ["rl:{a:k}:1", "rl:{a:j}:2", "rl:{a:j}:3", "rl:{a:k}:4"]
    numbers = [BATCHED.index(decide) + 1, BATCHED.index(settle) + 1]
    assert batch.args[0] == f"{numbers[0]} 1 2 {numbers[1]} 2 2 {numbers[0]} 1 2".encode()
    assert list(batch.args[1:]) == [b"", b"x"] * 3
    keys = [k.encode() for k in batch.keys]
    assert batch.packed == pack(b"EVALSHA", BATCH.sha, b"4", *keys, *batch.args)
    replies = split(["s1", ["d1", "t3", "d4"], "s2"], layout)
    assert replies == ["s1", "d1", "s2", "t3", "d4"]


def test_on_a_cluster_a_batch_holds_one_hash_tag() -> None:
    decide = BATCHED[0]
    commands = [
        _command(decide, "rl:{a:k}:1"),
        _command(decide, "rl:{a:j}:1"),
        _command(decide, "rl:{a:k}:2"),
    ]
    sent, layout = combine(commands, by_slot=True)
    assert layout == [[0, 2], [1]]
    assert tag_of(sent[0]) == "a:k"
    assert sent[0].keys == ["rl:{a:k}:1", "rl:{a:k}:2"]
    assert combine(commands[:2], by_slot=True) == (commands[:2], None)  # nothing joined


def test_a_batch_that_failed_whole_fails_each_call_and_a_short_reply_is_not_a_reply() -> None:
    layout = [[0, 1], [2]]
    error = ResponseError("BUSY")
    assert split([error, 7], layout) == [error, error, 7]
    short = split([[1], 7], layout)  # not the batch script's: something else answered
    assert isinstance(short[0], ValueError)
    assert short[0] is short[1]
    assert "a batch of 2 calls answered" in str(short[0])
    assert short[2] == 7


# --- seeded traces of concurrent calls, against the in-process reference ---


async def _trace(
    backend: Backend, clock: FakeClock, algorithm: str, seed: int, concurrent: bool = True
) -> list[Any]:
    """Groups of calls (decisions, and settles of earlier admissions) between clock steps,
    each group's calls concurrent (else one after another, in the same order); every
    decision and what each settle answered, in order."""
    rng = random.Random(seed)
    # no denial cache: it would answer a repeated refusal with the states it was given
    # earlier, when the calls one after another, and not those made together
    rl = RateLimit(backend, f"batch-{uuid.uuid4().hex[:8]}", algorithm=algorithm, denial_cache=0)
    whole = algorithm in ("sliding-log", "gcra")
    texts = TREES[algorithm]
    # the limiter's first reading of overrides, out of the way: a decision waiting for it
    # would let the calls started after it go first
    await rl.overrides.refresh()
    out: list[Any] = []
    admitted: list[tuple[int, Decision]] = []
    for _ in range(60):
        clock.advance(rng.choice([0.0, 0.001, 0.05, 0.3, 1.1]))
        # A group's first call goes out alone and the rest together behind it, possibly
        # while it is out: it decides a key of its own, so the order of the rest is the
        # order they were made in, on Redis as in the reference.
        calls: list[Coroutine[Any, Any, Any]] = [
            _decide(rl.limit(texts[0], key="lead", **selecting(texts[0], user="x", ip="y")), -1, 1)
        ]
        # a group settles, or decides: a settle reaches the pipeline a few steps later than
        # a decision made after it, so in one group their order would be Redis's to choose
        settling = rng.random() < 0.25
        for _ in range(rng.randint(1, 12)):
            n = rng.randrange(len(texts))
            drawn = selecting(texts[n], user=rng.choice(USERS), ip=rng.choice(IPS))
            limit = rl.limit(texts[n], key=f"k{n}", **drawn)
            if settling:
                if not admitted:
                    break
                m, decision = admitted.pop(rng.randrange(len(admitted)))
                actual = rng.choice([0, 1, 2]) if whole else rng.choice([0, 0.5, 1.5])
                calls.append(rl.limit(texts[m], key=f"k{m}").settle(decision, actual))
                continue
            cost = rng.choice([1, 1, 2]) if whole else rng.choice([1, 0.5, 2])
            calls.append(_decide(limit, n, cost))
        results = await asyncio.gather(*calls) if concurrent else [await c for c in calls]
        for result in results:
            if isinstance(result, tuple):
                n, decision = result
                out.append(decision)
                out.append(decision.states)
                if decision.allowed and n >= 0:
                    admitted.append((n, decision))
            else:
                out.append(result)
    return out


async def _decide(limit: Limit, n: int, cost: float) -> tuple[int, Decision]:
    return n, await limit.decide(cost=cost)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", seeds(3, 1))
@pytest.mark.parametrize("server", ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
async def test_batched_calls_decide_as_the_reference_does(
    algorithm: str, seed: int, server: str, request: pytest.FixtureRequest
) -> None:
    client: aioredis.Redis = (
        fakeredis.FakeAsyncRedis()
        if server == "fakeredis"
        else aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    )
    # Loaded first: a call that meets NOSCRIPT is sent again after the rest of its batch
    # (concurrent calls, so any order is right), which would reorder the trace.
    for script in (*BATCHED, BATCH):
        await client.script_load(script.source)
    clocks = FakeClock(), FakeClock(), FakeClock()
    backend = RedisScriptBackend(client, clock=clocks[1])
    alone = RedisScriptBackend(client, clock=clocks[2], batch_scripts=False)
    try:
        # the reference decides the same calls one after another: Redis gets a group's
        # calls in the order they were made
        want = await _trace(MemoryBackend(clock=clocks[0]), clocks[0], algorithm, seed, False)
        got = await _trace(backend, clocks[1], algorithm, seed)
        assert got == await _trace(alone, clocks[2], algorithm, seed)  # exactly, as alone
        # the reference's clock is a float: its waits differ below the microsecond
        assert _to_us(got) == _to_us(want)
        assert max(alone.calls_per_script) == 1
        sizes = backend.calls_per_script
        # the trace did go in batches; on Python 3.13 fakeredis answers a lone call without
        # yielding to the loop, so every call finds nothing in flight and goes alone
        if server == "redis" or sys.version_info < (3, 13):
            assert max(sizes) > 2, sizes
    finally:
        await backend.aclose()
        await alone.aclose()
        await client.aclose()


def _to_us(trace: list[Any]) -> list[Any]:
    def rounded(item: Any) -> Any:
        if isinstance(item, Decision):
            return dataclasses.replace(item, retry_after=round(item.retry_after, 6))
        if isinstance(item, tuple):
            return tuple(s._replace(reset_after=round(s.reset_after, 6)) for s in item)
        return item

    return [rounded(item) for item in trace]


# --- a batch on a real server: one call's error, the script flushed, the shared instant ---


async def _batched(client: aioredis.Redis) -> tuple[RedisScriptBackend, RateLimit]:
    backend = RedisScriptBackend(client)
    namespace = f"batch-{uuid.uuid4().hex[:8]}"
    return backend, RateLimit(backend, namespace, denial_cache=0, on_error="raise")


@pytest.mark.redis
async def test_a_call_that_errs_in_a_batch_errs_alone(redis_client: aioredis.Redis) -> None:
    backend, rl = await _batched(redis_client)
    try:
        broken = rl.limit("user:5/m", key="k", user="broken")
        await broken.decide()  # its log exists; now make it a string, which LLEN refuses
        key = next(k for k in await redis_client.keys(f"rl:{{{rl.namespace}:k}}:user=broken"))
        await redis_client.set(key, "not a list")
        users = ["a", "b", "broken", "c", "d"]
        results = await asyncio.gather(
            rl.limit("user:5/m", key="lead", user="x").decide(),
            *(rl.limit("user:5/m", key="k", user=u).decide() for u in users),
            return_exceptions=True,
        )
        assert isinstance(results[3], BackendError)
        assert "WRONGTYPE" in str(results[3])
        assert [d.allowed for n, d in enumerate(results) if n != 3] == [True] * 5  # type: ignore[union-attr]
        assert max(backend.calls_per_script) == 5  # they did share one script call
        # and the others were recorded: 4 more each admits exactly 4
        again = [await rl.limit("user:5/m", key="k", user="a").decide() for _ in range(5)]
        assert [d.allowed for d in again] == [True] * 4 + [False]
    finally:
        await rl.aclose()


@pytest.mark.redis
async def test_the_batch_script_comes_back_after_a_script_flush(
    redis_client: aioredis.Redis,
) -> None:
    backend, rl = await _batched(redis_client)
    try:
        limit = rl.limit("user:3/m", key="k", user="u")

        async def round_of_eight() -> list[bool]:
            lead = rl.limit("user:3/m", key="lead", user="x").decide()
            return [
                d.allowed
                for d in (await asyncio.gather(lead, *(limit.decide() for _ in range(7))))[1:]
            ]

        await redis_client.script_flush()
        assert await round_of_eight() == [True] * 3 + [False] * 4
        await redis_client.script_flush()
        assert await round_of_eight() == [False] * 7
        assert max(backend.calls_per_script) == 7
    finally:
        await rl.aclose()


@pytest.mark.redis
async def test_calls_in_a_batch_share_the_servers_instant(redis_client: aioredis.Redis) -> None:
    backend, rl = await _batched(redis_client)
    try:
        limits = [rl.limit("user:100/m", key="k", user=f"u{n}") for n in range(8)]
        await asyncio.gather(*(limit.decide() for limit in limits))
        assert max(backend.calls_per_script) == 7
        stamps = {
            int((await redis_client.lindex(key, 0)) or 0)
            for key in await redis_client.keys(f"rl:{{{rl.namespace}:k}}:user=u*")
            if not (key if isinstance(key, str) else key.decode()).endswith(":n")
        }
        assert len(stamps) == 2  # the first call's, alone, and the batch's one instant
    finally:
        await rl.aclose()
