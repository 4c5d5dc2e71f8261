"""The Postgres strategy (issue 15) on a real PostgreSQL server the tests start: every
decision equal to the memory backend's on the same traces (states included), the counter
API, resets, a clock stepping back, failures, and 4 processes of 50 coroutines admitting
exactly the limit."""

from __future__ import annotations

import asyncio
import gc
import random
import uuid
import warnings
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from ratelimit import (
    BackendError,
    ConfigurationError,
    LimiterClosedError,
    MemoryBackend,
    RateLimit,
)
from ratelimit.backends.postgres import PostgresBackend
from ratelimit.backends.synced import SyncedBackend
from tests.conftest import FakeClock, selecting
from tests.postgres_server import PostgresServer
from tests.redis_server import free_port
from tests.test_differential import IPS, TREES, USERS
from tests.workers import run_workers

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

ALGORITHMS = ["sliding-window", "fixed-window"]


def limiters(url: str, algorithm: str) -> tuple[RateLimit, RateLimit, FakeClock, FakeClock]:
    namespace = f"pg-{uuid.uuid4().hex[:8]}"
    memory_clock, pg_clock = FakeClock(), FakeClock()
    memory = RateLimit(MemoryBackend(clock=memory_clock), namespace, algorithm=algorithm)
    postgres = RateLimit(
        PostgresBackend(url, clock=pg_clock, timeout=10), namespace, algorithm=algorithm
    )
    return memory, postgres, memory_clock, pg_clock


def synced_store(rl: RateLimit) -> SyncedBackend:
    """The synced counters ``sync_rate`` gave ``rl`` (its public ``storage``)."""
    assert isinstance(rl.storage, SyncedBackend)
    return rl.storage


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", range(3))
async def test_postgres_decides_as_memory_does(
    postgres_url: str, algorithm: str, seed: int
) -> None:
    memory, postgres, memory_clock, pg_clock = limiters(postgres_url, algorithm)
    rng = random.Random(seed)
    allowed = 0
    try:
        for step in range(200):
            advance = rng.choice([0.0, 0.0, 0.0, 0.0, 0.001, 0.013, 0.1, 1.5])
            memory_clock.advance(advance)
            pg_clock.advance(advance)
            index = rng.randrange(len(TREES))
            values: dict[str, Any] = {
                "user": rng.choice(USERS),
                "ip": rng.choice(IPS),
                "apikey": "k1",
            }
            cost = rng.choice([1, 1, 1, 0.5, 0.25])  # every tree has a rule of count 1
            given = selecting(TREES[index], **values)
            want = await memory.limit(TREES[index], key=f"t{index}", cost=cost, **given).decide()
            got = await postgres.limit(TREES[index], key=f"t{index}", cost=cost, **given).decide()
            assert got == want, f"step {step}"
            assert got.states == want.states, f"states at step {step}"
            allowed += got.allowed
    finally:
        await postgres.aclose()
    assert 0 < allowed < 200


async def test_the_counter_api_reset_and_peek(postgres_url: str) -> None:
    memory, postgres, memory_clock, pg_clock = limiters(postgres_url, "sliding-window")
    try:
        for rl in (memory, postgres):
            assert await rl.increment("api", 60, 2.5) == 2.5
            assert await rl.sliding_window("api", 60) == 2.5
        for clock in (memory_clock, pg_clock):
            clock.advance(90)  # half into the next window: the old one weighs half
        assert await postgres.sliding_window("api", 60) == await memory.sliding_window("api", 60)
        assert await postgres.increment("api", 60, -1, weight=0) == -1
        limit = postgres.limit("user:2/m", user="ann")
        assert (await limit.peek()).remaining == 1
        assert [(await limit.decide()).allowed for _ in range(3)] == [True, True, False]
        await limit.reset()
        assert (await limit.decide()).allowed
    finally:
        await postgres.aclose()


async def test_a_clock_stepping_back_never_admits_more(postgres_url: str) -> None:
    _, postgres, _, clock = limiters(postgres_url, "fixed-window")
    try:
        limit = postgres.limit("5/h", key="back")
        assert [(await limit.decide()).allowed for _ in range(6)] == [True] * 5 + [False]
        clock.advance(-3600)
        assert not (await limit.decide()).allowed
        clock.advance(3600 + 7200)
        assert (await limit.decide()).allowed
    finally:
        await postgres.aclose()


async def test_the_schema_is_made_at_first_use_and_expired_rows_go(postgres_url: str) -> None:
    _, postgres, _, clock = limiters(postgres_url, "sliding-window")
    backend = postgres.storage
    assert isinstance(backend, PostgresBackend)
    try:
        await postgres.limit("user:10/s", user="gone").decide()
        connection = await asyncpg.connect(postgres_url)
        try:
            query = "SELECT count(*) FROM ratelimit_counters WHERE key LIKE $1"
            pattern = f"%{postgres.namespace}%gone%"
            assert await connection.fetchval(query, pattern) == 1
            clock.advance(3)  # past two windows of a second
            await backend.cleanup()
            assert await connection.fetchval(query, pattern) == 0
        finally:
            await connection.close()
    finally:
        await postgres.aclose()


def test_what_postgres_does_not_keep_is_refused_when_made() -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    with pytest.raises(ConfigurationError, match="Postgres keeps window counters"):
        RateLimit.from_url(url)  # the sliding log, the default
    with pytest.raises(ConfigurationError, match="not 'gcra'"):
        RateLimit.from_url(url, algorithm="gcra")
    with pytest.raises(TypeError, match="postgresql:// takes timeout= only"):
        RateLimit.from_url(url, algorithm="fixed-window", use_scripts=False)


