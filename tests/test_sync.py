"""``sync_rate``: local counters synced with Redis (> 0), and local only (< 0)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from ratelimit import (
    BackendError,
    ConfigurationError,
    LimiterClosedError,
    MemoryBackend,
    RateLimit,
)
from ratelimit.backends.base import Push, Totals
from ratelimit.backends.redis.script.engine import RedisScriptBackend
from ratelimit.backends.synced import SyncedBackend
from ratelimit.core.plan import Plan
from tests.conftest import FakeClock
from tests.redis_server import RedisServer, free_port


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    fake = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    yield fake
    await fake.aclose()


def synced(client: aioredis.Redis, clock: FakeClock, rate: float = 60.0) -> RateLimit:
    return RateLimit(client, "ns", algorithm="sliding-window", sync_rate=rate, clock=clock)


def counts(fields: dict[Any, Any]) -> list[float]:
    """The window counts of a counter hash, without the window indexes."""
    return sorted(float(v) for k, v in fields.items() if not bytes(k).endswith(b"w"))


def backend_of(rl: RateLimit) -> SyncedBackend:
    assert isinstance(rl.storage, SyncedBackend)
    return rl.storage


SyncReply = tuple[int | None, list[Totals | Exception]]


class SyncThrough:
    """The store to sync with (a :class:`~ratelimit.backends.base.CounterSync`), injected:
    each sync goes to the script engine on ``client``, or to ``through`` while a test sets
    one (to hold a sync in flight, or fail it), instead of patching the engine."""

    def __init__(self, client: aioredis.Redis, clock: FakeClock | None = None) -> None:
        self.engine = RedisScriptBackend(client, clock=clock)
        self.through: Callable[[Sequence[Push]], Awaitable[SyncReply]] | None = None

    async def sync_counters(self, pushes: Sequence[Push]) -> SyncReply:
        if self.through is None:
            return await self.engine.sync_counters(pushes)
        return await self.through(pushes)

    async def reset(self, plan: Plan) -> None:
        await self.engine.reset(plan)

    async def aclose(self) -> None:
        await self.engine.aclose()


def synced_through(store: SyncThrough, sync_rate: float, clock: FakeClock | None) -> RateLimit:
    """A limiter on counters synced with ``store`` every ``sync_rate`` seconds, as
    ``RateLimit(client, algorithm="sliding-window", sync_rate=..., clock=clock)`` makes."""
    backend = SyncedBackend(store, sync_rate, clock=clock)
    return RateLimit(backend, "ns", algorithm="sliding-window")


async def admitted(rl: RateLimit, n: int, rules: str = "5/m") -> int:
    limit = rl.limit(rules, key="k")
    return sum([(await limit.decide()).allowed for _ in range(n)])


async def test_decisions_are_local_until_a_sync_pushes_them(
    client: aioredis.Redis, clock: FakeClock
) -> None:
    rl = synced(client, clock)
    assert await admitted(rl, 7) == 5
    assert not await client.exists("rl:{ns:k}:w")  # nothing sent yet
    await backend_of(rl).sync()
    assert await rl.sliding_window("k", 60) == 5.0
    assert counts(await client.hgetall("rl:{ns:k}:w")) == [5.0]
    await rl.aclose()


async def test_processes_see_each_other_after_a_sync(
    client: aioredis.Redis, clock: FakeClock
) -> None:
    one, two = synced(client, clock), synced(client, clock)
    assert await admitted(one, 5) == 5
    assert await admitted(two, 5) == 5  # two has not seen one's hits: the overshoot
    await backend_of(one).sync()
    await backend_of(two).sync()
    await backend_of(one).sync()
    assert await admitted(one, 1) == 0
    assert await admitted(two, 1) == 0
    assert await one.sliding_window("k", 60) == 10.0
    clock.advance(120)  # two windows later everything has gone
    assert await admitted(two, 5) == 5
    await one.aclose()
    await two.aclose()


async def test_counter_api_in_sync_mode(client: aioredis.Redis, clock: FakeClock) -> None:
    rl = synced(client, clock)
    assert await rl.increment("k", 60, 2.5) == 2.5
    assert await rl.increment("k", 60, -1) == 1.5
    await backend_of(rl).sync()
    other = synced(client, clock)
    assert await other.sliding_window("k", 60) == 0.0  # not synced yet
    await backend_of(other).sync()
    assert await other.sliding_window("k", 60) == 1.5
    await rl.aclose()
    await other.aclose()


async def test_aclose_stops_the_task_after_a_last_sync(
    client: aioredis.Redis, clock: FakeClock
) -> None:
    rl = synced(client, clock)
    assert await admitted(rl, 3) == 3
    backend = backend_of(rl)
    assert backend.syncing
    await rl.aclose()
    assert not backend.syncing
    reader = synced(client, clock)
    assert await reader.sliding_window("k", 60) == 0.0  # a new process learns at its sync
    await backend_of(reader).sync()
    assert await reader.sliding_window("k", 60) == 3.0  # flushed on the way out
    await reader.aclose()


async def test_a_closed_store_is_synced_with_no_more(
    client: aioredis.Redis, clock: FakeClock
) -> None:
    """After ``aclose`` every call that would reach the store raises, a sync's too."""
    rl = synced(client, clock)
    assert await admitted(rl, 2) == 2
    backend = backend_of(rl)
    await rl.aclose()  # its last sync pushed both hits, then closed the script engine
    with pytest.raises(LimiterClosedError):
        await backend.sync()
    with pytest.raises(LimiterClosedError):
        await backend.remote.sync_counters([])
    assert counts(await client.hgetall("rl:{ns:k}:w")) == [2.0]


