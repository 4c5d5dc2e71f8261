"""The semantics every backend must give (DESIGN §3), run over memory, fakeredis and Redis.

Time is a fake clock handed to the backend; no test sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from ratelimit import And, Or, RateLimit, RateLimitExceeded, Rule
from ratelimit.core.decision import Decision
from tests.conftest import BackendFactory, FakeClock, supporting


@pytest.fixture(params=[0, 0.05], ids=["per-call", "leased"])
def rl(
    request: pytest.FixtureRequest, make_backend: BackendFactory, namespace: str, clock: FakeClock
) -> RateLimit:
    """A RateLimit on the parametrized backend driven by the fake clock: deciding every
    call at the store, and with ``lease=0.05`` (leases: the same answers)."""
    return RateLimit(make_backend(clock), namespace, lease=request.param)


async def decide(
    rl: RateLimit, rules: str | And | Or, key: str = "k", **selectors: Any
) -> Decision:
    decision: Decision = await rl.limit(rules, key=key, **selectors).decide()
    return decision


async def admitted(
    rl: RateLimit, rules: str | And | Or, n: int, key: str = "k", **selectors: object
) -> int:
    return sum([(await decide(rl, rules, key, **selectors)).allowed for _ in range(n)])


async def test_n_per_span_then_denied_then_free_again(rl: RateLimit, clock: FakeClock) -> None:
    assert await admitted(rl, "3/s", 5) == 3
    clock.advance(0.999)
    assert not (await decide(rl, "3/s")).allowed
    clock.advance(0.001)
    assert await admitted(rl, "3/s", 5) == 3


async def test_the_window_slides(rl: RateLimit, clock: FakeClock) -> None:
    # hits at t=0, 0.4, 0.8 fill 3/s; the first frees at t=1.0, the second at t=1.4
    for step in (0.0, 0.4, 0.4):
        clock.advance(step)
        assert (await decide(rl, "3/s")).allowed
    clock.advance(0.199)  # t = 0.999
    assert not (await decide(rl, "3/s")).allowed
    clock.advance(0.001)  # t = 1.0: the hit of t=0 is a full second old
    assert (await decide(rl, "3/s")).allowed
    assert not (await decide(rl, "3/s")).allowed
    clock.advance(0.4)  # t = 1.4: the hit of t=0.4 has left
    assert (await decide(rl, "3/s")).allowed


async def test_retry_after_is_exact_and_decreases(rl: RateLimit, clock: FakeClock) -> None:
    assert (await decide(rl, "2/10s")).allowed
    clock.advance(3)
    assert (await decide(rl, "2/10s")).allowed
    clock.advance(1)
    denied = await decide(rl, "2/10s")
    assert not denied.allowed
    assert denied.retry_after == pytest.approx(6.0, abs=1e-6)  # oldest at t=0 frees at t=10
    assert denied.rule == Rule(2, 10_000)
    assert denied.remaining == 0
    clock.advance(denied.retry_after)
    assert (await decide(rl, "2/10s")).allowed


async def test_millisecond_resolution(rl: RateLimit, clock: FakeClock) -> None:
    # Seed 002 stored whole seconds, so a window could free up to 1 s early.
    assert await admitted(rl, "2/100ms", 3) == 2
    clock.advance(0.099)
    assert not (await decide(rl, "2/100ms")).allowed
    clock.advance(0.001)
    assert (await decide(rl, "2/100ms")).allowed


async def test_remaining_counts_down(rl: RateLimit) -> None:
    remaining = [(await decide(rl, "3/m")).remaining for _ in range(4)]
    assert remaining == [2, 1, 0, 0]


async def test_or_is_limited_when_any_child_is(rl: RateLimit, clock: FakeClock) -> None:
    tree = Or("2/s", "3/m")
    assert await admitted(rl, tree, 5) == 2
    clock.advance(1)
    assert await admitted(rl, tree, 5) == 1  # 3/m now binds
    denied = await decide(rl, tree)
    assert denied.rule == Rule(3, 60_000)
    # retry_after of Or: the largest over its limited children
    assert denied.retry_after == pytest.approx(59.0, abs=1e-6)


async def test_and_is_limited_only_when_every_child_is(rl: RateLimit, clock: FakeClock) -> None:
    tree = And("1/s", "3/m")
    assert [(await decide(rl, tree)).allowed for _ in range(4)] == [True, True, True, False]
    denied = await decide(rl, tree)
    # retry_after of And: the smallest over its children (1/s frees first)
    assert denied.retry_after == pytest.approx(1.0, abs=1e-6)
    assert denied.rule == Rule(1, 1000)
    clock.advance(1)
    assert (await decide(rl, tree)).allowed  # 1/s is free, so And is not limited


async def test_a_denied_call_records_nothing(rl: RateLimit, clock: FakeClock) -> None:
    tree = Or("2/s", "user:5/m")
    assert await admitted(rl, tree, 2, user="u") == 2
    for _ in range(10):  # all denied by 2/s; none may count against user:5/m
        assert not (await decide(rl, tree, user="u")).allowed
    clock.advance(1)
    assert await admitted(rl, tree, 2, user="u") == 2
    clock.advance(1)
    assert await admitted(rl, tree, 2, user="u") == 1  # user:5/m has 4 + this one


async def test_allowed_call_records_on_every_resolved_identifier(
    rl: RateLimit, clock: FakeClock
) -> None:
    # Through key "a" the hits count on (k, user=u) and (k) for the same key only.
    tree = And("user:2/m", "ip:2/m")
    assert await admitted(rl, tree, 3, user="u", ip="1.2.3.4") == 2
    # user u is limited; ip 5.6.7.8 is new, so And admits and logs u again (as seed 002)
    assert (await decide(rl, tree, user="u", ip="5.6.7.8")).allowed
    assert (await decide(rl, tree, user="u", ip="5.6.7.8")).allowed
    assert not (await decide(rl, tree, user="u", ip="5.6.7.8")).allowed
    assert (await decide(rl, tree, user="w", ip="1.2.3.4")).allowed


@pytest.mark.parametrize("empty", [None, ""])
async def test_a_selector_without_value_is_not_limited_and_records_nothing(
    rl: RateLimit, empty: str | None
) -> None:
    assert await admitted(rl, "user:1/m", 5, user=empty) == 5
    decision = await decide(rl, "user:1/m", user=empty)
    assert decision.rule is None
    assert decision.remaining is None
    assert await admitted(rl, "user:1/m", 2, user="then-a-value") == 1
    # in an Or, the other rule still limits; in an And, the rule never limits
    assert await admitted(rl, Or("user:1/m", "2/m"), 5, "or", user=empty) == 2
    assert await admitted(rl, And("user:1/m", "1/m"), 4, "and", user=empty) == 4


async def test_selector_values_are_separate_counters(rl: RateLimit) -> None:
    assert await admitted(rl, "user:2/m", 3, user="alice") == 2
    assert await admitted(rl, "user:2/m", 3, user="bob") == 2
    assert await admitted(rl, "user:2/m", 3, user=42) == 2
    assert await admitted(rl, "user:2/m", 1, user="42") == 0  # 42 and "42" are one value


async def test_keys_and_namespaces_keep_counters_apart(
    make_rl: Callable[..., RateLimit], clock: FakeClock, namespace: str
) -> None:
    one = make_rl(clock)
    other_namespace = RateLimit(one.storage, namespace + "-other")
    assert await admitted(one, "1/m", 2) == 1
    assert (await one.limit("1/m", key="other").decide()).allowed
    assert (await other_namespace.limit("1/m", key="k").decide()).allowed


async def test_rules_sharing_an_identifier_share_one_log(rl: RateLimit, clock: FakeClock) -> None:
    # 10/s and 15/m count on the same identifier; the log keeps the largest count.
    tree = Or("10/s", "15/m")
    assert await admitted(rl, tree, 12) == 10
    clock.advance(1)
    assert await admitted(rl, tree, 12) == 5
    denied = await decide(rl, tree)
    assert denied.rule == Rule(15, 60_000)
    assert denied.retry_after == pytest.approx(59.0, abs=1e-6)


async def test_decorator_and_context_manager_raise_with_data(rl: RateLimit) -> None:
    ran = 0

    @rl.limit("2/m", key="shared")
    async def work() -> int:
        nonlocal ran
        ran += 1
        return ran

    assert await work() == 1
    async with rl.limit("2/m", key="shared") as decision:
        assert decision.allowed
        assert decision.remaining == 0
    with pytest.raises(RateLimitExceeded) as caught:
        await work()
    assert ran == 1
    assert caught.value.key == "shared"
    assert caught.value.rule == Rule(2, 60_000)
    assert 0 < caught.value.retry_after <= 60
    with pytest.raises(RateLimitExceeded):
        async with rl.limit("2/m", key="shared"):
            pytest.fail("the body of a limited block must not run")


async def test_clock_going_backwards_does_not_admit_extra(rl: RateLimit, clock: FakeClock) -> None:
    assert await admitted(rl, "2/s", 2) == 2
    clock.advance(-5)
    assert not (await decide(rl, "2/s")).allowed
    clock.advance(5.999)
    assert not (await decide(rl, "2/s")).allowed


async def test_long_logs_count_exactly(rl: RateLimit, clock: FakeClock) -> None:
    # More hits than the command engine reads in its first round trip (64).
    limit = rl.limit("user:100/m", key="long", user="u")
    for n in range(90):  # at t = 0, 0.5, ..., 44.5
        decision = await limit.decide()
        assert decision.remaining == 99 - n
        clock.advance(0.5)
    clock.advance(60.2 - 45)  # t = 60.2: the hit of t = 0 has left, 89 remain
    assert (await limit.decide()).remaining == 100 - 89 - 1
    for _ in range(10):
        assert (await limit.decide()).allowed
    denied = await limit.decide()
    assert not denied.allowed
    # 11 hits at t = 60.2 and 89 from t = 44.5 down to 0.5: the 100th newest is t = 0.5
    assert denied.retry_after == pytest.approx(0.5 + 60 - 60.2, abs=1e-6)


async def test_a_cost_records_that_many_hits(rl: RateLimit, clock: FakeClock) -> None:
    heavy = rl.limit("10/s", key="cost", cost=3)
    light = rl.limit("10/s", key="cost")
    assert [(await heavy.decide()).remaining for _ in range(3)] == [7, 4, 1]
    clock.advance(0.5)
    denied = await heavy.decide()  # 9 + 3 > 10
    assert not denied.allowed
    # 8 of the 9 hits must leave before 3 more fit: the 8th newest is one of t = 0
    assert denied.retry_after == pytest.approx(0.5, abs=1e-6)
    assert (await light.decide()).remaining == 0  # 9 + 1 fits exactly
    assert not (await light.decide()).allowed


async def test_costs_in_trees(rl: RateLimit, clock: FakeClock) -> None:
    tree = Or("user:6/m", "4/s")
    assert (await rl.limit(tree, key="t", user="u", cost=2).decide()).remaining == 2
    assert (await rl.limit(tree, key="t", user="u", cost=2).decide()).remaining == 0
    assert not (await rl.limit(tree, key="t", user="u", cost=2).decide()).allowed  # 4/s full
    clock.advance(1)
    assert (await rl.limit(tree, key="t", user="u", cost=2).decide()).allowed  # user: 6 of 6
    assert not (await rl.limit(tree, key="t", user="u").decide()).allowed


async def test_the_largest_cost_the_log_takes(rl: RateLimit) -> None:
    limit = rl.limit("2000/s", key="big", cost=1000)
    assert [(await limit.decide()).allowed for _ in range(3)] == [True, True, False]
    assert (await rl.limit("2000/s", key="big").decide()).allowed is False


async def test_two_limits_on_one_log_keep_each_others_history(
    rl: RateLimit, clock: FakeClock
) -> None:
    """``100/h`` and ``5/s`` on one identifier (made at one place without ``key=``: one
    key, whatever the rules): each admitted call of the short limit must not cut the history
    the long one reads."""
    hourly, burst = [rl.limit(rules) for rules in ("100/h", "5/s")]
    admitted_hourly = 0
    for _ in range(300):  # a call of each per second for 300 s
        admitted_hourly += (await hourly.decide()).allowed
        assert (await burst.decide()).allowed
        clock.advance(1)
    assert admitted_hourly == 50  # 2 hits a second reach 100 in 50 s (was 300 of 100)


async def test_a_rolling_deploy_does_not_cut_the_old_rules_history(
    make_rl: Callable[..., RateLimit], clock: FakeClock
) -> None:
    old = make_rl(clock)
    new = RateLimit(old.storage, old.namespace)  # two deployments on one store and key
    assert await admitted(old, "user:100/h", 100, user="u") == 100
    clock.advance(1)
    assert await admitted(new, "user:5/s", 5, user="u") == 5
    assert await admitted(old, "user:100/h", 10, user="u") == 0


@pytest.mark.parametrize("algorithm", ["sliding-window", "fixed-window"])
async def test_a_clock_stepping_back_never_admits_more_on_window_counters(
    make_backend: Callable[..., Any], namespace: str, clock: FakeClock, algorithm: str
) -> None:
    rl = RateLimit(
        supporting(make_backend(clock), algorithm), namespace, algorithm=algorithm, denial_cache=0
    )
    limit = rl.limit("5/h", key="back")
    assert [(await limit.decide()).allowed for _ in range(6)] == [True] * 5 + [False]
    clock.advance(-3600)  # an hour back: the window of an hour ago looks empty
    assert [(await limit.decide()).allowed for _ in range(3)] == [False] * 3
    clock.advance(-60)
    assert not (await limit.decide()).allowed
    clock.advance(3660 + 7200)  # two hours on from the first calls: free again
    assert (await limit.decide()).allowed


async def test_a_clock_stepping_back_never_admits_more_through_the_counter_api(
    make_backend: Callable[..., Any], namespace: str, clock: FakeClock
) -> None:
    rl = RateLimit(make_backend(clock), namespace, algorithm="sliding-window")
    for _ in range(5):
        await rl.increment("api", 3600)
    clock.advance(-3600)
    assert await rl.sliding_window("api", 3600) >= 5
    assert await rl.increment("api", 3600) >= 6


async def test_a_hot_limit_admits_exactly_its_count(rl: RateLimit, clock: FakeClock) -> None:
    """Sixteen callers hammering one limit big enough for leases: exactly its count, and
    the store counts exactly that once the leases are given back."""
    limit = rl.limit("user:300/m", key="hot", user="u")

    async def caller() -> int:
        return sum([(await limit.decide()).allowed for _ in range(30)])

    assert sum(await asyncio.gather(*(caller() for _ in range(16)))) == 300
    give_back = getattr(rl.storage, "give_back", None)
    if give_back is not None:
        await give_back()
    assert (await limit.peek()).remaining == 0
    clock.advance(60)
    assert (await limit.peek()).remaining == 299
