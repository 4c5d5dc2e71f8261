"""One limiter used by one event loop after another: ``asyncio.run()`` twice, a loop per test.

These tests are plain functions that start their own loops, as an application does.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from ratelimit import EventLoopError, MemoryBackend, RateLimit
from ratelimit.backends.loops import abort_transport
from tests.test_service_tls import Authority

pytestmark = pytest.mark.redis

ENGINES = pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])


@pytest.fixture
def namespace() -> str:
    return f"loops-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(redis_url: str) -> Iterator[aioredis.Redis]:
    """The test's own client, for looking at Redis (used in one loop of its own)."""
    client = aioredis.Redis.from_url(redis_url)
    yield client
    asyncio.run(client.aclose())


def look(client: aioredis.Redis, *commands: tuple[str, ...]) -> list[object]:
    """Run a few commands on the test's own client, in a loop of their own."""

    async def run() -> list[object]:
        replies = [await client.execute_command(*command) for command in commands]  # type: ignore[no-untyped-call]
        await client.aclose()
        return replies

    return asyncio.run(run())


@ENGINES
def test_one_limiter_in_event_loop_after_event_loop(
    redis_url: str, client: aioredis.Redis, namespace: str, use_scripts: bool
) -> None:
    rl = RateLimit.from_url(redis_url, namespace, use_scripts=use_scripts, on_error="raise")
    limit = rl.limit("5/h", key="loops")

    async def three() -> list[bool]:
        return [(await limit.decide()).allowed for _ in range(3)]

    assert asyncio.run(three()) == [True, True, True]
    assert asyncio.run(three()) == [True, True, False]  # was: RuntimeError, loop closed
    assert asyncio.run(three()) == [False, False, False]

    asyncio.run(rl.aclose())  # in a loop of its own too
    stored = look(
        client, ("LLEN", f"rl:{{{namespace}:loops}}"), ("EXISTS", f"rl:{{{namespace}:loops}}:lock")
    )
    assert stored == [5, 0]  # counted once each, and no lock left behind


def test_background_hits_left_queued_by_one_loop_are_counted_by_the_next(
    redis_url: str, client: aioredis.Redis, namespace: str
) -> None:
    rl = RateLimit.from_url(redis_url, namespace, background=True)
    limit = rl.limit("5/h", key="bg")

    async def admitted(n: int) -> int:
        return sum([(await limit.decide()).allowed for _ in range(n)])

    assert asyncio.run(admitted(5)) == 5  # admitted at once; the loop ends before counting

    async def after() -> bool:
        await rl.flush()
        allowed = (await rl.limit("5/h", key="bg").peek()).allowed
        await rl.aclose()
        return allowed

    assert asyncio.run(after()) is False
    assert look(client, ("LLEN", f"rl:{{{namespace}:bg}}")) == [5]


def test_sync_rate_goes_on_syncing_in_the_next_loop(
    redis_url: str, client: aioredis.Redis, namespace: str
) -> None:
    rl = RateLimit.from_url(redis_url, namespace, algorithm="sliding-window", sync_rate=0.01)
    limit = rl.limit("10/h", key="sync")

    async def admitted(n: int) -> int:
        return sum([(await limit.decide()).allowed for _ in range(n)])

    assert asyncio.run(admitted(3)) == 3

    async def later() -> None:
        assert await admitted(2) == 2
        synced = rl.limit("10/h", key="sync")
        deadline = time.monotonic() + 10
        # another process's view: a limiter without local counters reads Redis
        reader = RateLimit.from_url(redis_url, namespace, algorithm="sliding-window")
        while (await reader.sliding_window("sync", 3600)) < 5:
            assert time.monotonic() < deadline, "no sync in the second loop"
            await asyncio.sleep(0.01)  # waiting for the sync task, not for a window
        assert (await synced.peek()).remaining == 10 - 5 - 1
        await reader.aclose()
        await rl.aclose()

    asyncio.run(later())


def test_the_memory_backend_serves_two_running_loops_at_once() -> None:
    """Nothing of the memory backend is tied to a loop (it takes a thread lock), so two
    threads' loops may share it; the Redis backends refuse (below)."""
    rl = RateLimit(MemoryBackend(), "two")
    limit = rl.limit("5/h", key="k")
    started, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    async def hold() -> None:
        await limit.decide()
        started.set()
        await asyncio.to_thread(release.wait, 10)  # the loop keeps running meanwhile

    thread = threading.Thread(target=lambda: asyncio.run(hold()))
    thread.start()
    try:
        assert started.wait(10)

        async def other() -> None:
            try:
                await limit.decide()
            except BaseException as exc:
                errors.append(exc)

        asyncio.run(other())
    finally:
        release.set()
        thread.join(10)
    assert errors == []