async def test_a_script_flush_is_survived(client: aioredis.Redis, clock: FakeClock) -> None:
    rl = synced(client, clock)
    await admitted(rl, 2)
    await client.script_flush()
    await backend_of(rl).sync()
    assert counts(await client.hgetall("rl:{ns:k}:w")) == [2.0]
    assert await rl.sliding_window("k", 60) == 2.0
    await rl.aclose()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.redis
async def test_redis_going_away_and_returning_while_the_task_runs(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = aioredis.Redis.from_url(own_server.url, socket_timeout=1)
    rl = RateLimit(client, "ns", algorithm="sliding-window", sync_rate=0.02)
    assert await admitted(rl, 2) == 2
    await wait_for(lambda: client.exists("rl:{ns:k}:w"))  # the task synced on its own
    own_server.stop()
    assert await admitted(rl, 2) == 2  # decisions go on, locally
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        await wait_for_log(caplog, "sync failed, keeping local diffs")
    own_server.start()  # empty: the restart lost what was synced before
    await wait_for(lambda: client.exists("rl:{ns:k}:w"))  # the kept diffs arrive
    assert counts(await client.hgetall("rl:{ns:k}:w")) == [2.0]
    # the restart lost the two hits synced before it; the local view follows Redis again
    assert await rl.sliding_window("k", 60) == 2.0
    await rl.aclose()
    await client.aclose()


async def wait_for(condition: object, seconds: float = 10) -> None:
    """Poll a background task's effect (not a rate-limit window) for up to ``seconds``."""
    assert callable(condition)
    deadline = time.monotonic() + seconds
    while not await _probe(condition):
        assert time.monotonic() < deadline, "the sync task did not act in time"
        await asyncio.sleep(0.01)


async def _probe(condition: Callable[[], Awaitable[object]]) -> object:
    """The condition, or ``False`` while the test's own client fails once on a pooled
    connection that a Redis restart closed (redis-py does not retry that first command)."""
    try:
        return await condition()
    except RedisConnectionError:
        return False


async def wait_for_log(caplog: pytest.LogCaptureFixture, text: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while text not in caplog.text:
        assert time.monotonic() < deadline, f"no log line {text!r}"
        await asyncio.sleep(0.01)


async def test_a_failed_sync_raises_and_keeps_its_diffs(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    down = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    rl = RateLimit(down, "ns", algorithm="sliding-window", sync_rate=60, clock=clock)
    assert await admitted(rl, 3) == 3
    backend = backend_of(rl)
    with pytest.raises(BackendError, match="failed to sync"):
        await backend.sync()
    assert await rl.sliding_window("k", 60) == 3.0
    assert backend.unsynced() == 3.0
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        await rl.aclose()  # its last sync fails too: logged, not raised
    assert "last sync before closing failed" in caplog.text
    await down.aclose()


async def test_negative_sync_rate_is_local_only() -> None:
    nowhere = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    rl = RateLimit(nowhere, "ns", algorithm="sliding-window", sync_rate=-1)
    assert isinstance(rl.storage, MemoryBackend)
    assert await admitted(rl, 7) == 5  # no Redis was asked: it is not even there
    log_rl = RateLimit(nowhere, "ns", sync_rate=-1)  # the log works locally too
    assert await admitted(log_rl, 7) == 5
    await rl.aclose()
    await log_rl.aclose()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sync_rate": 1}, "sync_rate > 0 syncs window counters"),
        ({"sync_rate": 1, "algorithm": "sliding-window", "use_scripts": False}, "use_scripts"),
        ({"sync_rate": float("nan"), "algorithm": "sliding-window"}, "sync_rate must be"),
    ],
)
def test_bad_sync_settings(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RateLimit(fakeredis.FakeAsyncRedis(), **options)  # type: ignore[arg-type]


def test_sync_rate_with_a_backend_object_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="applies to a Redis client"):
        RateLimit(MemoryBackend(), algorithm="sliding-window", sync_rate=1)


async def test_aclose_ends_even_when_a_sync_swallows_its_cancellation() -> None:
    """redis-py can swallow a cancellation that lands mid-read; aclose() must still end."""
    store = SyncThrough(fakeredis.FakeAsyncRedis())
    syncing = asyncio.Event()

    async def stubborn(pushes: Sequence[Push]) -> SyncReply:
        syncing.set()
        with contextlib.suppress(asyncio.CancelledError):  # as a swallowing client does
            await asyncio.sleep(0.05)
        return None, [{} for _ in pushes]

    store.through = stubborn
    rl = synced_through(store, 0.01, None)
    assert (await rl.limit("5/m", key="k").decide()).allowed
    await syncing.wait()  # aclose() now cancels a sync in flight
    await asyncio.wait_for(rl.aclose(), timeout=5)


async def test_hits_made_while_a_sync_is_in_flight_still_count(
    client: aioredis.Redis, clock: FakeClock
) -> None:
    """A sync takes the local diffs before Redis answers: until its reply lands, those hits
    must still count locally, or one process admits its limit twice."""
    store = SyncThrough(client, clock)
    rl = synced_through(store, 3600, clock)
    backend = backend_of(rl)
    sent, answer = asyncio.Event(), asyncio.Event()

    async def slow(pushes: Sequence[Push]) -> SyncReply:
        sent.set()
        await answer.wait()  # Redis has the diffs; its reply is still on the way
        return await store.engine.sync_counters(pushes)

    store.through = slow
    assert await admitted(rl, 10, "10/d") == 10
    sync = asyncio.create_task(backend.sync())
    await sent.wait()
    assert await admitted(rl, 10, "10/d") == 0  # was 10: twice the limit
    answer.set()
    await sync
    assert await admitted(rl, 10, "10/d") == 0
    assert counts(await client.hgetall("rl:{ns:k}:w")) == [10.0]
    await rl.aclose()


async def test_a_failed_sync_in_flight_gives_its_hits_back_to_the_local_count(
    client: aioredis.Redis, clock: FakeClock
) -> None:
    store = SyncThrough(client, clock)
    rl = synced_through(store, 3600, clock)
    backend = backend_of(rl)
    sent, fail = asyncio.Event(), asyncio.Event()

    async def failing(pushes: Sequence[Push]) -> SyncReply:
        sent.set()
        await fail.wait()
        raise BackendError("redis failed to sync counters: gone")

    store.through = failing
    assert await admitted(rl, 6, "10/d") == 6
    sync = asyncio.create_task(backend.sync())
    await sent.wait()
    assert await admitted(rl, 2, "10/d") == 2
    fail.set()
    with pytest.raises(BackendError):
        await sync
    assert await admitted(rl, 5, "10/d") == 2  # 6 + 2 + 2: nothing forgotten, nothing doubled
    store.through = None
    await backend.sync()
    assert counts(await client.hgetall("rl:{ns:k}:w")) == [10.0]
    await rl.aclose()


@pytest.mark.redis
async def test_one_process_never_admits_past_a_limit_on_its_own_hits(redis_url: str) -> None:
    """Back-to-back callers while syncs run every 10 ms, on a real Redis: one process can
    only overshoot by what other processes did, never on its own hits."""
    client = aioredis.Redis.from_url(redis_url)
    namespace = f"sync-{time.monotonic_ns()}"
    rl = RateLimit(  # no denial cache: every call asks the synced counters
        client, namespace, algorithm="sliding-window", sync_rate=0.01, timeout=None, denial_cache=0
    )
    limit = rl.limit("user:1000/d | 10/d", key="k", user="u")
    admitted_total = 0
    ends = time.monotonic() + 0.5  # some 50 syncs, however many calls fit in between
    while time.monotonic() < ends:
        results = await asyncio.gather(*(limit.decide() for _ in range(5)))
        admitted_total += sum(d.allowed for d in results)
        await asyncio.sleep(0)  # the sync task runs between rounds, its reply in flight
    await rl.aclose()
    await client.aclose()
    assert admitted_total == 10


async def test_a_clock_stepping_back_never_admits_more_locally(
    client: aioredis.Redis, clock: FakeClock
) -> None:
    rl = RateLimit(
        client, "ns", algorithm="sliding-window", sync_rate=3600, clock=clock, denial_cache=0
    )
    assert await admitted(rl, 6, "5/h") == 5
    clock.advance(-3600)
    assert await admitted(rl, 3, "5/h") == 0
    await backend_of(rl).sync()  # and after a sync, on Redis's totals
    assert await admitted(rl, 3, "5/h") == 0
    await rl.aclose()


async def test_the_sync_task_waits_through_the_sleep_it_is_given(clock: FakeClock) -> None:
    """Time is a parameter: the task's wait between syncs is injected, so a test steps it."""
    client = fakeredis.FakeAsyncRedis()
    waits: list[float] = []
    waiting = asyncio.Event()  # set while the task sleeps
    tick: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        waiting.set()
        await tick.get()
        waiting.clear()

    synced = SyncedBackend(RedisScriptBackend(client, clock=clock), 3600, clock=clock, sleep=sleep)
    rl = RateLimit(synced, "ns", algorithm="sliding-window")
    assert await admitted(rl, 2) == 2
    assert synced.unsynced() == 2.0
    await asyncio.wait_for(waiting.wait(), 10)  # the task sleeps its hour, virtually
    assert waits == [3600]
    assert not await client.exists("rl:{ns:k}:w")
    tick.put_nowait(None)  # the hour is over
    await asyncio.sleep(0)
    await asyncio.wait_for(waiting.wait(), 10)  # synced, and asleep again
    assert synced.unsynced() == 0
    assert counts(await client.hgetall("rl:{ns:k}:w")) == [2.0]
    assert waits == [3600, 3600]
    await rl.aclose()
    await client.aclose()
