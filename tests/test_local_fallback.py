"""``on_error="local"`` (issue 39, part 1): while the store fails, each process decides on
its own share of each limit, and goes back to the store once it answers (a store that fails
on demand, a fake clock: nothing sleeps). The 4-process run on a real Redis, killed and
restarted, is tests/test_local_fallback_processes.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from flask import Flask

from ratelimit import (
    And,
    ConfigurationError,
    MemoryBackend,
    Or,
    RateLimit,
    RateLimitExceeded,
    Settings,
)
from ratelimit.asgi import RateLimitMiddleware, Route
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan, compile_tree
from ratelimit.core.slots import SlotClaim
from ratelimit.errors import BackendError
from ratelimit.flask import FlaskRateLimit
from ratelimit.flask import Route as FlaskRoute
from ratelimit.front.concurrency import ConcurrencyLimitExceeded
from ratelimit.pipeline import fallback
from ratelimit.pipeline.decider import PING_KEY
from ratelimit.pipeline.fallback import PROBE_EVERY, scaled_count, scaled_tree
from ratelimit.rules.tree import Rule, to_tree
from ratelimit.sync import RateLimit as SyncRateLimit
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(30)


class Flaky(MemoryBackend):
    """A memory store that fails (``BackendError``) while ``down``; counts what it was
    asked (``asked``: decisions, ``probes``: the questions that count nothing)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.down = False
        self.asked = 0
        self.probes = 0

    async def decide(self, plan: Plan) -> Decision:
        if plan.key == PING_KEY:
            self.probes += 1
        else:
            self.asked += 1
        if self.down:
            raise BackendError("store down")
        return await super().decide(plan)

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        if self.down:
            raise BackendError("store down")
        return await super().acquire_slots(claim)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The decisions' clock, which paces the probes too (:data:`fallback.monotonic`)."""
    clock = FakeClock()
    monkeypatch.setattr(fallback, "monotonic", clock)
    return clock


@pytest.fixture
def store(clock: FakeClock) -> Flaky:
    return Flaky(clock)


async def settle_tasks() -> None:
    """Let the probe task the last call started run (turns of the loop, no time)."""
    for _ in range(5):
        await asyncio.sleep(0)


# --- scaling ---


def test_counts_and_bursts_scale_down_to_at_least_one() -> None:
    assert [scaled_count(n, 0.25) for n in (100, 7, 3, 1)] == [25, 1, 1, 1]
    assert scaled_count(100, 0.29) == 29  # 100 * 0.29 is 28.999...: not 28
    tree = scaled_tree(to_tree("user:100/h & (10/s burst 20 | apikey:9000 tokens/m)"), 0.5)
    assert tree == And(
        Rule(50, 3_600_000, "user"),
        Or(Rule(5, 1000, burst=10), Rule(4500, 60_000, "apikey", unit="tokens")),
    )


async def test_a_tree_is_scaled_once(store: Flaky) -> None:
    rl = RateLimit(store, on_error="local", local_share=0.5)
    local = rl._policy.local
    assert local is not None
    compiled = compile_tree(to_tree("user:10/m"))
    assert local.scaled(compiled) is local.scaled(compiled)
    assert local.scaled(compiled).rules == (Rule(5, 60_000, "user"),)


# --- deciding locally ---


