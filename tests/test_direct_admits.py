"""The direct path on the Redis script engine (``RedisScriptBackend.admits``, answered under
the failure policy by ``ratelimit.front.direct.asker``): an admission is ``None``, built from the
script's verdict alone; a refusal is the decision ``decide`` builds. Each test drives the
same calls through the direct path and through the general path (``Limit._direct``
answering ``None``: every call a ``Decider.decide``) on a real Redis, and asks for the same
answers and the same stored keys."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratelimit import (
    BackendError,
    RateLimit,
    RateLimitExceeded,
    RedisScriptBackend,
)
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan, cached_plan
from ratelimit.front.direct import asker
from tests.conftest import FakeClock
from tests.redis_server import RedisServer
from tests.test_direct_redteam import STEPS, general_only

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

RULES = [
    "user:3/m",
    "user:2/s",
    "user:4/10s",
    "user:2/s burst 4",
    "user:3/m, user:5/h",
    "user:5/m | region:2/m",
    "user:2/m & region:3/m",
    "user:300 tokens/m",
]
COSTS: list[Any] = [1, 1, 2]
USERS = ["ann", "bob", "7", 7]


async def outcome(work: Any, *args: Any) -> object:
    try:
        return await work(*args)
    except RateLimitExceeded as exc:
        decision = exc.decision
        return ("refused", str(decision.rule), round(decision.retry_after, 6), decision.degraded)
    except BackendError as exc:
        return ("error", type(exc).__name__)


async def stored(client: aioredis.Redis, namespace: str) -> list[tuple[str, object]]:
    """Every key of ``namespace`` (named without it) and what it holds."""
    found: list[tuple[str, object]] = []
    async for raw in client.scan_iter(match=f"*{namespace}*", count=1000):
        key = raw.decode()
        kind = await client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        value: object
        if kind == "zset":
            value = await client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            value = sorted((await client.hgetall(key)).items())
        elif kind == "string":
            value = await client.get(key)
        elif kind == "set":
            value = sorted(await client.smembers(key))
        else:
            value = await client.lrange(key, 0, -1)
        found.append((key.replace(namespace, "NS"), value))
    return sorted(found, key=lambda pair: pair[0])


async def scripted(url: str, seed: int, general: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    """One random script of calls on Redis (a fake clock): what each came to, and the keys."""
    chance = random.Random(seed)
    clock = FakeClock()
    algorithm = chance.choice(["sliding-log", "gcra", "sliding-window", "fixed-window"])
    rules = chance.choice(RULES)
    if "burst" in rules and algorithm != "gcra":
        rules = "user:2/s"
    namespace = f"adm-{uuid.uuid4().hex[:12]}"
    client = aioredis.Redis.from_url(url)
    public = chance.random() < 0.3  # redis-py's public pipeline, not the fast path
    spread = chance.random() < 0.3  # the layout a cluster gets: identifiers hash-tagged apart
    backend = RedisScriptBackend(
        client, clock=clock, timeout=5, spread=spread, fast_path=False if public else None
    )
    rl = RateLimit(backend, namespace, algorithm=algorithm, on_error="raise")
    try:
        cost = {"tokens": 40} if "tokens" in rules else chance.choice(COSTS)
        limit = rl.limit(rules, key="k", cost=cost, shadow=chance.random() < 0.15)
    except Exception as exc:  # a cost these rules cannot count: said alike either way
        await rl.aclose()
        await client.aclose()
        return (type(exc).__name__,)
    if general:
        general_only(limit, monkeypatch)

    async def body(user: Any, region: Any = "eu") -> int:
        return 1

    work = limit(body)
    seen: list[object] = []
    for _ in range(60):
        step = chance.random()
        if step < 0.25:
            clock.advance(chance.choice(STEPS))
        elif step < 0.3:
            user = chance.choice(["ann", "bob"])
            if chance.random() < 0.6:
                new = chance.choice(["user:1/m", "user:6/m", "user:1/s"])
                await rl.overrides.set("k", new, user=user)
            else:
                await rl.overrides.delete("k", user=user)
        else:
            seen.append(await outcome(work, chance.choice(USERS), chance.choice(["eu", "us"])))
    state = await stored(client, namespace)
    await rl.aclose()
    await client.aclose()
    return algorithm, rules, seen, state


@pytest.mark.parametrize("seed", range(0, 48, 4))
async def test_random_calls_agree_with_the_general_path(
    redis_url: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for one in range(seed, seed + 4):
        direct = await scripted(redis_url, one, False, monkeypatch)
        general = await scripted(redis_url, one, True, monkeypatch)
        assert direct == general, f"seed {one}"


async def test_admits_answers_none_or_the_refusal_decide_gives(redis_url: str) -> None:
    """Plan by plan, on twin keys: ``admits`` is ``None`` where ``decide`` admits, and
    ``decide``'s very refusal where it refuses (every algorithm, costs, two rules)."""
    client = aioredis.Redis.from_url(redis_url)
    clock = FakeClock()
    backend = RedisScriptBackend(client, clock=clock, timeout=5)
    chance = random.Random(5)
    for algorithm in ("sliding-log", "gcra", "sliding-window", "fixed-window"):
        plans: dict[str, Plan] = {}
        for twin in ("a", "b"):
            rl = RateLimit(backend, f"twin-{twin}-{uuid.uuid4().hex[:8]}", algorithm=algorithm)
            limit: Any = rl.limit("user:4/m, user:9/h", key="k", cost=2)
            decider = limit._decider
            compiled, cost = limit._compiled, limit._cost.of(limit._compiled, decider.algorithm)
            plans[twin] = cached_plan(compiled, decider.namespace, "k", ("ann",), cost, algorithm)
        for _ in range(12):
            clock.advance(chance.choice([0, 1, 7, 20]))
            decision = await backend.decide(plans["a"])
            admitted = await backend.admits(plans["b"])
            assert admitted == (None if decision.allowed else decision)
    await backend.aclose()
    await client.aclose()


