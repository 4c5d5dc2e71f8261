"""The sync API's direct path (:mod:`ratelimit.sync.direct`): a plain decision made in the
calling thread, with no hand-over to the limiter's loop, on memory:// and the Redis script
engine; everything else still on the loop, and every feature the same through both."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ratelimit import BackendError, Decision, RateLimitExceeded
from ratelimit.backends.redis.script.blocking import SyncPipeline
from ratelimit.sync import RateLimit
from ratelimit.sync.direct import LockedDenials
from ratelimit.sync.portal import Portal
from tests.conftest import FakeClock
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)

DIRECT = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


class HandOvers:
    """Counts the calls a limiter hands to its loop."""

    def __init__(self, portal: Portal) -> None:
        self.count = 0
        run = portal.run

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return run(*args, **kwargs)

        portal.run = counted  # type: ignore[method-assign]


@pytest.fixture(params=DIRECT)
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., RateLimit]]:
    """``make(**settings)``: a sync limiter on memory:// or the tests' Redis (script
    engine), in a namespace of the test's own; closed at the end."""
    made: list[RateLimit] = []

    def factory(**settings: Any) -> RateLimit:
        url = "memory://" if request.param == "memory" else request.getfixturevalue("redis_url")
        limiter = RateLimit.from_url(url, f"direct-{uuid.uuid4().hex[:12]}", **settings)
        made.append(limiter)
        return limiter

    yield factory
    for limiter in made:
        limiter.close()


def test_plain_decisions_are_made_in_the_calling_thread(make: Callable[..., RateLimit]) -> None:
    rl = make(clock=FakeClock())

    @rl.limit("user:3/m")
    def search(user: str) -> str:
        return user

    assert search("ann") == "ann"  # the first call registers the limit, on the loop
    handed = HandOvers(rl.portal)
    assert [search("ann"), search("ann")] == ["ann", "ann"]
    with pytest.raises(RateLimitExceeded) as refused:
        search("ann")
    assert str(refused.value.rule) == "user:3/m"
    assert refused.value.retry_after == pytest.approx(60.0, abs=0.5)
    with pytest.raises(RateLimitExceeded):
        search("ann")  # from the denial cache
    assert search("bob") == "bob"
    assert handed.count == 0
    assert not rl.limit("user:3/m", key="peek", user="ann").peek().degraded  # the loop


