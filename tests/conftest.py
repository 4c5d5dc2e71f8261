"""Fixtures: one contract suite over every backend, a private Redis, and a fake clock."""

from __future__ import annotations

import asyncio
import gc
import os
import selectors
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import fakeredis
import pytest
import redis.asyncio as aioredis
import valkey.asyncio as aiovalkey

from ratelimit import (
    BackendError,
    MemoryBackend,
    RateLimit,
    RedisCommandBackend,
    RedisScriptBackend,
)
from ratelimit.backends.base import Backend
from ratelimit.backends.postgres import PostgresBackend
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CounterUpdate, Plan
from tests.postgres_server import PostgresServer
from tests.redis_server import RedisServer, find_binary, server_version

T = TypeVar("T")


class FailingBackend(Backend):
    """A storage that never answers: every call raises ``BackendError``."""

    async def decide(self, plan: Plan) -> Decision:
        raise BackendError("storage down")

    async def reset(self, plan: Plan) -> None:
        raise BackendError("storage down")

    async def update_counter(self, update: CounterUpdate) -> float:
        raise BackendError("storage down")

    async def aclose(self) -> None: ...


class FakeClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        help="also run the tests marked long (multi-process runs, clusters, soaks): the "
        "whole suite, which CI runs; without it, the suite proving the contract on every "
        "store and front end, in minutes",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--long"):  # read by seeds() and examples() as modules are collected
        os.environ[LONG_RUN] = "1"
    else:
        os.environ.pop(LONG_RUN, None)


LONG_RUN = "RATELIMIT_LONG_TESTS"
"""Set under ``--long``: the randomized suites then run every seed and example."""


def seeds(whole: int, fast: int) -> range:
    """The seeds of a randomized suite: ``whole`` of them under ``--long`` (CI), ``fast``
    in the README's quick run (the others only move behind ``--long``)."""
    return range(whole if os.environ.get(LONG_RUN) else fast)


