"""A storage address where something other than Redis answers: a server that echoes what it
is sent, as a socket connected to itself does (a client reconnecting to a stopped server's
port may be given that very port as its own end, and read its own request back). Its
replies are not the scripts' replies: the failure policy answers, with a ``BackendError``
that says so, never a ``ValueError`` from deep in the backend, and the connections that
carried them are closed, so that the next calls reconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import fakeredis
import pytest
import redis.asyncio as aioredis

from ratelimit import RateLimit, RedisScriptBackend
from ratelimit.backends.base import Push
from ratelimit.core.plan import Identifier
from ratelimit.errors import BackendError
from tests.redis_server import (
    ephemeral_ports,
    free_cluster_port,
    free_port,
    ports_outside_ephemeral,
)

pytestmark = pytest.mark.timeout(30)


@dataclass
class Echo:
    url: str
    open: set[asyncio.StreamWriter] = field(default_factory=set)
    none_open: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    served = Echo("")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.open.add(writer)
        served.none_open.clear()
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            served.open.discard(writer)
            if not served.open:
                served.none_open.set()
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    served.url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    async with server:
        yield served
        for writer in list(served.open):
            writer.close()


@pytest.mark.parametrize("use_scripts", [True, False], ids=["scripts", "commands"])
@pytest.mark.parametrize("fast_path", ["1", "0"], ids=["fast-path", "public-api"])
async def test_an_echoing_server_is_a_failing_store(
    echo: Echo, use_scripts: bool, fast_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RATELIMIT_REDIS_FAST_PATH", fast_path)
    rl = RateLimit.from_url(echo.url, "echo", use_scripts=use_scripts, timeout=2.0)
    strict = RateLimit.from_url(  # a generous deadline: under load 0.25 s runs out first
        echo.url, "echo", use_scripts=use_scripts, on_error="raise", timeout=2.0
    )
    try:
        decision = await rl.limit("user:5/m", user="ann").decide()
        assert decision.allowed  # fail-open, the default policy
        assert decision.degraded
        with pytest.raises(BackendError, match="not a reply") as caught:
            await strict.limit("user:5/m", user="ann").decide()
        assert "is a Redis server at" in str(caught.value)
        await asyncio.wait_for(echo.none_open.wait(), 10)  # its connections were let go
        together = await asyncio.gather(  # pipelined: batches of calls, or the batch script
            *(strict.limit("user:5/m", user=f"u{n}").decide() for n in range(20)),
            return_exceptions=True,
        )
        assert all(isinstance(e, BackendError) for e in together), together
        assert all("not a reply" in str(e) for e in together), together
        await asyncio.wait_for(echo.none_open.wait(), 10)
    finally:
        await rl.aclose()
        await strict.aclose()


@pytest.mark.parametrize("use_scripts", [True, False], ids=["scripts", "commands"])
async def test_concurrency_slots_on_an_echoing_server_follow_the_policy(
    echo: Echo, use_scripts: bool
) -> None:
    rl = RateLimit.from_url(echo.url, "echo", use_scripts=use_scripts, timeout=2.0)
    strict = RateLimit.from_url(echo.url, "echo", use_scripts=use_scripts, on_error="raise")
    try:
        async with rl.concurrency("user:2", user="ann"):
            pass  # entered: fail-open
        with pytest.raises(BackendError, match="not a reply"):
            async with strict.concurrency("user:2", user="ann"):
                pass
        await asyncio.wait_for(echo.none_open.wait(), 10)
    finally:
        await rl.aclose()
        await strict.aclose()


async def test_a_cluster_client_on_an_echoing_server_follows_the_policy(echo: Echo) -> None:
    from redis.asyncio.cluster import RedisCluster

    port = int(echo.url.rsplit(":", 1)[1].split("/")[0])
    client = RedisCluster(host="127.0.0.1", port=port)
    try:
        decision = await RateLimit(client, "echo").limit("user:5/m", user="ann").decide()
        assert decision.allowed
        assert decision.degraded
        with pytest.raises(BackendError, match="not a reply") as raised:
            await RateLimit(client, "echo", on_error="raise").limit("5/m").decide()
        # the same answer on every redis-py: 8.2 wraps the reading error in one of its own
        assert "Cluster" not in str(raised.value)
        await asyncio.wait_for(echo.none_open.wait(), 10)
    finally:
        await client.aclose()


async def test_a_client_of_one_connection_has_it_closed(echo: Echo) -> None:
    client = aioredis.Redis.from_url(echo.url, single_connection_client=True)
    try:
        decision = await RateLimit(client, "echo").limit("user:5/m", user="ann").decide()
        assert decision.degraded
        await asyncio.wait_for(echo.none_open.wait(), 10)
    finally:
        await client.aclose()


async def test_a_password_on_resp3_meets_the_echo_at_hello(echo: Echo) -> None:
    """redis-py reads the ``HELLO`` reply as a map: an echoed list raised AttributeError."""
    url = echo.url.replace("redis://", "redis://:secret@") + "?protocol=3"
    rl = RateLimit.from_url(url, "echo")
    strict = RateLimit.from_url(url, "echo", on_error="raise")
    try:
        assert (await rl.limit("user:5/m", user="ann").decide()).degraded
        with pytest.raises(BackendError, match="not a reply"):
            await strict.limit("user:5/m", user="ann").decide()
    finally:
        await rl.aclose()
        await strict.aclose()


async def test_a_sync_reply_not_redis_fails_its_own_push_only() -> None:
    backend = RedisScriptBackend(fakeredis.FakeAsyncRedis())
    replies: list[object] = [[], [b"1700000000000000"]]  # the first is no sync reply

    async def send(commands: object, seconds: object) -> list[object]:
        return replies

    backend._pipeline.send = send  # type: ignore[method-assign]
    pushes = [Push(Identifier("ns", "k", "user", u), [(1_000_000, 5, 1.0)]) for u in "ab"]
    server_now, totals = await backend.sync_counters(pushes)
    assert len(totals) == 2
    assert isinstance(totals[0], BackendError)
    assert "not a reply" in str(totals[0])
    assert totals[1] == {}
    assert server_now == 1_700_000_000_000_000


def test_test_servers_take_ports_no_client_is_given_as_its_own_end() -> None:
    """The failure above, met in CI: a client reconnecting for a minute to a killed cluster
    node's port in the ephemeral range connected to itself. Test servers stay outside it."""
    ephemeral = ephemeral_ports()
    if len(ports_outside_ephemeral(10_000)) < 1_000:
        pytest.skip(f"this machine gives outgoing connections almost every port: {ephemeral}")
    for _ in range(20):
        assert free_port() not in ephemeral
        node = free_cluster_port()
        assert node not in ephemeral
        assert node + 10_000 not in ephemeral  # its cluster bus