class CountingDecide(RedisScriptBackend):
    """A subclass that overrides ``decide`` alone: its decisions must stay on it."""

    async def decide(self, plan: Plan) -> Decision:
        return await super().decide(plan)


async def test_asker_takes_admits_only_where_decide_is_its_classs(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    for backend, own in ((RedisScriptBackend(client), True), (CountingDecide(client), False)):
        rl = RateLimit(backend, "asker")
        decider = rl._decider
        assert (asker(decider) != decider.ask) is own
        await rl.aclose()
    await client.aclose()


@pytest.mark.parametrize("on_error", ["allow", "deny", "raise", "local"])
async def test_a_killed_redis_is_answered_as_the_general_path_answers(
    on_error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls before and after Redis dies (and after it is back), under each ``on_error``:
    the direct path answers each as ``Decider.ask`` does (degraded admissions proceed, the
    policy's refusals and errors raise)."""
    answers = []
    for general in (False, True):
        with RedisServer() as server:
            client = aioredis.Redis.from_url(server.url)
            backend = RedisScriptBackend(client, clock=FakeClock(), timeout=0.25)
            rl = RateLimit(backend, "killed", on_error=on_error, local_share=1.0)
            limit = rl.limit("user:3/m", key="k")
            if general:
                general_only(limit, monkeypatch)

            async def body(user: str) -> str:
                return user

            work = limit(body)
            seen = [await outcome(work, "ann") for _ in range(4)]
            server.stop()
            seen += [await outcome(work, user) for user in ("ann", "bob") * 4]
            seen += await asyncio.gather(*(outcome(work, user) for user in ("cat", "dan") * 3))
            answers.append(seen)
            await rl.aclose()
            await client.aclose()
    direct, general_answers = answers
    assert direct == general_answers
    assert direct[:3] == ["ann"] * 3
    assert direct[3][:2] == ("refused", "user:3/m")  # type: ignore[index]
