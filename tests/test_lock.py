"""The command engine's Redis lock: timeouts, ownership, crashed holders, no Lua at all."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from ratelimit import (
    BackendError,
    LockTimeoutError,
    MemoryBackend,
    RateLimit,
    RateLimitError,
    RateLimitExceeded,
    RedisCommandBackend,
    RedisScriptBackend,
)
from ratelimit.backends.redis.command import decisions as command_decisions
from ratelimit.backends.redis.command.lock import RedisLock
from ratelimit.backends.redis.connections import ConnectionGate
from ratelimit.backends.redis.keys import identifier_key, lock_key, tag
from ratelimit.core.plan import Identifier
from tests.redis_server import RedisServer
from tests.workers import run_workers

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    fake = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    yield fake
    await fake.aclose()


def test_the_lock_shares_the_hash_tag_of_the_counters() -> None:
    counters = identifier_key(Identifier("shop", "search", "user", "vova")).encode()
    assert key_slot(lock_key(tag("shop", "search")).encode()) == key_slot(counters)
    assert lock_key(tag("shop", "search")) == "rl:{shop:search}:lock"


def test_polling_is_jittered_and_never_passes_the_timeout() -> None:
    draws = iter([0.0, 0.5, 0.999, 0.25])
    lock = RedisLock(
        None,  # type: ignore[arg-type]
        "l",
        ttl=1,
        polling_interval=0.1,
        timeout=1,
        jitter=lambda: next(draws),
    )
    delays = [lock.next_delay(remaining=10) for _ in range(3)]
    assert delays == pytest.approx([0.05, 0.1, 0.1499])
    assert lock.next_delay(remaining=0.02) == 0.02


async def test_a_lock_it_cannot_take_raises_under_raise(client: aioredis.Redis) -> None:
    rl = RateLimit(
        client, "ns", use_scripts=False, lock_timeout=0.2, lock_polling_interval=0.02,
        on_error="raise", timeout=5,  # a slow round trip is not what this test is about
    )  # fmt: skip
    await client.set("rl:{ns:busy}:lock", "someone else", px=60_000)
    ran = False

    @rl.limit("10/s", key="busy")
    async def work() -> None:
        nonlocal ran
        ran = True

    started = time.monotonic()
    with pytest.raises(LockTimeoutError) as caught:
        await work()
    assert time.monotonic() - started >= 0.2
    assert caught.value.lock == "rl:{ns:busy}:lock"
    assert caught.value.waited >= 0.2
    assert caught.value.retry_after is not None
    assert 55 < caught.value.retry_after <= 60  # until the holder's lock ends by its ttl
    assert isinstance(caught.value, RateLimitError)
    assert isinstance(caught.value, TimeoutError)
    assert "rl:{ns:busy}:lock" in str(caught.value)
    assert not ran
    assert not await client.exists("rl:{ns:busy}")  # nothing was counted
    assert await client.get("rl:{ns:busy}:lock") == b"someone else"


@pytest.mark.parametrize("on_error", ["allow", "deny"])
async def test_a_lock_it_cannot_take_refuses_and_never_admits(
    client: aioredis.Redis, on_error: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Contention on a store that answers: admitting would pass the limit, so the call is
    refused whatever ``on_error`` says (degraded, with the time until the holder's lock
    ends), and it is not logged as an outage."""
    rl = RateLimit(
        client, "ns", use_scripts=False, lock_timeout=0.2, on_error=on_error,
        timeout=5,  # a slow round trip (an outage) is not what this test is about
    )  # fmt: skip
    await client.set("rl:{ns:busy}:lock", "someone else", px=60_000)
    limit = rl.limit("10/s", key="busy")
    decisions = [await limit.decide() for _ in range(3)]
    for decision in decisions:
        assert not decision.allowed
        assert decision.degraded
        assert 55 < decision.retry_after <= 60
        assert decision.rule is None
    with pytest.raises(RateLimitExceeded, match="lock stayed held past lock_timeout"):
        async with limit:
            raise AssertionError("the block ran")
    assert not await client.exists("rl:{ns:busy}")  # nothing was counted
    warnings = [r.getMessage() for r in caplog.records if r.name == "ratelimit"]
    assert len(warnings) == 1  # once, not once per call
    assert "lock contention" in warnings[0]
    assert "not an outage" in warnings[0]
    assert "storage failed" not in warnings[0]


