"""Automatic pipelining against a real redis-server: batching, isolation, NOSCRIPT, faults."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratelimit import BackendError, Decision, RateLimit
from ratelimit.backends.redis import resp
from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.pipeline import MAX_BATCH, Pipeline
from tests.conftest import loop_sees_closed_connections
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("redis_path")]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(server.url)
    yield redis
    await redis.aclose()


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch sent, in order (pipelines of one included)."""
    sizes: list[int] = []
    run = Pipeline._run

    async def counting(self: Pipeline, commands: list[Command]) -> list[object]:
        sizes.append(len(commands))
        return await run(self, commands)

    monkeypatch.setattr(Pipeline, "_run", counting)
    return sizes


async def each_user(
    rl: RateLimit, users: int, *, key: str = "k", rule: str = "user:5/m"
) -> list[Decision]:
    """One decision for each of ``users`` users, all at once."""
    return await asyncio.gather(
        *(rl.limit(rule, key=key, user=f"u{i}").decide() for i in range(users))
    )


async def script_loads(client: aioredis.Redis) -> int:
    """SCRIPT calls so far: ``script|load`` on Redis 7, every ``script`` call on 6.2."""
    stats = await client.info("commandstats")
    entry = stats.get("cmdstat_script|load") or stats.get("cmdstat_script") or {}
    calls: int = entry.get("calls", 0)
    return calls


async def test_concurrent_decisions_share_pipelines(
    client: aioredis.Redis, batches: list[int]
) -> None:
    rl = RateLimit(client, "pipe")
    decisions = await asyncio.gather(
        *(rl.limit("user:5/m", user=f"u{i}").decide() for i in range(100))
    )
    assert all(d.allowed and d.remaining == 4 for d in decisions)
    assert sum(batches) == 100
    assert batches[0] == 1, "the first call went out alone, at once"
    assert max(batches) == MAX_BATCH, batches  # the rest, together, as full as allowed
    assert len(batches) <= 2 + 100 // MAX_BATCH, batches
    await rl.aclose()


async def test_batches_are_bounded(client: aioredis.Redis, batches: list[int]) -> None:
    rl = RateLimit(client, "bounded")
    await each_user(rl, 400)
    assert sum(batches) == 400
    assert max(batches) == MAX_BATCH


