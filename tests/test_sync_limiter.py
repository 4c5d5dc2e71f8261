"""The synchronous API (``ratelimit.sync``): the async limiter's contract for plain functions
and threads, on memory, Redis (script and command engines) and PostgreSQL; threads sharing
one limiter, context variables seen by selectors, a forked child, and the event-loop
guard."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import multiprocessing
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ratelimit import (
    ConcurrencyLimitExceeded,
    ConfigurationError,
    EventLoopError,
    LimiterClosedError,
    RateLimitExceeded,
)
from ratelimit.sync import RateLimit
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(60)

STORES = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-commands", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


def sync_limiter_on(request: pytest.FixtureRequest, namespace: str, **settings: Any) -> RateLimit:
    """A sync limiter of ``namespace`` on the store kind ``request.param`` (of :data:`STORES`):
    the Redis or PostgreSQL the tests started, or memory://."""
    kind: str = request.param
    if kind == "memory":
        url = "memory://"
    elif kind == "postgres":
        url = request.getfixturevalue("postgres_url")
        settings.setdefault("algorithm", "sliding-window")
    else:
        url = request.getfixturevalue("redis_url")
        if kind == "redis-commands":
            settings["use_scripts"] = False
    return RateLimit.from_url(url, namespace, **settings)


@pytest.fixture(params=STORES)
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., RateLimit]]:
    """``make(**settings)``: a sync limiter on the parametrized store, in a namespace of the
    test's own; closed at the end."""
    made: list[RateLimit] = []

    def factory(**settings: Any) -> RateLimit:
        limiter = sync_limiter_on(request, f"sync-{uuid.uuid4().hex[:12]}", **settings)
        made.append(limiter)
        return limiter

    yield factory
    for limiter in made:
        limiter.close()


def test_a_decorated_def_stays_a_def_and_counts_per_selector(
    make: Callable[..., RateLimit],
) -> None:
    rl = make(clock=FakeClock())

    @rl.limit("user:2/m")
    def search(user: str, q: str = "") -> str:
        return f"{user}:{q}"

    assert not inspect.iscoroutinefunction(search)
    assert search("ann", q="x") == "ann:x"
    assert search(user="ann") == "ann:"
    with pytest.raises(RateLimitExceeded) as refused:
        search("ann")
    assert str(refused.value.rule) == "user:2/m"
    assert search("bob") == "bob:"  # another user, another counter


def test_with_blocks_and_blocking_methods(make: Callable[..., RateLimit]) -> None:
    rl = make(clock=FakeClock())
    limit = rl.limit("3/m", key="export")
    with limit as decision:
        assert decision.allowed
    assert limit.peek().remaining == 1  # left after such a call; peeking counts nothing
    assert limit.peek().remaining == 1
    assert limit.decide().allowed
    assert limit.acquire().remaining == 0
    assert not limit.decide().allowed
    with pytest.raises(RateLimitExceeded):
        limit.acquire()
    limit.reset()
    assert limit.decide().allowed


def test_selectors_from_literals_callables_and_the_calling_threads_context(
    make: Callable[..., RateLimit],
) -> None:
    rl = make(clock=FakeClock())
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant")

    @rl.limit("tenant:1/m | plan:5/m", tenant=tenant.get, plan="free")
    def work() -> None: ...

    def in_thread(name: str, outcome: list[bool]) -> None:
        tenant.set(name)  # as Flask sets its request context in the serving thread
        try:
            work()
            outcome.append(True)
        except RateLimitExceeded:
            outcome.append(False)

    outcomes: list[bool] = []
    threads = [threading.Thread(target=in_thread, args=(n, outcomes)) for n in ("a", "b", "a")]
    for thread in threads:
        thread.start()
        thread.join()
    assert outcomes == [True, True, False]  # tenant a's second call: its own counter