async def test_a_release_goes_ahead_of_takes_waiting_for_a_connection() -> None:
    """The engine's gate lets no more commands out than the pool has connections; a lock's
    release (``first=True``) must not queue behind the takes that wait for it."""
    client = aioredis.Redis(max_connections=2)  # a pool of 2; nothing is connected
    gate = ConnectionGate(client)
    order: list[str] = []

    async def use(name: str, first: bool) -> None:
        async with gate.slot(first=first):
            order.append(name)
            await asyncio.sleep(0)

    async with gate.slot(), gate.slot():  # both connections busy
        waiting = [asyncio.create_task(use(f"take {n}", False)) for n in range(3)]
        await asyncio.sleep(0)  # they queue, in order
        waiting.append(asyncio.create_task(use("release", True)))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(use("left", False))
        await asyncio.sleep(0)
        cancelled.cancel()  # a waiter that leaves takes no slot with it
    await asyncio.gather(*waiting)
    assert order == ["release", "take 0", "take 1", "take 2"]
    async with asyncio.timeout(5), gate.slot(), gate.slot():  # every slot came back
        pass
    await client.aclose()


async def test_release_never_deletes_a_lock_another_holder_owns(client: aioredis.Redis) -> None:
    lock = RedisLock(client, "l", ttl=10, polling_interval=0.01, timeout=1)
    token = await lock.acquire()
    # Our lock expired and another holder took it: the key now holds their token.
    await client.set("l", "their-token", px=10_000)
    assert not await lock.release(token)
    assert await client.get("l") == b"their-token"
    assert await client.delete("l") == 1
    token = await lock.acquire()
    assert await lock.release(token)
    assert not await client.exists("l")


