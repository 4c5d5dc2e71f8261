"""Penalties, as an outside tester would try them: values that are not plain words, the
exact count that starts a hold, on every store (the ``make`` fixture of test_penalties);
and the script engine's hold read going through its automatic pipeline as decisions do."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest

from ratelimit import RateLimit
from ratelimit.backends.redis import RedisScriptBackend
from tests.conftest import FakeClock
from tests.test_penalties import Make, make, refuse

__all__ = ["make"]  # the fixture, parametrized over every store

VALUES = ["a:b", "x=y", "{tag}", "with space", "ünï©ødé", "a]b[c*?", '"q"', "a,b", "null"]


async def test_values_of_any_text_are_held_listed_and_lifted(make: Make, clock: FakeClock) -> None:
    rl, other = make(), make()
    key, penalty = "k:{x}=", "2 refusals/m for 10m"
    for value in VALUES:
        limit = rl.limit("ip:1/h", key=key, ip=value, penalty=penalty)
        decisions = await refuse(limit, 3)
        assert [d.penalty is not None for d in decisions] == [False, False, True], value
    holds = await other.penalties.list()
    assert sorted(h.value or "" for h in holds) == sorted(VALUES)
    assert {(h.key, h.selector) for h in holds} == {(key, "ip")}
    for value in VALUES:
        assert await other.penalties.lift(key, ip=value) == 1, value
    assert await other.penalties.list() == []


@pytest.mark.parametrize("count", [1, 2, 5])
async def test_exactly_count_refusals_start_a_hold(make: Make, count: int) -> None:
    rl = make()
    limit = rl.limit("ip:1/h", key="c", ip="z", penalty=f"{count} refusals/m for 10m")
    decisions = await refuse(limit, count + 2)
    assert decisions[0].allowed
    assert [d.penalty is not None for d in decisions[1:]] == [False] * (count - 1) + [True] * 2


async def test_the_script_engine_reads_holds_through_its_pipeline(clock: FakeClock) -> None:
    backend = RedisScriptBackend(fakeredis.FakeAsyncRedis(), clock=clock, owns_client=True)
    rl = RateLimit(backend, "piped")
    limit = rl.limit("ip:100/h", key="k", ip="1.2.3.4", penalty="5 refusals/m for 1h")
    for _ in range(10):
        assert (await limit.decide()).allowed
    sent = backend._pipeline.calls_per_script
    assert sum(size * n for size, n in sent.items()) == 10  # ten decisions, each reading its hold
    await rl.aclose()


async def test_refusals_crossing_together_start_one_hold(make: Make) -> None:
    """Thirty refusals at once of a penalty of five (interleaved on the command engine's
    several round trips, as processes would be): one hold starts, once."""
    rl = make()
    store: Any = rl._decider.backend
    note, started = store.note_refusal, []

    async def counted(*args: Any) -> float:
        seconds: float = await note(*args)
        started.append(seconds > 0)
        return seconds

    store.note_refusal = counted
    limit = rl.limit("ip:1/h", key="t", ip="z", penalty="5 refusals/m for 10m")
    assert (await limit.decide()).allowed
    decisions = await asyncio.gather(*(limit.decide() for _ in range(30)))
    assert not any(d.allowed or d.degraded for d in decisions)
    assert sum(started) == 1
    assert len(started) >= 5
    assert (await limit.decide()).penalty == pytest.approx(600)
    del store.note_refusal


LONG = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(3000))  # 9 kB, incompressible


@pytest.mark.parametrize(
    "value",
    ["nul\x00byte", "lone\ud800surrogate", "50%25", LONG],
    ids=["nul", "surrogate", "percent", "long"],
)
async def test_no_value_escapes_its_hold(make: Make, value: str) -> None:
    """A value PostgreSQL's text cannot hold (NUL, a lone surrogate), or too long for its
    index, was never noted there (the note failed, logged): such a client was never held
    back. Any value is held on every store, and listed and lifted by its own text."""
    rl = make()
    limit = rl.limit("user:1/h", key="odd", user=value, penalty="2 refusals/m for 10m")
    decisions = await refuse(limit, 4)
    assert [d.penalty is not None for d in decisions] == [False, False, True, True]
    holds = await rl.penalties.list(key="odd")
    assert len(holds) == 1
    if holds[0].value != value:  # only a digest is kept of a value this long on Postgres
        assert value == LONG
        assert (holds[0].value or "").startswith("%#")
    assert await rl.penalties.lift("odd", user=value) == 1
    assert (await limit.decide()).penalty is None


async def test_the_script_engine_notes_refusals_through_its_pipeline(clock: FakeClock) -> None:
    backend = RedisScriptBackend(fakeredis.FakeAsyncRedis(), clock=clock, owns_client=True)
    rl = RateLimit(backend, "piped")
    limit = rl.limit("ip:1/h", key="k", ip="1.2.3.4", penalty="50 refusals/m for 1h")
    assert [(await limit.decide()).allowed for _ in range(5)] == [True] + [False] * 4
    sent = backend._pipeline.calls_per_script
    # two decisions reading their hold, three hold reads before the denial cache's refusals
    # (the last three), four notes
    assert sum(size * n for size, n in sent.items()) == 2 + 3 + 4
    await rl.aclose()


async def test_many_held_clients_are_not_all_remembered(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each hold a process found was remembered until that client asked again: clients
    held once and never seen again stayed in memory for the limiter's life."""
    from ratelimit import MemoryBackend
    from ratelimit.penalties import penalizer as penalizing

    monkeypatch.setattr(penalizing, "REMEMBERED", 10, raising=False)
    rl = RateLimit(MemoryBackend(clock=clock), "many")
    for n in range(50):
        limit = rl.limit("ip:1/h", key="k", ip=f"10.0.0.{n}", penalty="1 refusal/m for 1h")
        assert (await refuse(limit, 2))[1].penalty is not None
        clock.advance(2)  # past what the process trusts without asking
    assert len(penalizing._holds(rl._decider)) <= 10
    await rl.aclose()