def test_threads_sharing_one_limiter_are_admitted_exactly(make: Callable[..., RateLimit]) -> None:
    rl = make(clock=FakeClock())

    @rl.limit("100/h", key="shared")
    def call() -> None: ...

    admitted = 0
    lock = threading.Lock()

    def hammer() -> None:
        nonlocal admitted
        for _ in range(25):
            try:
                call()
            except RateLimitExceeded:
                continue
            with lock:
                admitted += 1

    threads = [threading.Thread(target=hammer) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert admitted == 100  # of 400


def test_a_cost_per_call_settled_after_it(make: Callable[..., RateLimit]) -> None:
    rl = make(clock=FakeClock())

    @rl.limit("key:100 tokens/h", cost=lambda key, n: {"tokens": n}, settle=lambda used: used)
    def complete(key: str, n: int) -> dict[str, int]:
        return {"tokens": n // 4}  # used a quarter of what it reserved

    complete("k", 80)  # reserves 80, settles at 20
    complete("k", 80)  # 20 + 80 fits in 100 only after the refund
    with pytest.raises(RateLimitExceeded):
        complete("k", 80)  # 40 + 80 > 100


def test_concurrency_slots_in_threads_and_with(make: Callable[..., RateLimit]) -> None:
    rl = make()
    if "Postgres" in type(rl.limiter.storage).__name__:  # as the async API: when made
        with pytest.raises(ConfigurationError, match="holds no concurrency slots"):
            rl.concurrency("2", key="reports")
        return
    slots = rl.concurrency("2", key="reports")
    inside = threading.Barrier(3)
    leave = threading.Event()

    @slots
    def report() -> None:
        inside.wait(10)
        leave.wait(10)

    holders = [threading.Thread(target=report) for _ in range(2)]
    for thread in holders:
        thread.start()
    inside.wait(10)  # both bodies run, holding the two slots
    with pytest.raises(ConcurrencyLimitExceeded):
        report()
    leave.set()
    for thread in holders:
        thread.join()
    with slots, slots, pytest.raises(ConcurrencyLimitExceeded), slots:  # both free again
        pass


def test_overrides_are_blocking_too(make: Callable[..., RateLimit]) -> None:
    rl = make(clock=FakeClock(), override_refresh=0)

    @rl.limit("user:1/m", key="api")
    def api(user: str) -> None: ...

    rl.overrides.set("api", "user:3/m", user="vip")
    assert rl.overrides.get("api", user="vip") is not None
    for _ in range(3):
        api("vip")
    with pytest.raises(RateLimitExceeded):
        api("vip")
    assert rl.overrides.delete("api", user="vip")


def test_a_coroutine_function_is_refused_pointing_to_the_async_api() -> None:
    refused = pytest.raises(TypeError, match="use ratelimit.RateLimit for coroutines")
    with RateLimit.from_url("memory://") as rl, refused:

        @rl.limit("1/s")
        async def fetch() -> None: ...


def test_calling_it_from_a_running_event_loop_is_a_clear_error() -> None:
    with RateLimit.from_url("memory://") as rl:
        limit = rl.limit("5/s", key="k")

        async def inside() -> None:
            with pytest.raises(EventLoopError, match="use ratelimit.RateLimit"):
                limit.decide()

        asyncio.run(inside())
        assert limit.decide().allowed  # outside a loop, fine


def test_bad_settings_and_rules_fail_when_made() -> None:
    with pytest.raises(ConfigurationError, match="on_error"):
        RateLimit.from_url("memory://", on_error="maybe")
    with RateLimit.from_url("memory://") as rl, pytest.raises(ValueError, match="10/x"):
        rl.limit("10/x")


def test_a_closed_limiter_decides_nothing() -> None:
    rl = RateLimit.from_url("memory://")
    limit = rl.limit("5/s", key="k")
    rl.close()
    with pytest.raises(LimiterClosedError):
        limit.decide()


# --- fork ---


def _child_decides(rl: RateLimit, queue: Any) -> None:
    try:
        outcomes = [rl.limit("10/h", key="forked").decide().allowed for _ in range(8)]
        queue.put(sum(outcomes))
    except Exception as exc:  # reported to the parent
        queue.put(f"{type(exc).__name__}: {exc}")


def _child_calls(call: Callable[[], None], again: Any, queue: Any) -> None:
    """Limits made before the fork: a decorated function, and a limit reusing its key."""
    admitted = 0
    try:
        for _ in range(8):
            try:
                call()
                admitted += 1
            except RateLimitExceeded:
                pass
        queue.put((admitted, again.peek().allowed))
    except Exception as exc:  # reported to the parent
        queue.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.redis
def test_a_forked_child_opens_its_own_connections_and_shares_the_counters(
    redis_url: str,
) -> None:
    context = multiprocessing.get_context("fork")
    with RateLimit.from_url(redis_url, f"fork-{uuid.uuid4().hex[:8]}") as rl:
        assert sum(rl.limit("10/h", key="forked").decide().allowed for _ in range(4)) == 4
        queue = context.Queue()
        children = [context.Process(target=_child_decides, args=(rl, queue)) for _ in range(2)]
        for child in children:
            child.start()
        got = [queue.get(timeout=30) for _ in children]
        for child in children:
            child.join(30)
            assert child.exitcode == 0
        assert sum(got) == 6, got  # 10 in all, shared with the parent's 4
        assert not rl.limit("10/h", key="forked").decide().allowed


@pytest.mark.redis
def test_limits_made_before_the_fork_work_in_the_child(redis_url: str) -> None:
    context = multiprocessing.get_context("fork")
    with RateLimit.from_url(redis_url, f"fork-{uuid.uuid4().hex[:8]}") as rl:

        @rl.limit("5/h", key="before")
        def call() -> None: ...

        again = rl.limit(key="before")  # the rules registered by the one above
        call()
        queue = context.Queue()
        child = context.Process(target=_child_calls, args=(call, again, queue))
        child.start()
        got = queue.get(timeout=30)
        child.join(30)
        assert child.exitcode == 0
    assert got == (4, False), got  # 5 in all, one of them the parent's


def test_a_limiter_made_from_a_storage_object_refuses_a_forked_child() -> None:
    from ratelimit import MemoryBackend

    context = multiprocessing.get_context("fork")
    with RateLimit(MemoryBackend()) as rl:
        rl.limit("10/h", key="forked").decide()
        queue = context.Queue()
        child = context.Process(target=_child_decides, args=(rl, queue))
        child.start()
        said = queue.get(timeout=30)
        child.join(30)
    assert "ConfigurationError" in said
    assert "RateLimit.from_url" in said


# --- closing, and what must never hang ---


def test_closing_under_calls_answers_every_caller() -> None:
    """Threads mid-call when the limiter closes: each gets its decision or
    ``LimiterClosedError``, none waits for ever, no thread of the limiter is left."""
    others = set(threading.enumerate())  # other tests' limiters may still run
    for _ in range(5):
        rl = RateLimit.from_url("memory://")
        limit = rl.limit("1000/m", key="k", wait=True)
        outcomes: list[str] = []
        started = threading.Barrier(7)

        def call(
            limit: Any = limit, outcomes: list[str] = outcomes, started: Any = started
        ) -> None:
            started.wait(10)
            for _ in range(50):
                try:
                    limit.decide()
                except LimiterClosedError:
                    outcomes.append("closed")
                    return
            outcomes.append("done")

        threads = [threading.Thread(target=call) for _ in range(6)]
        for thread in threads:
            thread.start()
        started.wait(10)
        rl.close()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()  # none hangs
        assert len(outcomes) == 6
        left = set(threading.enumerate()) - others
        assert not [t for t in left if t.name.startswith("ratelimit.sync")]


def test_close_from_the_loop_or_an_event_loop_is_refused_and_changes_nothing() -> None:
    with RateLimit.from_url("memory://") as rl:
        seen: list[BaseException] = []

        def closing_selector() -> str:
            try:
                rl.close()
            except EventLoopError as exc:
                seen.append(exc)
            return "u"

        rl.limit("user:5/m", key="k", user=closing_selector).decide()
        assert isinstance(seen[0], EventLoopError)

        async def inside() -> None:
            with pytest.raises(EventLoopError):
                rl.close()

        asyncio.run(inside())
        assert rl.limit("5/m", key="still").decide().allowed  # not closed by either


def test_failed_construction_and_calls_after_close_leave_no_thread() -> None:
    def threads() -> int:
        return sum(t.name.startswith("ratelimit.sync") for t in threading.enumerate())

    before = threads()
    for _ in range(5):
        with pytest.raises(ConfigurationError):
            RateLimit.from_url("memory://", on_error="maybe")
    assert threads() == before
    rl = RateLimit.from_url("memory://")
    rl.close()
    with pytest.raises(LimiterClosedError):
        rl.limit("5/m", key="k").decide()
    assert threads() == before


def _first_calls_at_once(rl: RateLimit, queue: Any) -> None:
    errors: list[str] = []
    go = threading.Barrier(8)

    def first() -> None:
        go.wait(10)
        try:
            rl.limit("100/h", key="race").decide()
        except Exception as exc:  # reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=first) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    queue.put((rl.generation, errors))


@pytest.mark.redis
def test_the_threads_of_a_forked_child_calling_at_once_share_one_new_limiter(
    redis_url: str,
) -> None:
    context = multiprocessing.get_context("fork")
    with RateLimit.from_url(redis_url, f"fork-{uuid.uuid4().hex[:8]}") as rl:
        rl.limit("100/h", key="race").decide()
        queue = context.Queue()
        child = context.Process(target=_first_calls_at_once, args=(rl, queue))
        child.start()
        generation, errors = queue.get(timeout=30)
        child.join(30)
    assert errors == []
    assert generation == 1  # built once, not once per thread
