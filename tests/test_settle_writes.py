"""A settle queued behind the batch in flight on the Redis script engine
(:mod:`ratelimit.pipeline.settle_writes`): its caller awaits a future of its own, so a caller
cancelled meanwhile never drops the write from its batch; the write, the failure policy
and the settle's answer happen as if it had waited, and ``aclose`` waits for them. The
same random settles, queued and sent alone, leave the same counts."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest

from ratelimit import BackendError, Limit, RateLimit, SettleError
from ratelimit.algorithms import ALGORITHMS
from ratelimit.backends import RedisScriptBackend
from ratelimit.core.decision import Decision
from ratelimit.core.settling import Settlement
from tests.conftest import FakeClock, store_backend

pytestmark = pytest.mark.timeout(60)

ENGINES = ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)]


def limiter(
    request: pytest.FixtureRequest, kind: str, clock: FakeClock, **options: Any
) -> RateLimit:
    backend = store_backend(request, kind, clock)
    assert isinstance(backend, RedisScriptBackend)
    return RateLimit(backend, f"writes-{uuid.uuid4().hex[:8]}", **options)


def spied(rl: RateLimit, monkeypatch: pytest.MonkeyPatch) -> list[Awaitable[Any]]:
    """What the engine's ``settle_write`` returns, call by call."""
    engine = rl.storage
    assert isinstance(engine, RedisScriptBackend)
    writes: list[Awaitable[Any]] = []
    original = engine.settle_write

    def settle_write(settlement: Settlement) -> Awaitable[Any]:
        writes.append(original(settlement))
        return writes[-1]

    monkeypatch.setattr(engine, "settle_write", settle_write)
    return writes