async def test_local_decisions_admit_the_share_and_say_degraded(store: Flaky) -> None:
    rl = RateLimit(store, on_error="local", local_share=0.5, denial_cache=100)
    limit = rl.limit("user:8/h", key="k", user="ann")
    assert (await limit.decide()).allowed  # the store decides, and counts
    store.down = True
    decisions = [await limit.decide() for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 4 + [False] * 2  # 8 * 0.5 locally
    assert all(d.degraded for d in decisions)
    refused = decisions[-1]
    assert refused.rule == Rule(8, 3_600_000, "user")  # the limit's own rule, not 4/h
    assert refused.retry_after > 3000
    assert refused.states[0].rule == Rule(8, 3_600_000, "user")
    assert [d.remaining for d in decisions[:4]] == [3, 2, 1, 0]
    assert rl.cached_refusals == 0  # local refusals are not kept: the store decides again
    with pytest.raises(RateLimitExceeded) as raised:
        async with rl.limit("user:8/h", key="k", user="ann"):
            pass
    message = str(raised.value)
    assert "local share of rule 'user:8/h'" in message
    assert "on_error='deny'" not in message
    assert store.asked == 2  # the first failure; then no call waits on the dead store
    await rl.aclose()


async def test_an_outage_probes_at_most_every_probe_period_and_goes_back(
    store: Flaky, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[str] = []

    class Events:
        def __call__(self, decision: Decision) -> None: ...

        def store_failed(self) -> None:
            events.append("store_failed")

        def outage_started(self) -> None:
            events.append("outage_started")

        def outage_ended(self, seconds: float) -> None:
            events.append("outage_ended")

    rl = RateLimit(store, on_error="local", local_share=0.5, hooks=[Events()])
    limit = rl.limit("10/h", key="probed")
    store.down = True
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        for _ in range(20):
            assert (await limit.decide()).degraded
            await settle_tasks()
        assert store.probes == 1  # one probe per period, however many calls
        clock.advance(PROBE_EVERY / 2)
        await limit.decide()
        await settle_tasks()
        assert store.probes == 1
        clock.advance(PROBE_EVERY / 2)
        await limit.decide()
        await settle_tasks()
        assert store.probes == 2
        store.down = False
        assert (await limit.decide()).degraded  # the last probe was just now
        clock.advance(PROBE_EVERY)
        assert (await limit.decide()).degraded  # decided locally; its probe finds the store
        await settle_tasks()
        assert not rl.storage_failing
        back = await limit.decide()
    assert not back.degraded
    assert back.remaining == 9  # local decisions recorded nothing at the store
    assert store.asked == 2
    assert events.count("outage_started") == 1
    assert events.count("outage_ended") == 1
    assert events.count("store_failed") == 1  # one call of the store failed
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings  # once when it starts, once when it ends
    assert "deciding in-process" in warnings[0]
    assert "24 decisions were degraded" in warnings[1]
    await rl.aclose()


async def test_an_injected_clock_that_never_moves_still_goes_back_to_the_store(
    store: Flaky, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes are paced on the monotonic clock, not on a clock injected for the decisions
    (which a test may never move): here a fake monotonic clock of its own moves alone."""
    pace = FakeClock(start=50.0)
    monkeypatch.setattr(fallback, "monotonic", pace, raising=False)
    rl = RateLimit(store, on_error="local", local_share=0.5)
    limit = rl.limit("10/h", key="still")
    store.down = True
    assert (await limit.decide()).degraded  # the failure, and the first probe
    await settle_tasks()
    store.down = False
    pace.advance(PROBE_EVERY)  # the decisions' clock stands still
    assert (await limit.decide()).degraded  # decided locally; its probe finds the store
    await settle_tasks()
    assert not rl.storage_failing
    back = await limit.decide()
    assert not back.degraded
    assert back.remaining == 9
    await rl.aclose()


async def test_healthy_store_makes_no_local_store(store: Flaky) -> None:
    rl = RateLimit(store, on_error="local", local_share=0.5)
    local = rl._policy.local
    assert local is not None

    @rl.limit("user:3/m")
    async def search(user: str) -> str:
        return user

    assert [await search("ann") for _ in range(3)] == ["ann"] * 3
    with pytest.raises(RateLimitExceeded) as raised:
        await search("ann")
    assert not raised.value.decision.degraded
    assert local._store is None
    assert store.probes == 0
    await rl.aclose()


async def test_a_decision_past_its_deadline_is_decided_locally(clock: FakeClock) -> None:
    class Hung(Flaky):
        async def decide(self, plan: Plan) -> Decision:
            await asyncio.Event().wait()  # never answers: the deadline must end it
            raise AssertionError

    rl = RateLimit(Hung(clock), on_error="local", local_share=0.5)
    tree = compile_tree(to_tree("2/h"))
    first = await rl.decide(tree, "late", within=0.05)
    assert first.allowed
    assert first.degraded
    second = await rl.decide(tree, "late")  # an outage under way: local at once
    assert not second.allowed
    assert second.degraded
    assert second.rule == Rule(2, 3_600_000)
    await rl.aclose()


async def test_an_override_in_force_is_scaled_too(store: Flaky) -> None:
    rl = RateLimit(store, on_error="local", local_share=0.5)
    limit = rl.limit("user:100/h", key="api", user="ann")
    await rl.overrides.set("api", "user:6/h", user="ann")
    assert (await limit.decide()).override
    store.down = True
    decisions = [await limit.decide() for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]  # 6 * 0.5
    assert decisions[-1].rule == Rule(6, 3_600_000, "user")
    await rl.aclose()


# --- concurrency slots ---


async def test_slots_are_taken_and_given_back_on_the_local_store(store: Flaky) -> None:
    rl = RateLimit(store, on_error="local", local_share=0.5)
    slots = rl.concurrency("user:4", key="jobs", user="ann")
    store.down = True
    async with slots as first, slots as second:
        assert first.degraded
        assert first.allowed
        assert second.allowed
        with pytest.raises(ConcurrencyLimitExceeded) as raised:
            async with slots:
                pass
        assert raised.value.decision.degraded
    local = rl._policy.local
    assert local is not None
    assert not local.local_claims
    async with slots as again:  # both were given back to the local store
        assert again.allowed
        assert again.degraded
    store.down = False
    await rl.aclose()


# --- front ends: they all go through the decider ---


async def test_the_decorator_and_rate_limit_decide(store: Flaky) -> None:
    rl = RateLimit(store, on_error="local", local_share=0.25)

    @rl.limit("user:8/h")
    async def search(user: str) -> str:
        return user

    store.down = True
    assert [await search("bob") for _ in range(2)] == ["bob", "bob"]
    with pytest.raises(RateLimitExceeded) as raised:
        await search("bob")
    assert raised.value.decision.degraded
    tree = compile_tree(to_tree("user:8/h"))
    answers = [await rl.decide(tree, "own", ("eve",)) for _ in range(3)]
    assert [a.allowed for a in answers] == [True, True, False]
    await rl.aclose()


async def test_the_asgi_middleware(store: Flaky) -> None:
    rl = RateLimit(store, on_error="local", local_share=0.5)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limited = RateLimitMiddleware(app, rl, [Route("/x", "4/h")])
    transport = httpx.ASGITransport(app=limited)
    store.down = True
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        statuses = [(await client.get("/x")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]  # 4 * 0.5 locally, then refused as any refusal
    await rl.aclose()


def test_the_sync_api_and_flask(clock: FakeClock) -> None:
    store = Flaky(clock)
    rl = SyncRateLimit(store, on_error="local", local_share=0.5)

    @rl.limit("user:4/h")
    def search(user: str) -> str:
        return user

    store.down = True
    assert [search("ann"), search("ann")] == ["ann", "ann"]
    with pytest.raises(RateLimitExceeded) as raised:
        search("ann")
    assert raised.value.decision.degraded
    app = Flask(__name__)
    FlaskRateLimit(rl, app, routes=[FlaskRoute("/ping", "6/h")])
    app.add_url_rule("/ping", "ping", lambda: "pong")
    client = app.test_client()
    assert [client.get("/ping").status_code for _ in range(4)] == [200, 200, 200, 429]
    rl.close()


# --- checked when made ---


@pytest.mark.parametrize("share", [0, -0.5, 1.5, float("nan"), "0.5", True, None])
def test_a_bad_local_share_fails_when_made(share: object) -> None:
    with pytest.raises(ConfigurationError, match="local_share must be a number"):
        Settings(on_error="local", local_share=share)  # type: ignore[arg-type]


def test_local_share_without_on_error_local_fails() -> None:
    with pytest.raises(ConfigurationError, match="applies only to on_error='local'"):
        RateLimit.from_url("memory://", local_share=0.5)
    with pytest.raises(ConfigurationError, match="applies only to on_error='local'"):
        SyncRateLimit.from_url("memory://", on_error="deny", local_share=0.5)


def test_local_refuses_background_and_sync_rate() -> None:
    with pytest.raises(ConfigurationError, match="background=False"):
        RateLimit.from_url("memory://", on_error="local", background=True)
    with pytest.raises(ConfigurationError, match="sync_rate=0"):
        Settings(on_error="local", sync_rate=1, algorithm="sliding-window")


def test_on_error_names_local() -> None:
    with pytest.raises(ConfigurationError, match="allow, deny, raise, local"):
        Settings(on_error="fallback")
    assert Settings(on_error="local", local_share=1).local_share == 1


# --- other stores ---


async def test_a_postgres_store_that_cannot_be_reached_falls_back_alike() -> None:
    pytest.importorskip("asyncpg")
    from tests.redis_server import free_port

    url = f"postgresql://user:secret@127.0.0.1:{free_port()}/nowhere"  # nothing listens
    rl = RateLimit.from_url(
        url, on_error="local", local_share=0.5, algorithm="sliding-window", timeout=5.0
    )
    limit = rl.limit("user:6/h", key="pg", user="ann")
    decisions = [await limit.decide() for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]  # 6 * 0.5
    assert all(d.degraded for d in decisions)
    await rl.aclose()


@pytest.mark.redis
def test_the_sync_api_on_a_real_redis_killed_and_restarted(clock: FakeClock) -> None:
    """The sync API decides in the calling thread on Redis (its direct path): a failure
    there is decided locally too, and the limiter's loop probes the store."""
    from tests.redis_server import RedisServer

    with RedisServer() as server:
        rl = SyncRateLimit.from_url(
            server.url, on_error="local", local_share=0.5, timeout=5.0, clock=clock
        )

        @rl.limit("user:6/h")
        def search(user: str) -> bool:
            return True

        assert search("ann")  # the store counts it
        server.stop()
        assert [search("ann") for _ in range(3)] == [True] * 3  # the direct path, then the loop's
        with pytest.raises(RateLimitExceeded) as raised:
            search("ann")
        assert raised.value.decision.degraded
        server.start()  # same port, empty
        clock.advance(PROBE_EVERY)
        for _ in range(100):  # each call a turn of the limiter's loop, where the probe runs
            decision = rl.limit("user:6/h", key=search_key(search), user="ann").decide()
            if not decision.degraded:
                break
        assert not decision.degraded
        assert decision.remaining == 5  # the restarted store counts from nothing
        rl.close()


def search_key(func: Any) -> str:
    """The key a decorated function's limit counts under."""
    return f"{func.__module__}.{func.__qualname__}"


@pytest.mark.parametrize("algorithm", ["sliding-log", "sliding-window", "fixed-window", "gcra"])
async def test_costs_count_against_the_share(algorithm: str, store: Flaky) -> None:
    rl = RateLimit(store, on_error="local", local_share=0.2, algorithm=algorithm)
    store.down = True
    small = compile_tree(to_tree("5/h"))  # 1 locally
    beyond = await rl.decide(small, "big", cost=rl.check(small, 3))  # more than the share
    assert not beyond.allowed
    assert beyond.degraded
    assert beyond.rule == Rule(5, 3_600_000)
    assert beyond.retry_after == 3600
    one = await rl.decide(small, "one", cost=rl.check(small, 1))
    assert one.allowed
    assert not await rl.settle(one, 1)  # recorded locally only: nothing to settle
    tokens = compile_tree(to_tree("apikey:1000 tokens/m"))  # 200 locally
    first = await rl.decide(tokens, "llm", ("a",), cost={"tokens": 150})
    second = await rl.decide(tokens, "llm", ("a",), cost={"tokens": 100})
    assert first.allowed
    assert not second.allowed
    await rl.aclose()