async def test_each_decision_takes_and_returns_the_lock(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisCommandBackend(client, lock_ttl=5)
    rl = RateLimit(backend, "ns")
    taken: list[int] = []
    original = command_decisions.BY_ALGORITHM["sliding-log"]

    async def watching(engine: Any, plan: Any, may_write: bool) -> Any:
        taken.append(await client.pttl("rl:{ns:k}:lock"))
        return await original(engine, plan, may_write)

    monkeypatch.setitem(command_decisions.BY_ALGORITHM, "sliding-log", watching)
    for _ in range(3):
        assert (await rl.limit("5/s", key="k").decide()).allowed
    assert len(taken) == 3
    assert all(0 < ttl <= 5000 for ttl in taken)  # held, with its ttl, while deciding
    assert not await client.exists("rl:{ns:k}:lock")


async def test_a_failing_decision_still_returns_the_lock(client: aioredis.Redis) -> None:
    rl = RateLimit(client, "ns", use_scripts=False, on_error="raise")
    await client.set("rl:{ns:k}", "not a list")
    with pytest.raises(BackendError, match="WRONGTYPE"):
        await rl.limit("5/s", key="k").decide()
    assert not await client.exists("rl:{ns:k}:lock")


async def test_a_cancelled_decision_still_returns_the_lock(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisCommandBackend(client)
    rl = RateLimit(backend, "ns")
    entered = asyncio.Event()

    async def stuck(engine: Any, plan: Any, may_write: bool) -> Any:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    monkeypatch.setitem(command_decisions.BY_ALGORITHM, "sliding-log", stuck)
    task = asyncio.ensure_future(rl.limit("5/s", key="k").decide())
    await entered.wait()
    assert await client.exists("rl:{ns:k}:lock")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):  # let the shielded release finish
        if not await client.exists("rl:{ns:k}:lock"):
            break
        await asyncio.sleep(0)
    assert not await client.exists("rl:{ns:k}:lock")


async def test_disable_locks_takes_no_lock(client: aioredis.Redis) -> None:
    rl = RateLimit(client, "ns", use_scripts=False, disable_locks=True)
    await client.set("rl:{ns:k}:lock", "someone else", px=60_000)
    assert (await rl.limit("5/s", key="k").decide()).allowed  # not blocked by it


def test_disable_locks_with_scripts_changes_nothing() -> None:
    client = fakeredis.FakeAsyncRedis()
    assert isinstance(RateLimit(client, disable_locks=True).storage, RedisScriptBackend)
    assert isinstance(RateLimit(client, use_scripts=False).storage, RedisCommandBackend)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"lock_ttl": 0}, ValueError, "lock_ttl must be seconds from 0.1"),
        ({"lock_polling_interval": -1}, ValueError, "lock_polling_interval must be"),
        ({"lock_timeout": -0.5}, ValueError, "lock_timeout must be 0 or more"),
        ({"lock_ttl": float("nan")}, ValueError, "lock_ttl must be"),
    ],
)
def test_bad_lock_settings_are_refused(
    options: dict[str, float], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        RateLimit(fakeredis.FakeAsyncRedis(), use_scripts=False, **options)  # type: ignore[arg-type]


def test_engine_settings_do_not_apply_to_backend_objects() -> None:
    with pytest.raises(TypeError, match="apply to a Redis client"):
        RateLimit(MemoryBackend(), use_scripts=False)
    with pytest.raises(TypeError, match="no engine settings"):
        RateLimit.from_url("memory://", disable_locks=True)


@pytest.mark.redis
async def test_the_command_engine_sends_no_lua() -> None:
    with RedisServer() as server:
        client = aioredis.Redis.from_url(server.url)
        rl = RateLimit(client, "ns", use_scripts=False)
        for _ in range(3):
            await rl.limit("user:2/s & 3/m", key="k", user="u").decide()
        stats = await client.info("commandstats")
        await client.aclose()
    used = {name.removeprefix("cmdstat_") for name in stats}
    assert {"set", "lrange", "multi", "exec", "watch"} <= used
    assert not used & {"eval", "evalsha", "eval_ro", "evalsha_ro", "script", "fcall", "function"}


@pytest.mark.long
@pytest.mark.redis
async def test_a_holder_killed_with_sigkill_blocks_others_at_most_lock_ttl(
    redis_client: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    name = lock_key(tag(namespace, "killed"))
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.lock_holder", redis_url, name, "1.0",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), 30) == b"held\n"
    finally:
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
    assert holder.returncode == -signal.SIGKILL
    assert await redis_client.exists(name)  # the dead holder's lock is still there
    rl = RateLimit(
        redis_client, namespace, use_scripts=False, lock_ttl=1.0, lock_timeout=5.0,
        lock_polling_interval=0.02,
    )  # fmt: skip
    started = time.monotonic()
    assert (await rl.limit("5/s", key="killed").decide()).allowed
    waited = time.monotonic() - started
    assert waited <= 1.0 + 0.5  # its ttl, plus polling and scheduling
    assert not await redis_client.exists(name)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.redis
@pytest.mark.parametrize("ends", ["deadline", "cancelled"])
async def test_a_lock_set_that_lands_after_its_caller_left_is_given_back(
    own_server: RedisServer, ends: str
) -> None:
    """SIGSTOP Redis, one decision sends its ``SET NX`` and leaves (its deadline passes, or it
    is cancelled), SIGCONT: Redis then takes the lock for a caller that is gone. The next
    caller on a healthy Redis must not wait out ``lock_ttl``."""
    client = aioredis.Redis.from_url(own_server.url)
    rl = RateLimit(
        client, "lost", use_scripts=False, on_error="raise", timeout=0.25,
        lock_ttl=60, lock_timeout=10, lock_polling_interval=0.01,
    )  # fmt: skip
    limit = rl.limit("5/m", key="k")
    assert (await limit.decide()).allowed  # connections open before the pause
    own_server.pause()
    try:
        if ends == "deadline":
            with pytest.raises(BackendError, match="did not answer"):
                await limit.decide()
        else:
            call = asyncio.create_task(limit.decide())
            done, _ = await asyncio.wait([call], timeout=0.1)  # it waits for the paused Redis
            assert not done
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
    finally:
        own_server.resume()
    started = time.monotonic()
    assert (await limit.decide()).allowed  # was: LockTimeoutError after 10 s
    assert time.monotonic() - started < 5  # far below lock_timeout; lock_ttl is 60
    assert not await client.exists(lock_key(tag("lost", "k")))
    await client.aclose()


async def test_a_set_resent_by_the_client_still_finds_its_own_lock(
    client: aioredis.Redis,
) -> None:
    """redis-py resends a command after a dropped connection: if the first ``SET NX`` took
    the lock, the second fails, and the lock is ours all the same."""
    lock = RedisLock(client, "rl:{ns:k}:lock", ttl=10, polling_interval=0.01, timeout=0.2)
    real_set = client.set
    calls = 0

    async def resent(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        await real_set(*args, **kwargs)  # the first try lands; its reply is lost
        return await real_set(*args, **kwargs)  # the resend: NX fails

    client.set = resent  # type: ignore[method-assign]
    async with lock.held():
        assert calls == 1  # taken at the first try: no wait for its own lock
    assert not await client.exists("rl:{ns:k}:lock")


@pytest.mark.long
@pytest.mark.redis
async def test_three_processes_on_a_locked_limit_admit_exactly_its_count(
    redis_client: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    """3 processes x 25 callers at once on one locked ``30/h``, default settings (0.25 s
    deadline). Waiting for the lock is not an outage: no call may be admitted by the
    failure policy because the lock's waiters crowded out the round trips, nor refused
    because it waited past ``lock_timeout``."""
    outputs = await run_workers(
        redis_client, namespace, "tests.lock_contention_worker", redis_url, namespace, "25",
        count=3,
    )  # fmt: skip
    counts = [[int(n) for n in out.split()] for out in outputs]
    admitted, refused, degraded = (sum(column) for column in zip(*counts, strict=True))
    assert (admitted, refused, degraded) == (30, 45, 0)
    assert await redis_client.llen(f"rl:{{{namespace}:shared}}") == 30
    assert not await redis_client.exists(f"rl:{{{namespace}:shared}}:lock")


@pytest.mark.redis
async def test_waiters_block_on_redis_and_closing_leaves_nothing_pending(
    redis_client: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    """20 callers of one held lock in one process: one of them waits on Redis (a BLPOP),
    the others in the process, none polls. Cancelled, then the limiter closed: no task of
    the lock is left pending (a task destroyed pending when the loop closes logs "Task was
    destroyed" and redis-py's "no running event loop")."""
    client = aioredis.Redis.from_url(redis_url)
    rl = RateLimit(client, namespace, use_scripts=False, lock_timeout=30)
    await redis_client.set(lock_key(tag(namespace, "k")), "someone else", px=60_000)
    calls = [asyncio.create_task(rl.limit("5/s", key="k").decide()) for _ in range(20)]
    deadline = time.monotonic() + 10

    async def blocked() -> list[dict[str, Any]]:
        """The clients blocked on a BLPOP now."""
        return [c for c in await redis_client.client_list() if "b" in c["flags"]]

    async def sets() -> int:
        return int((await redis_client.info("commandstats"))["cmdstat_set"]["calls"])

    while not await blocked():  # polling the test's own server, not a window
        assert time.monotonic() < deadline, "no caller blocked on the wake-up list"
        await asyncio.sleep(0.01)
    sent = await sets()
    for _ in range(20):  # a second look, 0.2 s on: still one BLPOP, and no polling SETs
        await asyncio.sleep(0.01)
    assert len(await blocked()) == 1
    assert await sets() - sent <= 1  # one more try when the 1 s BLPOP ends, at most
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await rl.aclose()
    await client.aclose()
    pending = [t for t in asyncio.all_tasks() if "RedisLock" in repr(t.get_coro())]
    assert pending == []
