"""A penalized limit on the Redis script engine reads its hold in its decision's own script
call (the held variants of the decision scripts, :mod:`ratelimit.backends.redis.script.held`):
one call per decision where the two-step way made two, and the same answers."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from typing import Any

import fakeredis
import pytest

from ratelimit import RateLimit, RateLimitExceeded
from ratelimit.backends.redis.script.engine import RedisScriptBackend
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from tests.conftest import FakeClock, store_backend

ENGINES = [
    "fakeredis",
    "fakeredis-spread",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-spread", marks=pytest.mark.redis),
]
ALGORITHMS = ["sliding-log", "gcra", "sliding-window", "fixed-window"]


class TwoSteps(RedisScriptBackend):
    """The engine deciding as before the held variants: its own ``decide`` (a subclass's)
    keeps a penalized limit on the hold read first, then the decision."""

    async def decide(self, plan: Plan) -> Decision:
        return await super().decide(plan)


def _backend(request: pytest.FixtureRequest, kind: str, clock: FakeClock, two: bool) -> Any:
    backend = store_backend(request, kind, clock)
    if two:
        backend.__class__ = TwoSteps
    return backend


def _fake(clock: FakeClock) -> tuple[fakeredis.FakeServer, RedisScriptBackend]:
    """A fakeredis server (``connected = False`` fails it) and a script engine on it."""
    server = fakeredis.FakeServer()
    client = fakeredis.FakeAsyncRedis(server=server)
    return server, RedisScriptBackend(client, clock=clock, owns_client=True)


def _calls(backend: Any) -> int:
    return sum(backend.calls_per_script.values())


def _seen(decision: Decision) -> tuple[object, ...]:
    return (
        decision.allowed,
        round(decision.retry_after, 6),
        None if decision.penalty is None else round(decision.penalty, 6),
        None if decision.rule is None else str(decision.rule),
        decision.shadow,
    )


@pytest.mark.parametrize("kind", ENGINES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_one_script_call_per_decision(
    request: pytest.FixtureRequest, kind: str, algorithm: str, clock: FakeClock
) -> None:
    backend = _backend(request, kind, clock, two=False)
    rl = RateLimit(backend, f"one-{uuid.uuid4().hex[:8]}", algorithm=algorithm)
    limit = rl.limit("user:3/m", key="login", user="eve", penalty="2 refusals/m for 10m")
    try:
        assert [(await limit.decide()).allowed for _ in range(3)] == [True] * 3
        assert _calls(backend) == 3  # the hold read in each decision's call
        refused = await limit.decide()
        assert not refused.allowed
        assert refused.penalty is None
        assert _calls(backend) == 5  # the decision, then the refusal noted
        again = await limit.decide()  # the denial cache's refusal: the second starts the hold
        assert again.penalty == pytest.approx(600)
        clock.advance(20)  # the rules admit one more now (each algorithm); the hold refuses it
        another = RateLimit(backend, rl.namespace, algorithm=algorithm)  # trusts nothing
        before = _calls(backend)
        held = await another.limit(
            "user:3/m", key="login", user="eve", penalty="2 refusals/m for 10m"
        ).decide()
        assert not held.allowed
        assert held.penalty == pytest.approx(600 - 20)
        assert _calls(backend) == before + 1  # one call told the hold
        clock.advance(600)
        assert (await limit.decide()).allowed  # the hold ended; nothing counted meanwhile
    finally:
        await rl.aclose()


@pytest.mark.parametrize("kind", ENGINES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_same_answers_as_two_steps(
    request: pytest.FixtureRequest, kind: str, algorithm: str, clock: FakeClock
) -> None:
    """Random calls of three users, through ``decide()`` and decorated functions (the
    direct path: with hooks on one limiter, none on the other), two limiters of one
    namespace (a hold one finds, the other must read), shadow, lifts, time stepping: the
    same decisions and the same hooks' records, in fewer calls."""
    seed = random.randrange(1 << 30)
    runs: dict[bool, list[tuple[object, ...]]] = {}
    calls: dict[bool, int] = {}
    start = clock.now
    rules, penalty = "user:2/10s | 5/m", "user: 3 refusals/30s for 2m"
    for two in (True, False):
        clock.now = start
        rng = random.Random(seed)
        backend = _backend(request, kind, clock, two)
        namespace = f"same-{uuid.uuid4().hex[:8]}"
        told: list[tuple[object, ...]] = []

        def hook(decision: Decision, told: list[tuple[object, ...]] = told) -> None:
            told.append(_seen(decision))

        limiters = [
            RateLimit(backend, namespace, algorithm=algorithm),
            RateLimit(backend, namespace, algorithm=algorithm, hooks=[hook]),
        ]
        decorated = []
        for rl in limiters:
            for shadow in (False, True):

                @rl.limit(rules, key="api", shadow=shadow, penalty=penalty)
                async def work(user: str) -> str:
                    return user

                decorated.append(work)
        seen: list[tuple[object, ...]] = []
        try:
            for _ in range(200):
                step = rng.random()
                user = rng.choice("abc")
                rl = rng.choice(limiters)
                if step < 0.15:
                    clock.advance(rng.choice([0.5, 3, 20, 61, 400]))
                elif step < 0.18:
                    seen.append(("lift", await rl.penalties.lift("api", user=user)))
                elif step < 0.55:
                    try:
                        seen.append(("ran", await rng.choice(decorated)(user)))
                    except RateLimitExceeded as exc:
                        seen.append(("raised", *_seen(exc.decision)))
                else:
                    limit = rl.limit(
                        rules, key="api", user=user, shadow=step > 0.95, penalty=penalty
                    )
                    seen.append(_seen(await limit.decide()))
            calls[two] = _calls(backend)
        finally:
            await limiters[0].aclose()
        runs[two] = seen + [("told", *t) for t in told]
    assert runs[False] == runs[True], f"seed {seed}"
    assert calls[False] < calls[True]


@pytest.mark.parametrize("kind", ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
async def test_batched_with_other_calls(
    request: pytest.FixtureRequest, kind: str, clock: FakeClock
) -> None:
    """Concurrent penalized calls go out in batches (the held variants run in the batch
    script), each decided as alone: two admitted per user, then refusals, then holds."""
    backend = _backend(request, kind, clock, two=False)
    rl = RateLimit(backend, f"batch-{uuid.uuid4().hex[:8]}")
    penalty = "user: 2 refusals/m for 10m"
    try:
        users = [f"u{n}" for n in range(20)]

        async def decide(user: str) -> Decision:
            return await rl.limit("user:2/m", key="api", user=user, penalty=penalty).decide()

        for _ in range(4):
            decisions = await asyncio.gather(*(decide(u) for u in users))
            assert len({_seen(d) for d in decisions}) == 1  # every user alike
        if kind == "redis":  # fakeredis answers without waiting on Python 3.13: no company
            assert max(backend.calls_per_script) > 1  # batches carried them
        last = await asyncio.gather(*(decide(u) for u in users))
        assert all(d.penalty == pytest.approx(600) for d in last)
        assert Counter(d.allowed for d in last) == Counter({False: 20})
    finally:
        await rl.aclose()


async def test_a_hold_lifted_elsewhere_is_forgotten_here(clock: FakeClock) -> None:
    """A hold this process found, lifted by another process: once its trust runs out, the
    next decision reads no hold in the store and forgets it here, so that a store failing
    after that meets the failure policy, not the lifted hold."""
    server, backend = _fake(clock)
    here = RateLimit(backend, "lifted", on_error="allow")
    there = RateLimit(backend, "lifted")
    penalty = "2 refusals/m for 10m"
    limit = here.limit("ip:1/m", key="k", ip="x", penalty=penalty)
    try:
        assert [(await limit.decide()).penalty for _ in range(3)][1:] == [None, pytest.approx(600)]
        assert await there.penalties.lift("k", ip="x") == 1
        clock.advance(61)  # past this process's trust in the hold, and the rule's minute
        assert (await limit.decide()).allowed
        server.connected = False
        failed = await limit.decide()
        assert failed.allowed
        assert failed.degraded
    finally:
        server.connected = True
        await here.aclose()


async def test_a_known_hold_lasts_while_the_store_fails(clock: FakeClock) -> None:
    """A hold this process found, past its trust: the store failing in the decision that
    would read it again, the hold refuses to its end; after it, the failure policy."""
    server, backend = _fake(clock)
    rl = RateLimit(backend, "known", on_error="allow")
    limit = rl.limit("ip:1/m", key="k", ip="x", penalty="2 refusals/m for 10m")
    try:
        assert [(await limit.decide()).penalty for _ in range(3)][2] == pytest.approx(600)
        clock.advance(61)  # past this process's trust in the hold, and the denial cache's
        server.connected = False
        held = await limit.decide()
        assert not held.allowed
        assert held.penalty == pytest.approx(600 - 61)
        clock.advance(600)
        after = await limit.decide()
        assert after.allowed
        assert after.degraded
    finally:
        server.connected = True
        await rl.aclose()


@pytest.mark.parametrize("kind", ENGINES)
async def test_a_held_call_of_the_direct_path_is_no_refusal_of_the_rules(
    request: pytest.FixtureRequest, kind: str, clock: FakeClock
) -> None:
    """A decorated call the store holds back (read with its decision) is told to the hooks
    once, raised with the hold, and neither noted nor remembered as the rules' refusal: a
    lift elsewhere frees it once this process's trust in the hold runs out."""
    backend = _backend(request, kind, clock, two=False)
    namespace = f"direct-{uuid.uuid4().hex[:8]}"
    told: list[Decision] = []
    here = RateLimit(backend, namespace, hooks=[told.append])
    there = RateLimit(backend, namespace)
    rules, penalty = "user:1/m", "user: 2 refusals/m for 10m"

    @here.limit(rules, key="api", penalty=penalty)
    async def work(user: str) -> str:
        return user

    try:
        starter = there.limit(rules, key="api", user="eve", penalty=penalty)
        assert [(await starter.decide()).penalty for _ in range(3)][2] == pytest.approx(600)
        clock.advance(61)  # the rule admits again; the hold refuses
        before = _calls(backend)
        with pytest.raises(RateLimitExceeded) as caught:
            await work("eve")
        assert caught.value.decision.penalty == pytest.approx(600 - 61)
        assert _calls(backend) == before + 1  # read with the decision; nothing noted
        assert told == [caught.value.decision]
        assert await there.penalties.lift("api", user="eve") == 1
        clock.advance(2)  # past this process's trust in the hold
        assert await work("eve") == "eve"
    finally:
        await here.aclose()


async def test_a_subclass_reading_holds_its_own_way_keeps_the_two_steps(clock: FakeClock) -> None:
    """A store subclass overriding ``penalty_left`` alone (a blocklist, a count of hold
    reads) is asked, as before the held variants: they would read the hold key beside it."""

    class Blocklist(RedisScriptBackend):
        reads = 0

        async def penalty_left(self, target: Any) -> float:
            Blocklist.reads += 1
            return 3600.0 if target.value == "mallory" else await super().penalty_left(target)

    client = fakeredis.FakeAsyncRedis()
    rl = RateLimit(Blocklist(client, clock=clock, owns_client=True), "blocked")
    penalty = "user: 3 refusals/m for 1h"

    @rl.limit("user:100/m", key="api", penalty=penalty)
    async def work(user: str) -> str:
        return user

    try:
        held = await rl.limit("user:100/m", key="api", user="mallory", penalty=penalty).decide()
        assert not held.allowed
        assert held.penalty == pytest.approx(3600)
        with pytest.raises(RateLimitExceeded):
            await work("mallory")
        assert await work("bob") == "bob"
        assert Blocklist.reads >= 2
    finally:
        await rl.aclose()