def held(rl: RateLimit, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Hold every batch the engine sends from now on until the event is set: a call in
    flight stays in flight however fast the server answers (fakeredis answers within the
    same turn of the loop on Python 3.13, so counting turns does not keep one out)."""
    engine = rl.storage
    assert isinstance(engine, RedisScriptBackend)
    pipeline = engine._pipeline
    original = pipeline._run
    gate = asyncio.Event()

    async def run(commands: list[Any]) -> list[Any]:
        await gate.wait()
        return await original(commands)

    monkeypatch.setattr(pipeline, "_run", run)
    return gate


async def in_flight(rl: RateLimit, limit: Limit, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A decision of ``limit`` sent and held (what is asked now is queued behind it), and
    the gate that lets it and what follows go."""
    gate = held(rl, monkeypatch)
    out = asyncio.ensure_future(limit.peek())
    engine = rl.storage
    assert isinstance(engine, RedisScriptBackend)
    for _ in range(100):
        if engine._pipeline._in_flight:
            break
        await asyncio.sleep(0)
    assert engine._pipeline._in_flight, "the decision was never sent"
    return out, gate


async def behind_a_call_in_flight(
    rl: RateLimit,
    limit: Limit,
    settles: Sequence[Awaitable[bool]],
    monkeypatch: pytest.MonkeyPatch,
) -> list[Any]:
    """Start ``settles`` while a decision is out (so that their writes are queued), cancel
    their callers once each is under way, and let the batch come back."""
    out, gate = await in_flight(rl, limit, monkeypatch)
    tasks = [asyncio.ensure_future(settle) for settle in settles]
    await asyncio.sleep(0)  # each settle under way: its write queued
    for task in tasks:
        task.cancel()
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await out
    return results


@pytest.mark.parametrize("kind", ENGINES)
async def test_queued_settles_whose_callers_are_cancelled_happen_and_answer_again(
    request: pytest.FixtureRequest,
    clock: FakeClock,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rl = limiter(request, kind, clock, on_error="raise")
    writes = spied(rl, monkeypatch)
    limits = [rl.limit("user:100/h", key="queued", user=f"u{i}") for i in range(20)]
    reserved = [await limit.decide(cost=50) for limit in limits]
    settles = [limit.settle(d, 10) for limit, d in zip(limits, reserved, strict=True)]
    results = await behind_a_call_in_flight(rl, limits[0], settles, monkeypatch)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert len(writes) == 20
    assert all(isinstance(w, asyncio.Future) and not w.cancelled() for w in writes)
    for limit, decision in zip(limits, reserved, strict=True):
        with pytest.raises(SettleError, match="being settled at"):
            await limit.settle(decision, 11)
        assert await limit.settle(decision, 10)  # the write it started, answered
        with pytest.raises(SettleError, match="settled already"):
            await limit.settle(decision, 10)
        assert (await limit.peek(cost=90)).allowed  # 10 of 100 used
        assert not (await limit.peek(cost=91)).allowed
    await rl.aclose()


@pytest.mark.redis
async def test_aclose_waits_for_queued_settles_whose_callers_left(
    request: pytest.FixtureRequest, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    rl = limiter(request, "redis", clock, on_error="raise")
    writes = spied(rl, monkeypatch)
    limits = [rl.limit("user:100/h", key="closing", user=f"u{i}") for i in range(20)]
    reserved = [await limit.decide(cost=50) for limit in limits]
    out, gate = await in_flight(rl, limits[0], monkeypatch)
    tasks = [
        asyncio.ensure_future(limit.settle(d, 100))
        for limit, d in zip(limits, reserved, strict=True)
    ]
    await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    gate.set()
    await rl.aclose()  # the writes still queued go out and are waited for
    await asyncio.gather(out, *tasks, return_exceptions=True)
    assert all(isinstance(w, asyncio.Future) and w.done() for w in writes)
    check = RateLimit(store_backend(request, "redis", clock), rl.namespace)
    for i in range(20):
        limit = check.limit("user:100/h", key="closing", user=f"u{i}")
        assert not (await limit.peek()).allowed  # the excess of 50 was recorded
    await check.aclose()


@pytest.mark.parametrize("on_error", ["allow", "raise"])
async def test_a_queued_settle_that_fails_answers_as_the_failure_policy_says(
    request: pytest.FixtureRequest,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    on_error: str,
) -> None:
    rl = limiter(request, "fakeredis", clock, on_error=on_error)
    engine = rl.storage
    assert isinstance(engine, RedisScriptBackend)
    failing: list[asyncio.Future[Any]] = []

    def settle_write(settlement: Settlement) -> Awaitable[Any]:
        failing.append(asyncio.get_running_loop().create_future())
        return failing[-1]

    monkeypatch.setattr(engine, "settle_write", settle_write)
    limit = rl.limit("10/m", key="failing")
    decision = await limit.decide(cost=5)
    settling = asyncio.ensure_future(limit.settle(decision, 1))
    await asyncio.sleep(0)
    failing[0].set_exception(BackendError("down"))
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        if on_error == "raise":
            with pytest.raises(BackendError, match="down"):
                await settling
        else:
            assert await settling is False
    assert sum("settles lost" in r.getMessage() for r in caplog.records) == (on_error == "allow")
    await rl.aclose()


async def settle_at_random(
    rng: random.Random,
    rl: RateLimit,
    limits: list[Limit],
    queued: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> list[bool]:
    """Reserve and settle at random on ``limits``: the settles all at once behind a call in
    flight (``queued``) or one at a time; then what peeks of 1 to 12 answer on each."""
    reservations: list[tuple[Limit, Decision, int]] = []
    for limit in limits:
        for _ in range(3):
            reservations.append(
                (limit, await limit.decide(cost=rng.randint(1, 4)), rng.randint(0, 6))
            )
    if queued:
        out, gate = await in_flight(rl, limits[0], monkeypatch)
        settles = asyncio.gather(*(limit.settle(d, real) for limit, d, real in reservations))
        await asyncio.sleep(0)  # each settle under way: its write queued
        gate.set()
        await settles
        await out
    else:
        for limit, d, real in reservations:
            await limit.settle(d, real)
    return [(await limit.peek(cost=n)).allowed for limit in limits for n in range(1, 13)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("kind", ENGINES)
async def test_settles_queued_and_sent_alone_leave_the_same_counts(
    request: pytest.FixtureRequest,
    clock: FakeClock,
    kind: str,
    algorithm: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed = random.randrange(1 << 30)
    answers = []
    for queued in (True, False):
        rl = limiter(request, kind, clock, algorithm=algorithm, on_error="raise")
        writes = spied(rl, monkeypatch)
        limits = [rl.limit("user:12/h", key="random", user=f"u{i}") for i in range(6)]
        answers.append(await settle_at_random(random.Random(seed), rl, limits, queued, monkeypatch))
        futures = sum(isinstance(w, asyncio.Future) for w in writes)
        assert futures == len(writes) if queued else futures == 0, seed
        await rl.aclose()
    assert answers[0] == answers[1], seed