async def test_memory_forgets_refusals_and_holds_of_clients_gone(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memory:// kept the refusals of a value refused once (and a hold that ended) until
    that value was refused again: values seen once stayed for the process's life."""
    from ratelimit import MemoryBackend
    from ratelimit.backends.memory import penalties as memory_penalties

    monkeypatch.setattr(memory_penalties, "SWEEP_EVERY", 16, raising=False)
    backend = MemoryBackend(clock=clock)
    rl = RateLimit(backend, "gone")
    for n in range(200):  # each value refused once (kept 1 m), one in ten held (for 1 m)
        limit = rl.limit("user:1/h", key="k", user=f"u{n}", penalty="3 refusals/m for 1m")
        await refuse(limit, 2 if n % 10 else 4)
        clock.advance(1)
    refusals, holds = backend._penalty_tables()
    assert len(refusals) + len(holds) <= 80  # about the last minute's, not all 200
    assert (
        await rl.limit("user:1/h", key="k", user="u190", penalty="3 refusals/m for 1m").peek()
    ).penalty
    await rl.aclose()


@pytest.mark.postgres
async def test_postgres_deletes_rows_of_values_gone(
    request: pytest.FixtureRequest, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL kept a row per value ever refused until holds were listed or lifted:
    values refused once stayed for ever. Every SWEEP_EVERY notes, rows past their time go."""
    import uuid

    import asyncpg

    from ratelimit.backends.postgres import penalties as postgres_penalties
    from tests.conftest import store_backend

    monkeypatch.setattr(postgres_penalties, "SWEEP_EVERY", 16, raising=False)
    backend = store_backend(request, "postgres", clock)
    namespace = f"sweep-{uuid.uuid4().hex[:8]}"
    rl = RateLimit(backend, namespace, algorithm="fixed-window")
    for n in range(100):  # each value refused once: kept for the span, a minute
        await refuse(rl.limit("user:1/h", key="k", user=f"u{n}", penalty="3 refusals/m for 1m"), 2)
        clock.advance(1)
    connection = await asyncpg.connect(request.getfixturevalue("postgres_url"))
    try:
        kept = await connection.fetchval(
            "SELECT count(*) FROM ratelimit_penalties WHERE namespace = $1", namespace
        )
    finally:
        await connection.close()
    assert kept <= 80  # about the last minute's values, not all 100
    await rl.aclose()


@pytest.mark.parametrize("use_scripts", [True, False])
async def test_redis_index_of_holds_keeps_only_those_in_force(
    clock: FakeClock, use_scripts: bool
) -> None:
    """The index of a namespace's holds dropped ended holds only when listed: under a
    steady stream of holds (each pushing its expiry on) it grew for ever."""
    from ratelimit.backends.redis import RedisCommandBackend
    from ratelimit.backends.redis.penalties import penalties_key

    client = fakeredis.FakeAsyncRedis()
    engine = RedisScriptBackend if use_scripts else RedisCommandBackend
    rl = RateLimit(engine(client, clock=clock, owns_client=True), "index")
    for n in range(60):  # a hold of a minute started every ten seconds
        limit = rl.limit("ip:1/h", key="k", ip=f"10.0.0.{n}", penalty="1 refusal/m for 1m")
        assert (await refuse(limit, 2))[1].penalty is not None
        clock.advance(10)
    index = penalties_key("index")
    kept = await (
        client.zcard(index) if await client.type(index) == b"zset" else client.hlen(index)
    )
    assert kept <= 7  # the holds of the last minute, not all 60
    assert len(await rl.penalties.list()) == 5
    await rl.aclose()


async def test_redis_lifts_many_holds_in_one_round_trip(clock: FakeClock) -> None:
    """Lifting every hold of a key took two round trips per hold, all within one
    ``timeout`` (0.25 s by default): a few hundred holds could not be lifted at once."""
    client = fakeredis.FakeAsyncRedis()
    rl = RateLimit(RedisScriptBackend(client, clock=clock, owns_client=True), "lift")
    for n in range(300):
        limit = rl.limit(
            "ip:1/h", key="k", ip=f"10.0.{n // 250}.{n % 250}", penalty="1 refusal/m for 1h"
        )
        await refuse(limit, 2)
    sent = 0
    execute: Any = client.execute_command

    async def counted(*args: Any, **options: Any) -> Any:
        nonlocal sent
        sent += 1
        return await execute(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]
    assert await rl.penalties.lift("k") == 300
    assert sent <= 3  # the index read (and the clock); the deletes go as one pipeline
    assert await rl.penalties.list() == []
    await rl.aclose()