def examples(whole: int, fast: int) -> int:
    """Hypothesis's ``max_examples``: ``whole`` under ``--long``, ``fast`` otherwise."""
    return whole if os.environ.get(LONG_RUN) else fast


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``--long``, the tests marked ``long`` are deselected (not skipped: they are
    not this run's)."""
    if config.getoption("--long"):
        return
    kept = [item for item in items if item.get_closest_marker("long") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("long")])
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Keep what the run is made of (modules, test items: most of the process's objects)
    out of the collector's full passes. Each pass walked them all: 100-330 ms a pass
    halfway through the suite (measured), longer than a store's 0.25 s round-trip
    deadline on a loaded machine, so a call could time out in a test that is not about
    timeouts."""
    gc.collect()
    gc.freeze()


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Once per test module (after its first test), collect and set aside what the run
    has left alive since (module-level caches and the like), for the same reason. Between
    two tests, so that no test's deadline runs during the pass."""
    if location[0] != _last_module[0]:
        _last_module[0] = location[0]
        gc.collect()
        gc.freeze()


_last_module = [""]


def pytest_report_header() -> str:
    if os.environ.get("REDIS_URL"):
        return f"redis: REDIS_URL={os.environ['REDIS_URL']}"
    try:
        binary = find_binary()
    except FileNotFoundError as exc:
        return f"redis: {exc}"
    return f"redis: {binary} (version {server_version(binary)})"


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop with a clock of its own, for tests without I/O: when every task waits
    for a timer, the clock jumps to the next one instead of the loop sleeping. Sleeps take
    no real time, and tasks wake in the order real time would wake them."""

    def __init__(self) -> None:
        self.virtual_now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.virtual_now


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._jumping = loop

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        ready: list[tuple[Any, int]] = super().select(0)
        if not ready and timeout:  # nothing else to do before the next timer: jump to it
            self._jumping.virtual_now += timeout
        return ready


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` in a :class:`VirtualTimeLoop` and return what it returns."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


async def loop_sees_closed_connections() -> None:
    """Let the event loop run a few turns, as an application's loop does while Redis
    restarts: it reads the end of each connection Redis closed, so the pool opens a new one
    instead of writing to a dead socket (a call made in the very instant of a restart is
    degraded instead: it is never sent twice)."""
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis for this test session: ``REDIS_URL`` if given, else one started here."""
    given = os.environ.get("REDIS_URL")
    if given:
        yield given
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server for this test session, started here. Without PostgreSQL's
    binaries the tests that need one are skipped, unless ``RATELIMIT_REQUIRE_POSTGRES=1``
    (CI sets it) makes that a failure."""
    try:
        server = PostgresServer()
    except FileNotFoundError as exc:
        if os.environ.get("RATELIMIT_REQUIRE_POSTGRES") == "1":
            raise
        pytest.skip(str(exc))
    with server:
        yield server.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def namespace() -> str:
    """A namespace of this test's own, so tests never see each other's keys."""
    return f"test-{uuid.uuid4().hex[:12]}"


STORES = [
    "memory",
    "fakeredis",
    "fakeredis-commands",
    "fakeredis-spread",
    "fakeredis-spread-commands",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-commands", marks=pytest.mark.redis),
    # the spread layout's keys on a real Redis: once per CI run (not in its repeat passes)
    pytest.param("redis-spread", marks=[pytest.mark.redis, pytest.mark.once]),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
"""Every store and Redis engine, for a promise that must hold on each: build the backend with
:func:`store_backend` (and :func:`supporting` where an algorithm is not on every store).
``-spread``: the Redis engine with ``spread=True``, each identifier of a tree that spreads
under a hash tag of its own, as on a Redis Cluster client (here on one server)."""


Maker = Callable[[str], RateLimit]


@pytest.fixture(params=STORES)
async def make_limiter(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Maker]:
    """``make_limiter(algorithm)``: a limiter of a namespace of its own on the parametrized
    store (:data:`STORES`), driven by the fake clock; the test is skipped where the store
    does not decide ``algorithm``."""
    made: list[RateLimit] = []

    def factory(algorithm: str) -> RateLimit:
        backend = supporting(store_backend(request, request.param, clock), algorithm)
        limiter = RateLimit(backend, f"promise-{uuid.uuid4().hex[:8]}", algorithm=algorithm)
        made.append(limiter)
        return limiter

    yield factory
    for limiter in made:
        await limiter.aclose()


@pytest.fixture
def gcra(make_limiter: Maker) -> RateLimit:
    """A GCRA limiter on the parametrized store (:func:`make_limiter`)."""
    return make_limiter("gcra")


async def admitted(limit: Any, calls: int, cost: int = 1) -> int:
    """How many of ``calls`` decisions of ``cost`` each ``limit`` admits."""
    return sum([(await limit.decide(cost=cost)).allowed for _ in range(calls)])


BACKENDS = [
    *STORES[:-1],  # all but PostgreSQL, which decides not every algorithm
    pytest.param("valkey-client", marks=pytest.mark.redis),
    pytest.param("valkey-client-commands", marks=pytest.mark.redis),
]

BackendFactory = Callable[..., Backend]


def store_backend(
    request: pytest.FixtureRequest, kind: str, clock: Callable[[], float] | None = None
) -> Any:
    """A new backend of the store ``kind`` (one of :data:`STORES`), owning its client, on the
    Redis or PostgreSQL the tests started; ``-commands`` is the locked command engine,
    ``-spread`` keys spread as on a cluster."""
    if kind == "memory":
        return MemoryBackend(clock=clock)
    if kind == "postgres":
        return PostgresBackend(request.getfixturevalue("postgres_url"), clock=clock)
    client: Any
    if kind.startswith("fakeredis"):
        client = fakeredis.FakeAsyncRedis()
    else:
        client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    engine = RedisCommandBackend if kind.endswith("-commands") else RedisScriptBackend
    return engine(client, clock=clock, owns_client=True, spread="-spread" in kind or None)


def supporting(backend: Any, algorithm: str) -> Any:
    """``backend``, or the test skipped when the backend does not decide ``algorithm`` (its
    ``algorithms``): a test parametrized over backends and algorithms runs each algorithm
    on the stores that offer it. Every store offers the four of today; a new algorithm
    need not reach every store."""
    if algorithm not in getattr(backend, "algorithms", (algorithm,)):
        pytest.skip(f"{type(backend).__name__} does not decide {algorithm}")
    return backend


@pytest.fixture(params=BACKENDS)
async def make_backend(
    request: pytest.FixtureRequest,
) -> AsyncIterator[BackendFactory]:
    """A factory of backends of the parametrized kind: ``make_backend(clock=None)``.

    ``fakeredis``/``redis`` run the script engine; ``-commands`` the locked command engine;
    ``-spread`` spreads keys as on a cluster; ``valkey-client`` drives the real server
    through valkey-py's ``Valkey`` client.
    """
    kind: str = request.param
    clients: list[Any] = []
    made: list[Backend] = []

    def factory(clock: Callable[[], float] | None = None) -> Backend:
        backend = made_backend(clock)
        made.append(backend)
        return backend

    def made_backend(clock: Callable[[], float] | None) -> Backend:
        if kind == "memory":
            return MemoryBackend(clock=clock)
        client: Any
        if kind.startswith("fakeredis"):
            client = fakeredis.FakeAsyncRedis()
        elif kind.startswith("valkey"):
            client = aiovalkey.Valkey.from_url(request.getfixturevalue("redis_url"))
        else:
            client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
        clients.append(client)
        spread = "-spread" in kind or None
        if kind.endswith("-commands"):
            return RedisCommandBackend(client, clock=clock, spread=spread)
        return RedisScriptBackend(client, clock=clock, spread=spread)

    yield factory
    for backend in made:  # its background work (a spread engine's look) ends before its client
        await backend.aclose()
    for client in clients:
        await client.aclose()


@pytest.fixture
def make_rl(make_backend: BackendFactory, namespace: str) -> Callable[..., RateLimit]:
    """``make_rl(clock=None)``: a RateLimit on the parametrized backend, own namespace."""

    def factory(clock: Callable[[], float] | None = None) -> RateLimit:
        return RateLimit(make_backend(clock), namespace)

    return factory


@pytest.fixture
def rl(make_rl: Callable[..., RateLimit], clock: FakeClock) -> RateLimit:
    """A RateLimit on the parametrized backend driven by the fake clock."""
    return make_rl(clock)


@pytest.fixture(params=["fast", "public"])
def redis_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on the script engine's fast path and on redis-py's public API."""
    if request.param == "public":
        monkeypatch.setenv("RATELIMIT_REDIS_FAST_PATH", "0")
    else:
        monkeypatch.delenv("RATELIMIT_REDIS_FAST_PATH", raising=False)
    return str(request.param)


def selecting(rules: Any, **values: object) -> dict[str, Any]:
    """Of ``values``, those naming a selector of ``rules`` (text or a tree): what a test
    drawing rules and values apart passes to ``limit()``, which refuses a keyword that names
    no selector of its rules."""
    from ratelimit.core.plan import compile_tree
    from ratelimit.rules.tree import to_tree

    names = {name.partition("#")[0] for name in compile_tree(to_tree(rules)).selectors}
    return {name: value for name, value in values.items() if name in names}