async def test_a_lone_call_is_sent_at_once(
    client: aioredis.Redis, batches: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes: list[None] = []
    flush = Pipeline._flush

    def counting(self: Pipeline) -> None:
        flushes.append(None)
        flush(self)

    monkeypatch.setattr(Pipeline, "_flush", counting)
    rl = RateLimit(client, "lone")
    for _ in range(3):
        assert (await rl.limit("9/m", key="k").decide()).allowed
    assert batches == [1, 1, 1]
    assert flushes == [], "a lone call never waited for the end of the loop turn"


async def test_without_auto_pipeline_every_call_travels_alone(
    client: aioredis.Redis, batches: list[int]
) -> None:
    rl = RateLimit(client, "alone", auto_pipeline=False)
    decisions = await asyncio.gather(
        *(rl.limit("user:5/m", user=f"u{i}").decide() for i in range(50))
    )
    assert all(d.allowed for d in decisions)
    assert batches == [1] * 50


async def test_each_script_stays_atomic_in_a_batch(client: aioredis.Redis) -> None:
    rl = RateLimit(client, "atomic", denial_cache=0)
    limit = rl.limit("50/m", key="one")
    decisions = await asyncio.gather(*(limit.decide() for _ in range(200)))
    assert sum(d.allowed for d in decisions) == 50
    # each saw the count the one before it left (batches on several connections may run in
    # another order than they were made, so sorted): no two read the same count
    remaining = [d.remaining for d in decisions if d.allowed]
    assert sorted(remaining, reverse=True) == list(range(49, -1, -1))  # type: ignore[type-var]


async def test_a_failing_script_fails_alone(client: aioredis.Redis) -> None:
    rl = RateLimit(client, "isolated", on_error="raise")
    await client.set("rl:{isolated:k}:user=bad", "not a list")  # WRONGTYPE for that one call
    limits = [rl.limit("user:5/m", key="k", user=f"u{i}") for i in range(30)]
    limits[17] = rl.limit("user:5/m", key="k", user="bad")
    outcomes = await asyncio.gather(*(lim.decide() for lim in limits), return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(failed) == 1
    assert outcomes[17] is failed[0]
    assert isinstance(failed[0], BackendError)
    assert "'k'" in str(failed[0])
    assert "WRONGTYPE" in str(failed[0])
    others = [o for i, o in enumerate(outcomes) if i != 17]
    assert all(isinstance(o, Decision) and o.allowed for o in others)


async def test_failing_script_is_degraded_alone_under_fail_open(client: aioredis.Redis) -> None:
    rl = RateLimit(client, "open")
    await client.set("rl:{open:k}:user=bad", "not a list")
    users = [f"u{i}" for i in range(10)] + ["bad"]
    decisions = await asyncio.gather(
        *(rl.limit("user:5/m", key="k", user=u).decide() for u in users)
    )
    assert [d.degraded for d in decisions] == [False] * 10 + [True]


async def test_noscript_loads_once_for_the_whole_batch(client: aioredis.Redis) -> None:
    rl = RateLimit(client, "noscript")
    assert (await rl.limit("user:5/m", key="k", user="first").decide()).allowed
    await client.script_flush()
    loads = await script_loads(client)
    decisions = await asyncio.gather(
        *(rl.limit("user:5/m", key="k", user=f"u{i}").decide() for i in range(60))
    )
    assert all(d.allowed and not d.degraded for d in decisions)
    # Loaded once per batch (the lone first call, then each batch of the other 59 that went
    # out before the first load), never once per call.
    assert 1 <= await script_loads(client) - loads <= 1 + math.ceil(59 / MAX_BATCH)


async def test_a_paused_redis_fails_every_caller_of_the_batch_on_one_deadline(
    server: RedisServer, client: aioredis.Redis
) -> None:
    rl = RateLimit(client, "paused", on_error="raise", timeout=0.25)
    assert (await rl.limit("9/m", key="warm").decide()).allowed
    server.pause()
    try:
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(rl.limit("user:5/m", key="k", user=f"u{i}").decide() for i in range(20)),
            return_exceptions=True,
        )
        elapsed = time.monotonic() - started
    finally:
        server.resume()
    assert all(isinstance(o, BackendError) for o in outcomes)
    assert len({id(o) for o in outcomes}) == 20, "each caller gets an error of its own"
    assert "did not answer within 0.25 s" in str(outcomes[5])
    assert elapsed < 0.25 * 2 + 0.5  # the lone call's deadline, then the batch's
    decisions = await asyncio.gather(*(rl.limit("9/m", key="after").decide() for _ in range(5)))
    assert all(d.allowed for d in decisions), "the pipeline works again once Redis answers"


async def test_a_restarted_redis_costs_no_error(
    server: RedisServer, client: aioredis.Redis
) -> None:
    rl = RateLimit(client, "restart", on_error="allow")
    assert (await rl.limit("9/m", key="warm").decide()).allowed
    server.restart()
    await loop_sees_closed_connections()
    # both paths look for a connection Redis closed before writing (redis-py 8's pool
    # hands one out unchecked): not one decision is degraded
    decisions = await each_user(rl, 30)
    assert all(d.allowed and not d.degraded for d in decisions)
    decisions = await each_user(rl, 30, key="after")
    assert all(d.allowed and not d.degraded for d in decisions)


async def test_a_cancelled_caller_leaves_its_batch_alone(client: aioredis.Redis) -> None:
    rl = RateLimit(client, "cancel")
    lone = asyncio.create_task(rl.limit("9/m", key="lone").decide())
    await asyncio.sleep(0)  # the lone call is in flight; what follows is queued
    tasks = [
        asyncio.create_task(rl.limit("user:9/m", key="k", user=f"u{i}").decide()) for i in range(10)
    ]
    await asyncio.sleep(0)
    tasks[3].cancel()
    done = await asyncio.gather(lone, *tasks, return_exceptions=True)
    assert isinstance(done[4], asyncio.CancelledError)
    assert all(not isinstance(d, BaseException) and d.allowed for i, d in enumerate(done) if i != 4)
    assert (await rl.limit("9/m", key="again").decide()).allowed


class CountingPool(aioredis.ConnectionPool):
    """redis-py's pool, counting the connections it made and those lent out now."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.made = 0
        self.lent = 0

    def make_connection(self) -> Any:
        self.made += 1
        return super().make_connection()  # type: ignore[no-untyped-call]

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.lent += 1
        return connection

    async def release(self, connection: Any) -> None:
        self.lent -= 1
        await super().release(connection)


async def test_connections_go_back_to_the_pool_after_each_batch(server: RedisServer) -> None:
    pool = CountingPool.from_url(server.url)
    client = aioredis.Redis(connection_pool=pool)
    rl = RateLimit(client, "close")
    await each_user(rl, 500)
    # at most one kept between batches, from a pool with plenty free (small pools: none)
    assert pool.lent <= 1
    assert pool.made <= 4
    await rl.aclose()
    assert pool.lent == 0
    await client.aclose()
    await pool.disconnect()  # a pool given to a client stays its giver's to close


def test_auto_pipeline_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="auto_pipeline must be True or False"):
        RateLimit(aioredis.Redis(), auto_pipeline="yes")  # type: ignore[arg-type]


def test_auto_pipeline_applies_to_a_redis_client_only() -> None:
    with pytest.raises(TypeError, match="auto_pipeline"):
        RateLimit.from_url("memory://", auto_pipeline=False)


def test_pack_is_the_redis_protocol() -> None:
    assert resp.pack(b"GET", b"k") == b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"


@pytest.mark.parametrize("auto_pipeline", [True, False], ids=["batched", "alone"])
async def test_a_failed_write_is_a_backend_error_not_a_raw_one(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, auto_pipeline: bool
) -> None:
    rl = RateLimit(client, "write", on_error="raise", auto_pipeline=auto_pipeline)
    assert (await rl.limit("9/m", key="warm").decide()).allowed  # connected

    async def broken(self: object, commands: object, check_health: bool = True) -> None:
        raise OSError("connection reset")

    # the fast path writes through the private method, the public path through the public one
    monkeypatch.setattr(aioredis.connection.Connection, "_send_packed_command", broken)
    monkeypatch.setattr(aioredis.connection.Connection, "send_packed_command", broken)
    with pytest.raises(BackendError, match="redis failed to decide key 'warm': .*connection reset"):
        await rl.limit("9/m", key="warm").decide()
