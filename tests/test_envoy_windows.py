"""envoyproxy/ratelimit's fixed windows on real Redis servers
(:mod:`ratelimit.backends.redis.envoy.windows`): its own commands (``INCRBY``, ``EXPIRE``,
``GET``; no script, which twemproxy would not take), the requests of one moment in one
pipeline with their own answers, per-second limits on their own Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from ratelimit.backends.redis.envoy.windows import Count, RedisWindows
from ratelimit.errors import BackendError
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture(autouse=True, params=["fast", "public"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The automatic pipeline's fast path (plain Redis), or redis-py's pipeline."""
    if request.param == "public":
        monkeypatch.setenv("RATELIMIT_REDIS_FAST_PATH", "0")
    else:
        monkeypatch.delenv("RATELIMIT_REDIS_FAST_PATH", raising=False)
    return str(request.param)


@pytest.fixture
def servers() -> Iterator[tuple[RedisServer, RedisServer]]:
    with RedisServer() as main, RedisServer() as per_second:
        yield main, per_second


def commands_run(info: dict[str, dict[str, int]]) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in info.items()}


async def test_counts_with_its_commands_on_its_servers(
    servers: tuple[RedisServer, RedisServer],
) -> None:
    main_url, second_url = (s.url for s in servers)
    main, second = aioredis.Redis.from_url(main_url), aioredis.Redis.from_url(second_url)
    windows = RedisWindows(
        aioredis.Redis.from_url(main_url), aioredis.Redis.from_url(second_url), 5.0
    )
    try:
        counts = [Count("m", 2, 60), Count("s", 1, 1, per_second=True), Count("h", 0, 3600)]
        assert await windows.add(counts) == [2, 1, 0]
        assert await windows.add(counts) == [4, 2, 0]
        assert await windows.read(counts) == [4, 2, 0]
        assert await main.get("m") == b"4"
        assert await main.get("s") is None
        assert await second.get("s") == b"2"
        assert 0 < await main.ttl("m") <= 60
        assert await main.ttl("h") == 3600  # INCRBY 0 made it; EXPIRE as its service does
        ran = commands_run(await main.info("commandstats"))
        assert {"incrby", "expire", "get"} <= set(ran)
        assert not {"eval", "evalsha", "script"} & set(ran)
        await windows.ping()
    finally:
        await windows.aclose()
        await main.aclose()
        await second.aclose()


async def test_the_requests_of_one_moment_share_a_pipeline_and_answer_alone(
    servers: tuple[RedisServer, RedisServer],
) -> None:
    url = servers[0].url
    control = aioredis.Redis.from_url(url)
    await control.set("listed", "x")
    await control.rpush("a-list", "x")  # INCRBY on it fails: WRONGTYPE
    windows = RedisWindows(aioredis.Redis.from_url(url), None, 5.0)
    try:
        before = (await control.info("stats"))["total_connections_received"]
        asks = [windows.add([Count("shared", 1, 60)]) for _ in range(200)]
        asks.append(windows.add([Count("a-list", 1, 60)]))
        results = await asyncio.gather(*asks, return_exceptions=True)
        assert sorted(r[0] for r in results[:200] if isinstance(r, list)) == list(range(1, 201))
        assert isinstance(results[200], BackendError)
        after = (await control.info("stats"))["total_connections_received"]
        assert after - before <= 4  # pipelines of many requests: a few connections, at most
    finally:
        await windows.aclose()
        await control.aclose()


async def test_a_server_that_is_gone_is_a_backend_error() -> None:
    with RedisServer() as server:
        url = server.url
    windows = RedisWindows(aioredis.Redis.from_url(url), None, 1.0)
    try:
        with pytest.raises(BackendError):
            await windows.add([Count("k", 1, 60)])
        with pytest.raises(BackendError):
            await windows.ping()
    finally:
        await windows.aclose()