def test_other_stores_and_shapes_go_to_the_loop(request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_url")
    with RateLimit.from_url(url, "direct-commands", use_scripts=False) as rl:
        assert rl.direct is None
    with RateLimit.from_url("memory://", background=True) as rl:
        assert rl.direct is None
    with RateLimit.from_url("memory://", clock=FakeClock()) as rl:
        settled: list[int] = []

        def settle(result: int) -> int:
            settled.append(result)
            return 1

        @rl.limit("user:5/m", settle=settle)
        def settles(user: str) -> int:
            return 1

        @rl.limit("user:5/m", user=lambda: "ann")
        def called_selector() -> None: ...

        @rl.limit("user:5/m", cost=lambda user: 2)
        def priced(user: str) -> None: ...

        @rl.limit("user:1/m", wait=0.01)
        def waits(user: str) -> None: ...

        calls: list[Callable[[], object]] = [
            lambda: settles("ann"),
            called_selector,
            lambda: priced("ann"),
        ]
        for call in calls:
            call()
            handed = HandOvers(rl.portal)
            call()
            assert handed.count >= 1
        waits("ann")
        handed = HandOvers(rl.portal)
        with pytest.raises(RateLimitExceeded):
            waits("ann")  # refused after waiting: on the loop
        assert handed.count == 1
        assert settled == [1, 1]


def test_an_override_set_later_applies_at_the_next_call(make: Callable[..., RateLimit]) -> None:
    rl = make(clock=FakeClock())

    @rl.limit("user:5/m", key="search")
    def search(user: str) -> None: ...

    search("ann")
    search("ann")
    rl.overrides.set("search", "user:2/m", user="ann")
    with pytest.raises(RateLimitExceeded) as refused:
        search("ann")
    assert refused.value.decision.override
    search("bob")  # no override for bob: still the limit's own rules
    rl.overrides.delete("search", user="ann")
    search("ann")  # 5/m again


def test_hooks_and_shadow_see_every_decision(make: Callable[..., RateLimit]) -> None:
    seen: list[Decision] = []
    threads: set[str] = set()

    def hook(decision: Decision) -> None:  # hooks run on the limiter's loop, as documented
        asyncio.get_running_loop()
        threads.add(threading.current_thread().name)
        seen.append(decision)

    rl = make(clock=FakeClock(), hooks=[hook])

    @rl.limit("user:1/m")
    def work(user: str) -> None: ...

    work("ann")
    with pytest.raises(RateLimitExceeded):
        work("ann")
    assert [d.allowed for d in seen] == [True, False]
    assert threading.current_thread().name not in threads

    quiet = make(clock=FakeClock(), shadow=True)

    @quiet.limit("user:1/m")
    def shadowed(user: str) -> str:
        return "ran"

    assert shadowed("ann") == "ran"
    handed = HandOvers(quiet.portal)
    assert shadowed("ann") == "ran"  # refused in shadow: the body runs all the same
    assert handed.count == 0


def test_threads_on_the_direct_path_are_admitted_exactly(make: Callable[..., RateLimit]) -> None:
    rl = make(clock=FakeClock())

    @rl.limit("user:50/h")
    def call(user: str) -> None: ...

    call("warm")
    admitted = [0] * 8

    def worker(n: int) -> None:
        for _ in range(40):
            try:
                call("ann")
                admitted[n] += 1
            except RateLimitExceeded:
                pass

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 50
    assert isinstance(rl.limiter._denials, LockedDenials)
    assert rl.limiter.cached_refusals == 1


@pytest.mark.redis
@pytest.mark.parametrize("on_error", ["allow", "deny", "raise"])
def test_a_failure_on_the_direct_path_is_answered_by_the_failure_policy(on_error: str) -> None:
    with RedisServer() as server:
        rl = RateLimit.from_url(server.url, "direct-failing", on_error=on_error, timeout=1.0)
        try:

            @rl.limit("user:5/m")
            def work(user: str) -> None: ...

            work("ann")
            server.stop()
            handed = HandOvers(rl.portal)
            if on_error == "raise":
                with pytest.raises(BackendError):
                    work("ann")
            elif on_error == "deny":
                with pytest.raises(RateLimitExceeded) as refused:
                    work("ann")
                assert refused.value.decision.degraded
            else:
                work("ann")  # admitted, degraded
            assert handed.count == 0  # answered in this thread, as the loop answers
            if on_error != "raise":
                assert rl.storage_failing
                server.start()
                work("ann")  # an outage under way: the loop decides, and ends it
                assert handed.count == 1
                assert not rl.storage_failing
                work("ann")
                assert handed.count == 1  # plain again
        finally:
            rl.close()


@pytest.mark.redis
def test_plain_decorated_calls_on_redis_are_admitted_without_a_decision(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decorated function's plain calls take its table of plans and the script engine's
    ``admits`` in the calling thread, as the async decorator's do: an admission builds no
    decision; a refusal is read whole, raised, and remembered in the denial cache."""
    from ratelimit.core.evaluation import stored_verdict

    built: list[Decision] = []

    def counted(*args: Any) -> Decision:
        built.append(stored_verdict(*args))
        return built[-1]

    monkeypatch.setattr("ratelimit.backends.redis.script.decisions.stored_verdict", counted)
    with RateLimit.from_url(redis_url, f"direct-admits-{uuid.uuid4().hex[:8]}") as rl:

        @rl.limit("user:3/m")
        def work(user: str) -> str:
            return user

        assert work("ann") == "ann"  # the first call: the loop (a whole decision)
        handed = HandOvers(rl.portal)
        before = len(built)
        assert [work("ann"), work("ann")] == ["ann", "ann"]
        assert len(built) == before  # admitted by the script's verdict alone
        with pytest.raises(RateLimitExceeded) as refused:
            work("ann")
        assert len(built) == before + 1
        assert refused.value.decision.remaining == 0
        assert refused.value.decision.retry_after > 0
        assert rl.limiter.cached_refusals == 1
        with pytest.raises(RateLimitExceeded):
            work("ann")  # the denial cache answers (the general path, in this thread)
        assert len(built) == before + 1
        assert handed.count == 0
        key = f"{work.__module__}.{work.__qualname__}"
        assert rl.limit(key=key, user="bob").peek().remaining == 2  # another user untouched


@pytest.mark.redis
def test_a_script_flush_is_survived_on_the_direct_path(redis_url: str) -> None:
    import redis

    with RateLimit.from_url(redis_url, "direct-flush") as rl:

        @rl.limit("user:5/m", key="flushed")
        def work(user: str) -> None: ...

        work("ann")
        work("ann")
        redis.Redis.from_url(redis_url).script_flush()
        handed = HandOvers(rl.portal)
        work("ann")
        assert handed.count == 0
        assert rl.limit(key="flushed", user="ann").peek().remaining == 1


@pytest.mark.redis
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_dropped_or_closed_limiter_gives_back_its_direct_connections(redis_url: str) -> None:
    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    def used() -> RateLimit:
        rl = RateLimit.from_url(redis_url, f"direct-dropped-{uuid.uuid4().hex[:12]}")

        @rl.limit("user:5/m")
        def work(user: str) -> None: ...

        for user in ("a", "b", "c"):
            work(user)
        threads = [threading.Thread(target=work, args=("d",)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return rl

    used().close()
    gc.collect()
    before = descriptors()
    used().close()
    gc.collect()
    assert descriptors() <= before
    rl = used()
    thread = rl.portal._thread
    del rl
    gc.collect()
    assert thread is not None
    thread.join(10)
    assert descriptors() <= before


def crowded(rl: RateLimit) -> tuple[SyncPipeline, list[int]]:
    """``rl``'s direct Redis pipeline with every batch it may send out (as if threads were
    waiting for Redis): calls made now queue until :meth:`SyncPipeline._next`. Also the
    number of commands each write to Redis carried, as they go."""
    assert rl.direct is not None
    pipeline = rl.direct._decider.backend._pipeline  # type: ignore[attr-defined]
    assert isinstance(pipeline, SyncPipeline)
    written: list[int] = []
    talk = pipeline._talk

    def counted(commands: list[Any]) -> list[Any]:
        written.append(len(commands))
        return talk(commands)

    pipeline._talk = counted  # type: ignore[method-assign]
    pipeline._in_flight = pipeline._max_in_flight
    return pipeline, written


def queued_calls(pipeline: SyncPipeline, calls: list[Callable[[], object]]) -> list[object]:
    """Run each of ``calls`` in a thread of its own, all queued for one batch; what each
    returned or raised."""
    outcomes: list[object] = [None] * len(calls)

    def run(n: int) -> None:
        try:
            outcomes[n] = calls[n]()
        except Exception as exc:
            outcomes[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    queued = threading.Event()
    while not queued.wait(0.001):  # until every call waits in the queue
        if len(pipeline._queue) == len(calls):
            queued.set()
    pipeline._next()  # the batch out came back: the first queued call sends the rest
    for thread in threads:
        thread.join(10)
    return outcomes


@pytest.mark.redis
def test_crowding_threads_share_one_call_of_the_batch_script(redis_url: str) -> None:
    import redis

    with RateLimit.from_url(redis_url, f"direct-batch-{uuid.uuid4().hex[:12]}") as rl:

        @rl.limit("user:3/m")
        def work(user: str) -> str:
            return user

        work("warm")
        pipeline, written = crowded(rl)
        redis.Redis.from_url(redis_url).script_flush()  # the batch script is loaded then
        handed = HandOvers(rl.portal)
        calls: list[Callable[[], object]] = [lambda: work("ann") for _ in range(5)]
        calls.append(lambda: work("bob"))
        outcomes = queued_calls(pipeline, calls)
        assert written == [1]  # six decisions, one script call
        assert handed.count == 0
        assert sorted(map(repr, outcomes)).count("'ann'") == 3
        refused = [o for o in outcomes if isinstance(o, RateLimitExceeded)]
        assert len(refused) == 2
        assert all(str(r.rule) == "user:3/m" for r in refused)
        assert "bob" in outcomes
        assert pipeline._in_flight == pipeline._max_in_flight - 1  # the batch came back
        pipeline._in_flight = 0
        assert work("carl") == "carl"  # alone again: at once, from its own thread


@pytest.mark.redis
def test_a_failed_batch_is_answered_by_the_failure_policy_for_each_call() -> None:
    with RedisServer() as server:
        rl = RateLimit.from_url(server.url, "direct-batch-failing", on_error="deny", timeout=1.0)
        try:

            @rl.limit("user:3/m")
            def work(user: str) -> None: ...

            work("warm")
            pipeline, _ = crowded(rl)
            server.stop()
            outcomes = queued_calls(pipeline, [lambda: work("ann") for _ in range(4)])
            refusals = [o for o in outcomes if isinstance(o, RateLimitExceeded)]
            assert len(refusals) == 4
            assert all(refused.decision.degraded for refused in refusals)
            assert rl.storage_failing
        finally:
            rl.close()


def test_the_front_ends_door_decides_plain_calls_in_the_calling_thread(
    make: Callable[..., RateLimit],
) -> None:
    from ratelimit.core.plan import compile_tree
    from ratelimit.rules.tree import to_tree

    rl = make(clock=FakeClock())
    tree = compile_tree(to_tree("user:2/m"))
    cost = rl.check(tree)
    handed = HandOvers(rl.portal)
    assert rl.decide(tree, "door", ("ann",), cost=cost).remaining == 1
    assert rl.decide(tree, "door", ("ann",), cost=cost, record=False).remaining == 0
    assert rl.decide(tree, "door", ("ann",), cost=cost).allowed
    refused = rl.decide(tree, "door", ("ann",), cost=cost)
    assert not refused.allowed
    assert refused.retry_after == pytest.approx(60.0, abs=0.5)
    assert rl.decide(tree, "door", ("ann",), cost=cost, shadow=True).shadow
    assert handed.count == 0
    late = rl.decide(tree, "door", ("bob",), cost=cost, within=5.0)  # on the loop
    assert late.allowed
    assert handed.count == 1


@pytest.mark.redis
def test_threads_past_the_pools_connections_queue_instead_of_failing(redis_url: str) -> None:
    namespace = f"direct-pool-{uuid.uuid4().hex[:12]}"
    with RateLimit.from_url(redis_url, namespace, max_connections=2, on_error="raise") as rl:

        @rl.limit("user:1000/h")
        def work(user: str) -> None: ...

        work("warm")
        assert rl.direct is not None
        pipeline = rl.direct._decider.backend._pipeline  # type: ignore[attr-defined]
        assert pipeline._max_in_flight == 2  # never more out than the pool holds
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                for _ in range(20):
                    work("ann")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(pipeline._idle) <= 2
        key = f"{work.__module__}.{work.__qualname__}"
        assert rl.limit(key=key, user="ann").peek().remaining == 1000 - 160 - 1  # each counted