@pytest.mark.parametrize("store", ["redis", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_loops_running_at_once_are_refused(
    store: str, namespace: str, request: pytest.FixtureRequest
) -> None:
    """Redis and PostgreSQL limiters hold connections of one loop: a second running loop
    is refused at once, naming the cause; once both ended, a third closes it."""
    url = request.getfixturevalue(f"{store}_url")
    algorithm = "sliding-window" if store == "postgres" else "sliding-log"
    rl = RateLimit.from_url(url, namespace, algorithm=algorithm)
    limit = rl.limit("5/h", key="k")
    started, release = threading.Event(), threading.Event()

    async def hold() -> None:
        await limit.decide()
        started.set()
        await asyncio.to_thread(release.wait, 10)

    thread = threading.Thread(target=lambda: asyncio.run(hold()))
    thread.start()
    try:
        assert started.wait(10)
        with pytest.raises(EventLoopError, match="still running in another thread"):
            asyncio.run(limit.decide())
    finally:
        release.set()
        thread.join(10)
    asyncio.run(rl.aclose())  # closed from a third loop: the others have ended


def test_two_running_loops_take_turns_on_one_memory_limiter() -> None:
    """Two threads, each with its event loop running all along, decide in turn on one
    limiter: every call is decided, and the task that keeps the overrides up to date is
    not started again at every change of loop (one per switch, once; each then read the
    store from its own loop and failed: "Future attached to a different loop")."""
    rl = RateLimit(MemoryBackend(), "turns")
    limit = rl.limit("1000/h", key="k")
    turns = [threading.Event(), threading.Event()]
    allowed: list[bool] = []
    most_tasks = [0, 0]
    errors: list[BaseException] = []

    async def play(me: int) -> None:
        for _ in range(50):
            assert await asyncio.to_thread(turns[me].wait, 10)  # this loop runs meanwhile
            turns[me].clear()
            try:
                allowed.append((await limit.decide()).allowed)
            except BaseException as exc:
                errors.append(exc)
            most_tasks[me] = max(most_tasks[me], len(asyncio.all_tasks()))
            turns[1 - me].set()

    threads = [threading.Thread(target=lambda me=me: asyncio.run(play(me))) for me in (0, 1)]
    for thread in threads:
        thread.start()
    turns[0].set()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert allowed == [True] * 100
    assert max(most_tasks) <= 2  # the loop's own task, and at most one refreshing


class SlowOverrides(MemoryBackend):
    """A memory store whose first reading of the overrides waits until the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.reading, self.release = threading.Event(), threading.Event()

    async def overrides_version(self, namespace: str) -> int:
        if not self.reading.is_set():
            self.reading.set()
            await asyncio.to_thread(self.release.wait, 10)
        return await super().overrides_version(namespace)


def test_a_loop_does_not_wait_for_a_reading_another_loop_has_under_way() -> None:
    """The first decision of one loop reads the overrides (slowly); the first of another
    loop, meanwhile, reads them in its own loop (it awaited the first loop's reading:
    "Future attached to a different loop")."""
    store = SlowOverrides()
    rl = RateLimit(store, "slow")
    limit = rl.limit("5/h", key="k")
    first: list[bool] = []
    thread = threading.Thread(target=lambda: first.append(asyncio.run(limit.decide()).allowed))
    thread.start()
    try:
        assert store.reading.wait(10)
        assert asyncio.run(limit.decide()).allowed
    finally:
        store.release.set()
        thread.join(10)
    assert first == [True]
    assert asyncio.run(limit.peek()).remaining == 5 - 2 - 1  # both counted


def test_a_slot_given_back_in_one_loop_wakes_a_caller_waiting_in_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body that ends in one thread's loop wakes the caller another thread's loop has
    waiting for its slot (it set that loop's event from the wrong thread, which woke
    nothing until the caller's next poll)."""
    monkeypatch.setattr("ratelimit.front.concurrency.MIN_POLL", 20.0)  # only a release wakes it
    monkeypatch.setattr("ratelimit.front.concurrency.MAX_POLL", 20.0)
    rl = RateLimit(MemoryBackend(), "slots")
    slot = rl.concurrency("1", key="k", wait=60)
    held = threading.Event()
    took: list[float] = []

    async def wait_for_it() -> None:
        assert await asyncio.to_thread(held.wait, 10)
        async with slot:
            took.append(time.monotonic())

    thread = threading.Thread(target=lambda: asyncio.run(wait_for_it()))
    thread.start()

    async def hold() -> None:
        async with slot:
            held.set()
            while slot._released is None:  # noqa: ASYNC110  (set by the other thread's loop)
                await asyncio.sleep(0.001)

    try:
        asyncio.run(hold())
        released = time.monotonic()
    finally:
        thread.join(60)
    assert len(took) == 1
    assert took[0] - released < 10  # woken by the release, not by a 20 s poll


def test_a_tls_connection_of_a_closed_loop_is_closed_outside_it(tmp_path: Path) -> None:
    """A connection left by an ended loop is closed by :func:`abort_transport` (a limiter
    moving to another loop, a PostgreSQL pool forgotten): over TLS its socket stayed open,
    the TLS transport having none of its own."""
    ca = Authority(tmp_path, "ca")
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    leaf = ca.issue("server", ExtendedKeyUsageOID.SERVER_AUTH, names)
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(leaf.cert, leaf.key)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[ssl.SSLSocket] = []

    def serve() -> None:
        connection, _ = listener.accept()
        accepted.append(serving.wrap_socket(connection, server_side=True))

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    loop = asyncio.new_event_loop()
    opened = asyncio.open_connection(
        *listener.getsockname(), ssl=ssl.create_default_context(cafile=str(ca.pem))
    )
    _, writer = loop.run_until_complete(asyncio.wait_for(opened, 10))
    raw = writer.transport.get_extra_info("socket")
    assert raw.fileno() >= 0
    loop.close()  # the loop ended with the connection open
    abort_transport(writer.transport, loop)
    assert raw.fileno() == -1
    server.join(10)
    for each in (*accepted, listener):
        each.close()
