"""The failure policy against a real redis-server that the tests kill, restart and pause."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import fakeredis
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ratelimit import (
    BackendError,
    ConfigurationError,
    Decision,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
)
from tests.redis_server import RedisServer, free_port

TIMEOUT = 0.25
MARGIN = 0.5  # scheduling slack on a loaded 2-core machine


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


async def timed(call: object) -> tuple[Decision | Exception, float]:
    """Run one decision; return what it gave (or raised) and how long it took."""
    assert callable(call)
    started = time.monotonic()
    try:
        outcome: Decision | Exception = await call()
    except (RateLimitExceeded, BackendError) as exc:
        outcome = exc
    return outcome, time.monotonic() - started


@pytest.mark.redis
@pytest.mark.parametrize("on_error", ["allow", "deny", "raise"])
@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
async def test_redis_killed_mid_stream_then_restarted(
    server: RedisServer, on_error: str, use_scripts: bool
) -> None:
    client = aioredis.Redis.from_url(server.url)
    rl = RateLimit(client, "f", on_error=on_error, timeout=TIMEOUT, use_scripts=use_scripts)
    limit = rl.limit("1000/m", key="stream")
    for _ in range(5):
        decision, _took = await timed(limit.decide)
        assert isinstance(decision, Decision)
        assert decision.allowed
        assert not decision.degraded

    server.stop()  # SIGKILL
    for _ in range(5):
        outcome, took = await timed(limit.decide)
        assert took < TIMEOUT + MARGIN
        if on_error == "raise":
            assert isinstance(outcome, BackendError)
        else:
            assert isinstance(outcome, Decision)
            assert outcome.degraded
            assert outcome.allowed is (on_error == "allow")

    server.start()
    back = time.monotonic()
    while True:
        outcome, took = await timed(limit.decide)
        assert took < TIMEOUT + MARGIN
        if isinstance(outcome, Decision) and not outcome.degraded:
            break
        assert time.monotonic() - back < 1.0, "not back within one second of Redis"
    assert outcome.allowed
    await client.aclose()


@pytest.mark.redis
async def test_redis_paused_then_resumed(server: RedisServer) -> None:
    client = aioredis.Redis.from_url(server.url)
    rl = RateLimit(client, "p", timeout=TIMEOUT)
    assert (await rl.limit("1000/m", key="during").decide()).remaining == 999
    server.pause()  # SIGSTOP: connections stay open, nothing answers
    try:
        for _ in range(3):
            outcome, took = await timed(rl.limit("1000/m", key="during").decide)
            assert took < TIMEOUT + MARGIN
            assert isinstance(outcome, Decision)
            assert outcome.degraded
            assert outcome.allowed
    finally:
        server.resume()
    # No connection still holds a reply meant for a call that gave up: each fresh key's
    # answer is its own (a stale "during" reply would say 99x remaining).
    for n in range(5):
        decision = await rl.limit("10/m", key=f"after-{n}").decide()
        assert not decision.degraded
        assert decision.remaining == 9
    await client.aclose()


@pytest.mark.redis
@pytest.mark.parametrize("use_scripts", [True, False], ids=["scripts", "commands"])
@pytest.mark.parametrize("on_error", ["allow", "deny"])
async def test_a_paused_redis_answers_many_callers_of_one_key_within_the_deadline(
    server: RedisServer, use_scripts: bool, on_error: str
) -> None:
    """100 callers of one key while Redis is paused: each is answered by the policy within
    its deadline. The command engine's callers queue for the key's lock behind a ``SET NX``
    that Redis never answers; they waited out ``lock_timeout`` (10 s) in turn."""
    client = aioredis.Redis.from_url(server.url)
    rl = RateLimit(client, "q", use_scripts=use_scripts, on_error=on_error, timeout=TIMEOUT)
    limit = rl.limit("1000/m", key="one")
    assert (await limit.decide()).allowed  # connections open before the pause
    server.pause()
    try:
        outcomes = await asyncio.gather(*(timed(limit.decide) for _ in range(100)))
    finally:
        server.resume()
    slowest = max(took for _, took in outcomes)
    assert slowest < TIMEOUT + MARGIN, slowest
    for outcome, _ in outcomes:
        assert isinstance(outcome, Decision)
        assert outcome.degraded
        assert outcome.allowed is (on_error == "allow")
    decision = await rl.limit("10/m", key="after").decide()  # back once Redis answers
    assert not decision.degraded
    await client.aclose()


@pytest.mark.redis
async def test_an_outage_logs_once_then_once_on_recovery(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = aioredis.Redis.from_url(server.url)
    rl = RateLimit(client, "l", timeout=TIMEOUT)
    limit = rl.limit("1000/m", key="log")
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        server.stop()
        for _ in range(20):
            assert (await limit.decide()).degraded
        server.start()
        while (await limit.decide()).degraded:
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "ratelimit"]
    assert len(lines) == 2, lines
    assert "storage failed, admitting calls" in lines[0]
    assert "answers again" in lines[1]
    assert "20 decisions were degraded" in lines[1] or "decisions were degraded" in lines[1]
    await client.aclose()


async def test_lock_contention_never_fails_open() -> None:
    """A held lock is contention, not an outage. The round-trip deadline is generous
    (timeout=5): on a starved machine a 0.25 s one can expire on a lock's SET, which is an
    outage by definition and fails open (this test once failed that way under load)."""
    client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    rl = RateLimit(
        client, "c", use_scripts=False, on_error="allow", lock_timeout=0.1,
        lock_polling_interval=0.02, timeout=5, lock_ttl=10,
    )  # fmt: skip
    await client.set("rl:{c:busy}:lock", "someone else", px=60_000)
    decision = await rl.limit("5/s", key="busy").decide()
    assert not decision.allowed  # refused under on_error="allow": admitting would pass 5/s
    assert decision.degraded
    assert not await client.exists("rl:{c:busy}")  # nothing counted
    await client.aclose()


def test_bad_failure_settings() -> None:
    with pytest.raises(ConfigurationError, match="on_error must be one of allow, deny, raise"):
        RateLimit(MemoryBackend(), on_error="ignore")
    for timeout in (0, -1, float("nan"), "1"):
        with pytest.raises(ConfigurationError, match="timeout must be a number of seconds"):
            RateLimit(MemoryBackend(), timeout=timeout)  # type: ignore[arg-type]


@pytest.mark.redis
@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
async def test_at_maxmemory_both_engines_still_refuse_a_full_key(
    server: RedisServer, use_scripts: bool
) -> None:
    """Redis refuses writes at ``maxmemory`` with ``noeviction``. A refusal needs no write,
    so a key at its limit stays refused on both engines; an admission cannot be recorded,
    so it is degraded on both."""
    client = aioredis.Redis.from_url(server.url)
    rl = RateLimit(client, "oom", use_scripts=use_scripts, denial_cache=0)
    full = rl.limit("2/m", key="full")
    assert [(await full.decide()).allowed for _ in range(2)] == [True, True]
    await client.config_set("maxmemory-policy", "noeviction")
    await client.config_set("maxmemory", 1)  # every write is refused from here on
    try:
        refused = await full.decide()
        fresh = await rl.limit("2/m", key="fresh").decide()
    finally:
        await client.config_set("maxmemory", 0)
    assert (refused.allowed, refused.degraded) == (False, False)  # commands: was admitted
    assert fresh.degraded  # could not be recorded: the failure policy decided
    await client.aclose()


@pytest.mark.parametrize(("on_error", "allowed"), [("allow", True), ("deny", False)])
async def test_a_cluster_with_no_reachable_node_follows_the_policy(
    on_error: str, allowed: bool
) -> None:
    """redis-py raises ``RedisClusterException`` (not a ``RedisError``) when no node of a
    cluster answers: it is the store failing, answered by ``on_error`` like any other."""
    client = RedisCluster(host="127.0.0.1", port=free_port())  # nothing listens there
    rl = RateLimit(client, on_error=on_error)
    decision = await rl.limit("5/m", key="cluster-down").decide()
    assert decision.degraded
    assert decision.allowed is allowed
    with pytest.raises(BackendError, match="Cluster cannot be connected"):
        await RateLimit(client, on_error="raise").limit("5/m", key="cluster-down").decide()
    await client.aclose()