async def test_an_unreachable_database_follows_on_error() -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    rl = RateLimit.from_url(url, algorithm="fixed-window", timeout=5)
    decision = await rl.limit("1/s").decide()
    assert decision.allowed
    assert decision.degraded
    strict = RateLimit.from_url(url, algorithm="fixed-window", on_error="raise", timeout=5)
    with pytest.raises(BackendError, match="postgres failed to decide"):
        await strict.limit("1/s").decide()
    await rl.aclose()
    await strict.aclose()


async def test_a_database_down_at_start_is_used_once_it_answers(postgres_url: str) -> None:
    """The pool is opened at first use; when that fails, a later call opens it again."""
    port = free_port()
    rl = RateLimit.from_url(
        f"postgresql://postgres@127.0.0.1:{port}/postgres", algorithm="fixed-window", timeout=5
    )
    try:
        assert (await rl.limit("2/h", key="late").decide()).degraded
        with PostgresServer(port=port):
            decisions = [await rl.limit("2/h", key="late").decide() for _ in range(3)]
            assert [d.degraded for d in decisions] == [False] * 3
            assert [d.allowed for d in decisions] == [True, True, False]
    finally:
        await rl.aclose()


@pytest.mark.long
@pytest.mark.redis
async def test_four_processes_of_fifty_coroutines_admit_exactly_fifty(
    postgres_url: str, redis_url: str, redis_client: aioredis.Redis
) -> None:
    namespace = f"pg-{uuid.uuid4().hex[:8]}"
    outputs = await run_workers(
        redis_client,
        namespace,
        "tests.concurrency_worker",
        *(redis_url, namespace, "50", "postgres", postgres_url),
    )
    assert sum(int(out) for out in outputs) == 50


async def test_sync_rate_pushes_diffs_and_reads_totals(postgres_url: str) -> None:
    """Kong's mode on Postgres: decisions are local until a sync, which pushes every diff and
    reads every total in one round trip; two limiters then see each other's hits."""
    clock = FakeClock()
    namespace = f"pg-{uuid.uuid4().hex[:8]}"

    def synced() -> RateLimit:
        return RateLimit.from_url(
            postgres_url, namespace, algorithm="sliding-window", sync_rate=60, clock=clock
        )

    one, two = synced(), synced()
    try:
        stores = [synced_store(one), synced_store(two)]
        limit_one, limit_two = one.limit("5/m", key="k"), two.limit("5/m", key="k")
        assert sum([(await limit_one.decide()).allowed for _ in range(5)]) == 5
        assert sum([(await limit_two.decide()).allowed for _ in range(5)]) == 5  # unseen yet
        for store in (*stores, stores[0]):
            await store.sync()
        assert not (await limit_one.decide()).allowed
        assert not (await limit_two.decide()).allowed
        assert await one.sliding_window("k", 60) == 10.0
        with pytest.raises(ConfigurationError, match="holds no concurrency slots"):
            one.concurrency("5")
    finally:
        await one.aclose()
        await two.aclose()
    for store in stores:  # closed with its limiter: a sync reaches Postgres no more
        with pytest.raises(LimiterClosedError):
            await store.sync()


async def test_a_failed_sync_keeps_its_diffs() -> None:
    rl = RateLimit.from_url(
        "postgresql://nobody@127.0.0.1:1/none", algorithm="fixed-window", sync_rate=60, timeout=5
    )
    backend = synced_store(rl)
    assert (await rl.limit("5/m", key="k").decide()).allowed
    with pytest.raises(BackendError):
        await backend.sync()
    assert backend.unsynced() == 1.0
    await rl.aclose()


def test_a_limiter_used_by_loops_in_turn_leaves_no_connection_open(postgres_url: str) -> None:
    """Two ``asyncio.run()`` in turn, then a third that closes: the pools of the ended
    loops were forgotten with their connections open (ResourceWarning: unclosed
    connection, unclosed transport), found when the collector ran."""
    rl = RateLimit.from_url(
        postgres_url, f"loops-{uuid.uuid4().hex[:8]}", algorithm="sliding-window", max_size=2
    )

    async def decide() -> bool:
        return (await rl.limit("10/m", key="k").decide()).allowed

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        assert asyncio.run(decide())
        assert asyncio.run(decide())  # the first loop's pool is left here
        asyncio.run(rl.aclose())  # and the second's here
        gc.collect()
    assert [str(w.message) for w in seen if w.category is ResourceWarning] == []


async def test_a_verdict_its_counts_contradict_stands_and_is_logged(
    postgres_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46: Postgres's function decided (and recorded) already; where its counts say
    otherwise (a bug in one twin), its verdict stands and the disagreement is logged once,
    not raised as a storage failure that the failure policy would answer (``allow``: the
    call admitted as degraded, quietly)."""
    import logging

    backend = PostgresBackend(postgres_url, timeout=10)
    rl = RateLimit(backend, f"pg-{uuid.uuid4().hex[:8]}", algorithm="fixed-window")
    limit = rl.limit("user:2/m", user="ann")
    try:
        assert (await limit.decide()).allowed  # the schema made, a first real decision
        real = backend._guarded

        async def contradicted(work: Any, what: str, sync: bool = False) -> Any:
            reply = await real(work, what, sync)
            return [0.0, *reply[1:]] if "decide" in what else reply  # refused, counts say no

        monkeypatch.setattr(backend, "_guarded", contradicted)
        with caplog.at_level(logging.ERROR, logger="ratelimit"):
            first, second = await limit.decide(), await limit.decide()
        assert not first.allowed
        assert not first.degraded
        assert not second.allowed
        assert not second.degraded
        logged = [r.getMessage() for r in caplog.records if "disagree" in r.getMessage()]
        assert len(logged) == 1, logged
        assert "refused a call of key" in logged[0]
    finally:
        await rl.aclose()
