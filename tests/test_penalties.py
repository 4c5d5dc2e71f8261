"""Penalties (``limit(..., penalty=...)``): the text and its checks, and what a hold does,
on every store that keeps them, driven by a fake clock."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import fakeredis
import pytest

from ratelimit import ConfigurationError, MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.backends.penalty_store import holds_penalties
from ratelimit.core.decision import Decision
from ratelimit.errors import RuleSyntaxError
from ratelimit.penalties.spec import parse_penalty
from tests.conftest import STORES, FailingBackend, FakeClock, store_backend

Make = Callable[[], RateLimit]


# --- the text ---


def test_parse() -> None:
    penalty = parse_penalty("ip: 5 refusals/10m for 1h")
    assert (penalty.count, penalty.span_ms, penalty.hold_ms, penalty.selector) == (
        5,
        600_000,
        3_600_000,
        "ip",
    )
    assert parse_penalty("3 refusal / 2 minutes FOR 30s").hold == 30.0
    assert parse_penalty("1 refusals/s for 1d").selector is None


@pytest.mark.parametrize(
    ("text", "column", "says"),
    [
        ("ip: 5 refusals/10m", 19, "'for'"),
        ("ip: 0 refusals/10m for 1h", 5, "count must be"),
        ("5 hits/10m for 1h", 1, "counts refusals"),
        ("5 refusals/10x for 1h", 14, "expected unit"),
        ("5 refusals/10m for 0s", 20, "duration must"),
        ("5 refusals/10m for 1 fortnight", 22, "expected unit"),
        ("", 1, "a penalty is"),
        ("user: for 1h", 7, "expected count"),
    ],
)
def test_bad_text_names_the_column(text: str, column: int, says: str) -> None:
    with pytest.raises(RuleSyntaxError) as caught:
        parse_penalty(text)
    assert caught.value.column == column
    assert says in str(caught.value)


def test_not_text() -> None:
    with pytest.raises(TypeError, match="a penalty is text"):
        parse_penalty(5)


# --- checked when the limit is made ---


def test_selector_checked_when_made() -> None:
    rl = RateLimit(MemoryBackend())
    with pytest.raises(ConfigurationError, match="say which one"):
        rl.limit("ip:5/s | user:3/s", key="a", penalty="5 refusals/m for 1h")
    with pytest.raises(ConfigurationError, match="do not name"):
        rl.limit("ip:5/s", key="b", penalty="user: 5 refusals/m for 1h")
    with pytest.raises(RuleSyntaxError, match="column"):
        rl.limit("ip:5/s", key="c", penalty="ip: 5 refusals/m")
    with pytest.raises(ConfigurationError, match="own rules"):
        rl.limit(key="c", penalty="5 refusals/m for 1h")
    rl.limit("ip:5/s | ip:50/m", key="d", penalty="5 refusals/m for 1h")  # one selector
    rl.limit("5/s", key="e", penalty="5 refusals/m for 1h")  # the whole key


async def test_stores_without_penalties_refuse_when_made() -> None:
    rl = RateLimit(FailingBackend())  # a backend object of one's own, without penalties
    with pytest.raises(ConfigurationError, match="keeps no penalties"):
        rl.limit("ip:5/s", key="a", penalty="5 refusals/m for 1h")
    synced = RateLimit(fakeredis.FakeAsyncRedis(), algorithm="sliding-window", sync_rate=1.0)
    assert not holds_penalties(synced._decider.backend)
    with pytest.raises(ConfigurationError, match="keeps no penalties"):
        synced.limit("ip:5/s", key="a", penalty="5 refusals/m for 1h")
    await synced.aclose()


async def test_unused_penalty_keeps_the_direct_path() -> None:
    rl = RateLimit(MemoryBackend())
    plain = rl.limit("ip:5/s", key="plain")
    held = rl.limit("ip:5/s", key="held", penalty="5 refusals/m for 1h")

    async def f(ip: str) -> None: ...

    assert plain._direct("plain", plain._bind(f)[1])[0] is not None
    # memory:// tells a hold without a coroutine: a penalized limit's calls go direct too,
    # and fused (its holds read first; a refusal goes on to the direct path, which notes it)
    direct, _, fused = held._direct("held", held._bind(f)[1])
    assert direct is not None
    assert fused is not None
    waiting = rl.limit("ip:5/s", key="waiting", penalty="5 refusals/m for 1h", wait=1)
    assert waiting._direct("waiting", waiting._bind(f)[1]) == (None, None, None)
    assert plain._decide == rl._decider.decide


async def test_a_fused_penalized_limit_holds_a_value_past_its_rules(clock: FakeClock) -> None:
    """On the fused path (memory://), a value's refusals start its hold, which refuses it
    while the rule would admit it again, and only it; the hold ends in its time."""
    rl = RateLimit(MemoryBackend(clock=clock))
    limit = rl.limit("ip:2/s", penalty="3 refusals/m for 1h")

    async def f(ip: str) -> str:
        return ip

    assert limit._direct("f", limit._bind(f)[1])[2] is not None  # fused
    checked = limit(f)
    for _ in range(2):
        assert await checked("a") == "a"
    for n in range(3):
        with pytest.raises(RateLimitExceeded) as refused:
            await checked("a")
        assert (refused.value.decision.penalty is None) == (n < 2)  # the third starts it
    clock.advance(5)  # the rule admits "a" again: the hold does not
    with pytest.raises(RateLimitExceeded) as held:
        await checked("a")
    assert held.value.decision.penalty == pytest.approx(3595, abs=1.01)
    assert await checked("b") == "b"
    clock.advance(3600)
    assert await checked("a") == "a"
    await rl.aclose()


# --- what a hold does, on every store ---


@pytest.fixture(params=STORES)
async def make(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Make]:
    """``make()``: another limiter of one namespace on one backend of the store."""
    clock.now = 1_000_800.0  # a whole number of hours: fixed windows start here
    backend = store_backend(request, request.param, clock)
    namespace = f"penalty-{uuid.uuid4().hex[:8]}"
    made: list[RateLimit] = []
    # Postgres decides the window counters: fixed windows, aligned with the clock, give
    # these tests the sliding log's answers
    algorithm = "fixed-window" if request.param == "postgres" else "sliding-log"

    def factory() -> RateLimit:
        limiter = RateLimit(backend, namespace, algorithm=algorithm)
        made.append(limiter)
        return limiter

    yield factory
    await made[0].aclose()


async def refuse(limit: Any, times: int) -> list[Decision]:
    return [await limit.decide() for _ in range(times)]


async def test_refusals_within_the_span_start_a_hold(make: Make, clock: FakeClock) -> None:
    rl = make()
    limit = rl.limit("ip:2/m", key="login", ip="1.2.3.4", penalty="3 refusals/10m for 1h")
    decisions = await refuse(limit, 4)
    assert [d.allowed for d in decisions] == [True, True, False, False]
    assert [d.penalty for d in decisions[2:]] == [None, None]
    clock.advance(61)  # the rules admit again; two refusals so far
    assert (await limit.decide()).allowed
    assert (await limit.decide()).allowed
    third = await limit.decide()  # the third refusal within 10m starts the hold
    assert not third.allowed
    assert third.penalty == pytest.approx(3600)
    clock.advance(120)  # the rules would admit; the hold refuses, counting nothing
    held = await limit.decide()
    assert not held.allowed
    assert held.rule is None
    assert held.retry_after == held.penalty == pytest.approx(3600 - 120, abs=1.01)
    clock.advance(3600 - 120 + 2)  # the hold ends on time, and was not extended
    assert (await limit.decide()).allowed


async def test_refusals_spread_beyond_the_span_start_none(make: Make, clock: FakeClock) -> None:
    rl = make()
    limit = rl.limit("ip:1/m", key="login", ip="5.6.7.8", penalty="3 refusals/2m for 1h")
    for _ in range(5):
        assert [d.allowed for d in await refuse(limit, 2)] == [True, False]
        clock.advance(61)  # one refusal a minute: at most two within any 2 minutes
    assert (await limit.decide()).allowed


async def test_held_values_only(make: Make, clock: FakeClock) -> None:
    rl = make()
    bad = rl.limit("ip:1/h", key="api", ip="bad", penalty="2 refusals/m for 10m")
    good = rl.limit("ip:1/h", key="api", ip="good", penalty="2 refusals/m for 10m")
    await refuse(bad, 3)
    assert (await bad.decide()).penalty is not None
    assert (await good.decide()).allowed


async def test_another_limiter_sees_the_hold(make: Make, clock: FakeClock) -> None:
    first, second = make(), make()
    rules, penalty = "ip:1/h", "2 refusals/m for 10m"
    await refuse(first.limit(rules, key="api", ip="x", penalty=penalty), 3)
    seen = await second.limit(rules, key="api", ip="x", penalty=penalty).peek()
    assert seen.penalty == pytest.approx(600)


async def test_peek_shows_a_hold_and_notes_nothing(make: Make, clock: FakeClock) -> None:
    rl = make()
    limit = rl.limit("1/h", key="k", penalty="2 refusals/m for 10m")
    await refuse(limit, 2)
    for _ in range(5):
        assert (await limit.peek()).penalty is None  # peeks are not refusals
    assert (await limit.decide()).penalty == pytest.approx(600)
    assert (await limit.peek()).penalty == pytest.approx(600)


async def test_list_and_lift(make: Make, clock: FakeClock) -> None:
    rl, other = make(), make()
    penalty = "2 refusals/m for 10m"
    for ip in ("a", "b"):
        await refuse(rl.limit("ip:1/h", key="api", ip=ip, penalty=penalty), 3)
    await refuse(rl.limit("1/h", key="whole", penalty=penalty), 3)
    holds = sorted(await other.penalties.list())
    assert [(h.key, h.selector, h.value) for h in holds] == [
        ("api", "ip", "a"),
        ("api", "ip", "b"),
        ("whole", None, None),
    ]
    assert all(h.left == pytest.approx(600) for h in holds)
    assert [h.value for h in await other.penalties.list(key="api")] == ["a", "b"] or sorted(
        h.value or "" for h in await other.penalties.list(key="api")
    ) == ["a", "b"]
    assert await rl.penalties.lift("api", ip="a") == 1
    assert sorted(h.value or "" for h in await rl.penalties.list()) == ["", "b"]
    assert (await rl.limit("ip:1/h", key="api", ip="a", penalty=penalty).peek()).penalty is None
    assert await rl.penalties.lift("whole") == 1
    assert [h.value for h in await rl.penalties.list()] == ["b"]
    clock.advance(601)
    assert await rl.penalties.list() == []


async def test_shadow_counts_and_lets_through(make: Make, clock: FakeClock) -> None:
    rl = make()
    limit = rl.limit("1/h", key="k", shadow=True, penalty="2 refusals/m for 10m")
    decisions = await refuse(limit, 4)
    assert [d.shadow for d in decisions] == [False, True, True, True]
    assert decisions[2].penalty == pytest.approx(600)
    assert decisions[3].penalty is not None


async def test_decorator_raises_with_the_hold(make: Make, clock: FakeClock) -> None:
    rl = make()

    @rl.limit("user:1/h", penalty="2 refusals/m for 10m")
    async def login(user: str) -> str:
        return user

    assert await login("eve") == "eve"
    for _ in range(2):
        with pytest.raises(RateLimitExceeded):
            await login("eve")
    clock.advance(30)
    with pytest.raises(RateLimitExceeded) as caught:
        await login("eve")
    assert caught.value.retry_after == pytest.approx(570, abs=1.01)
    assert "held back for 570 s after 2 refusals within 1m (penalty '2 refusals/m for 10m')" in (
        str(caught.value)
    )
    assert await login("bob") == "bob"


async def test_rate_limit_decide_takes_a_penalty(make: Make, clock: FakeClock) -> None:
    from ratelimit.core.plan import compile_tree
    from ratelimit.rules.tree import to_tree

    rl = make()
    tree = compile_tree(to_tree("ip:1/h"))
    decisions = [
        await rl.decide(tree, "edge", ("9.9.9.9",), penalty="ip: 2 refusals/m for 10m")
        for _ in range(4)
    ]
    assert [d.penalty is not None for d in decisions] == [False, False, True, True]


def test_sync_api(clock: FakeClock) -> None:
    from ratelimit.sync import RateLimit as SyncRateLimit

    rl = SyncRateLimit(MemoryBackend(clock=clock))
    try:

        @rl.limit("user:1/h", penalty="2 refusals/m for 10m")
        def login(user: str) -> str:
            return user

        assert login("eve") == "eve"
        for _ in range(2):
            with pytest.raises(RateLimitExceeded):
                login("eve")
        clock.advance(60)
        with pytest.raises(RateLimitExceeded, match="held back"):
            login("eve")
        limit = rl.limit("user:1/h", key="k", user="bob", penalty="2 refusals/m for 10m")
        assert [limit.decide().penalty for _ in range(4)][2:] == [600.0, 600.0]
        assert [h.value for h in rl.run(lambda limiter: limiter.penalties.list())] == [
            "eve",
            "bob",
        ]
    finally:
        rl.close()
