"""Concurrent override writes of one process on one namespace take turns instead of fighting
(issue 36): on Redis, each write is a ``WATCH``/``MULTI`` transaction, and 20 concurrent
``overrides.set`` calls of one process used to abort each other's until the default
0.25 s deadline passed (``BackendError``). Every store holds each write, with a version
of its own, in the order the store gave them, and the last write of an override wins."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from ratelimit import RateLimit
from ratelimit.backends import MemoryBackend
from ratelimit.backends.postgres import PostgresBackend

pytestmark = pytest.mark.timeout(60)

WRITES = 50
ALGORITHM = "sliding-window"  # one every store decides

Made = Callable[[str], RateLimit]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-commands", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Made]:
    """``make(namespace)``: a limiter on the parametrized store with the default settings
    (on Redis: a client, so the default 0.25 s deadline), sharing one store."""
    made: list[RateLimit] = []
    clients: list[aioredis.Redis] = []
    memory = MemoryBackend()

    def factory(namespace: str) -> RateLimit:
        if request.param == "memory":
            rl = RateLimit(memory, namespace, algorithm=ALGORITHM)
        elif request.param == "postgres":
            url = request.getfixturevalue("postgres_url")
            rl = RateLimit(PostgresBackend(url), namespace, algorithm=ALGORITHM)
        else:
            clients.append(aioredis.Redis.from_url(request.getfixturevalue("redis_url")))
            scripts = request.param == "redis"
            rl = RateLimit(clients[-1], namespace, algorithm=ALGORITHM, use_scripts=scripts)
        made.append(rl)
        return rl

    yield factory
    for rl in made:
        await rl.aclose()
    for client in clients:
        await client.aclose()


async def test_concurrent_sets_on_one_namespace_all_succeed_with_versions_of_their_own(
    make: Made,
) -> None:
    rl = make(f"writes-{uuid.uuid4().hex[:8]}")
    await asyncio.gather(
        *(rl.overrides.set("api", "user:100/m", user=f"u{i}") for i in range(WRITES))
    )
    stored = await rl.overrides.list("api")
    assert sorted(o.values for o in stored) == sorted((("user", f"u{i}"),) for i in range(WRITES))
    versions = [o.version for o in stored]
    assert sorted(v for v in versions if v is not None) == list(range(1, WRITES + 1))


async def test_concurrent_writes_of_two_limiters_on_one_namespace_all_succeed(make: Made) -> None:
    namespace = f"writes-{uuid.uuid4().hex[:8]}"
    first, second = make(namespace), make(namespace)
    await asyncio.gather(
        *(
            (first if i % 2 else second).overrides.set("api", f"user:{i + 1}/m", user="same")
            for i in range(WRITES)
        )
    )
    (last,) = await make(namespace).overrides.list("api")
    assert last.version == WRITES  # each write made a version; the last one written stands
    assert str(last.rules) in {f"user:{i + 1}/m" for i in range(WRITES)}
