"""Per-rule states on a Decision (what the HTTP RateLimit header and gateway statuses need):
each rule's remaining hits and how long they must last, from the counts the storage already
answered. Hand-worked cases per algorithm, and the sliding log against a plain referee.
(tests/test_differential.py checks that every engine gives the same states.)"""

from __future__ import annotations

import random

import pytest

from ratelimit import Decision, MemoryBackend, RateLimit, Rule, RuleState
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(30)


def limiter(algorithm: str = "sliding-log", start: float = 1_200.0) -> tuple[RateLimit, FakeClock]:
    """A memory limiter on a fake clock at ``start`` s (a multiple of a minute: 20 min), every
    decision from the storage (no denial cache)."""
    clock = FakeClock(start)
    rl = RateLimit(MemoryBackend(clock=clock), "states", algorithm=algorithm, denial_cache=0)
    return rl, clock


def state(rule: str, index: int, limited: bool, remaining: int, reset: float) -> RuleState:
    return RuleState(Rule.parse(rule), index, limited, remaining, reset)


async def test_sliding_log_reports_hits_left_until_the_oldest_leaves() -> None:
    rl, clock = limiter()
    limit = rl.limit("10/m", key="k")
    first = await limit.decide()
    assert first.states == (state("10/m", 0, False, 9, 60.0),)
    for _ in range(2):
        clock.advance(10)
        decision = await limit.decide()
    # hits at 0, 10 and 20 s: 7 left, and none comes back before the first leaves at 60 s
    assert decision.states == (state("10/m", 0, False, 7, 40.0),)


async def test_a_limited_rule_reports_nothing_left_until_it_admits_again() -> None:
    rl, clock = limiter()
    limit = rl.limit("3/m", key="k")
    for _ in range(3):
        await limit.decide()
        clock.advance(5)
    refused = await limit.decide()  # at 15 s; the first hit leaves at 60 s
    assert not refused.allowed
    assert refused.states == (state("3/m", 0, True, 0, 45.0),)
    assert refused.states[0].reset_after == refused.retry_after


async def test_fixed_window_reports_until_the_window_ends() -> None:
    rl, clock = limiter("fixed-window")
    limit = rl.limit("10/m", key="k")
    clock.advance(5)
    for _ in range(3):
        decision = await limit.decide()
    assert decision.states == (state("10/m", 0, False, 7, 55.0),)


async def test_sliding_window_reports_until_the_weighted_count_falls_by_one() -> None:
    rl, clock = limiter("sliding-window")
    limit = rl.limit("10/m", key="k")
    for _ in range(6):
        await limit.decide()  # 6 in the window before
    clock.advance(75)  # 15 s into the next window: 1 + 6 * 45/60 = 5.5 after this call
    decision = await limit.decide()
    assert decision.remaining == 4
    # 5 hits fit once the previous window weighs 4: at 20 s into the window, 5 s on
    assert decision.states == (state("10/m", 0, False, 4, 5.0),)
    clock.advance(5)
    later = await limit.peek()
    assert later.remaining == 4  # 1 + 6 * 40/60 = 5 counted; 5 - the peeked call = 4 left


async def test_a_sliding_window_may_report_longer_than_its_window() -> None:
    """docs/web.md: ``t`` is the seconds until more quota is available (draft -10), which a
    sliding-window counter may put past its window: it weighs the previous window in."""
    rl, clock = limiter("sliding-window")
    limit = rl.limit("60/m", key="k")
    first = await limit.decide()  # at the window's start: 59 left
    # the 60th fits once this hit weighs nothing: the window's end, then a whole window
    assert first.states == (state("60/m", 0, False, 59, 120.0),)
    clock.advance(119.9)
    assert (await limit.peek()).remaining == 58  # still 59 left (less the peeked call)
    clock.advance(0.1)
    assert (await limit.peek()).remaining == 59
    # an overdrawn window (a settle counted past the limit) refuses for longer than w too
    limit = rl.limit("60/m", key="overdrawn")
    decision = await limit.decide(cost=60)
    await rl.settle(decision, 90)
    clock.advance(1)
    refused = await limit.decide()
    assert not refused.allowed
    # 90 counted 1 s into the window: its end 59 s on, then 60 * (1 - 59/90) = 20.7 s more
    # until they weigh 59: 79.7 s, past the window
    assert 79 < refused.retry_after < 80


async def test_a_tree_reports_every_rule_that_applied_and_only_those() -> None:
    rl, clock = limiter()
    limit = rl.limit("user:2/m | ip:5/m | 100/h", key="k", user="alice", ip=None)
    await limit.decide()
    clock.advance(1)
    await limit.decide()
    clock.advance(1)
    refused = await limit.decide()
    assert not refused.allowed
    # ip's selector resolved to None: it never applied. A refused call counts nothing, so
    # 100/h still has 98 left; its oldest hit leaves an hour after it came.
    assert refused.states == (
        state("user:2/m", 0, True, 0, 58.0),
        state("100/h", 2, False, 98, 3598.0),
    )
    assert refused.retry_after == 58.0


async def test_peek_reports_as_if_the_call_were_counted_and_counts_nothing() -> None:
    rl, _ = limiter()
    limit = rl.limit("5/m", key="k")
    await limit.decide()
    peeked = await limit.peek()
    assert peeked.states == (state("5/m", 0, False, 3, 60.0),)
    assert (await limit.decide()).states == peeked.states


async def test_cost_is_taken_from_what_is_left() -> None:
    rl, _ = limiter()
    decision = await rl.limit("10/m", key="k", cost=4).decide()
    assert decision.states == (state("10/m", 0, False, 6, 60.0),)


async def test_no_rule_applied_no_states() -> None:
    rl, _ = limiter()
    decision = await rl.limit("user:1/s", key="k", user=None).decide()
    assert decision.allowed
    assert decision.states == ()


async def test_the_denial_cache_keeps_the_storages_states_with_shorter_times() -> None:
    clock = FakeClock(1_200.0)
    backend = MemoryBackend(clock=clock)
    rl = RateLimit(backend, "states")  # the denial cache: on by default, on the backend clock
    limit = rl.limit("user:1/m | 10/h", key="k", user="bob")
    await limit.decide()
    first = await limit.decide()  # refused by the storage, then remembered
    clock.advance(20)
    cached = await limit.decide()  # refused from the cache
    assert not cached.allowed
    assert cached.retry_after == pytest.approx(40.0)
    assert [s.remaining for s in cached.states] == [s.remaining for s in first.states]
    assert [s.reset_after for s in cached.states] == pytest.approx(
        [s.reset_after - 20 for s in first.states]
    )


async def test_states_are_left_out_of_equality_and_repr() -> None:
    rl, _ = limiter()
    decision = await rl.limit("1/m", key="k").decide()
    plain = Decision(True, 0.0, decision.rule, 0, "k")
    assert decision == plain
    assert plain.states == ()
    assert "states" not in repr(decision)


@pytest.mark.parametrize("seed", range(4))
async def test_sliding_log_states_agree_with_a_plain_referee(seed: int) -> None:
    """Every hit kept in a plain list: remaining = count - hits in the window after the call;
    reset = when the oldest of them leaves (the span when there are none)."""
    rng = random.Random(seed)
    rl, clock = limiter()
    text = "user:4/2s | 9/10s"
    rules = [Rule.parse(t) for t in ("user:4/2s", "9/10s")]
    hits: list[int] = []  # every admitted hit (same user throughout), in microseconds
    seen = set()
    for step in range(300):
        clock.advance(rng.choice([0.0, 0.05, 0.3, 0.9, 2.5]))
        cost = rng.choice([1, 1, 2])
        decision = await rl.limit(text, key="k", user="u", cost=cost).decide()
        now = round(clock() * 1_000_000)
        inside = [[t for t in hits if t > now - r.span_ms * 1000] for r in rules]
        if decision.allowed:
            hits.extend([now] * cost)
        for i, (rule, got) in enumerate(zip(rules, decision.states, strict=True)):
            limited = len(inside[i]) + cost > rule.count
            assert got.limited == limited, step
            seen.add((i, limited))
            if limited:
                continue
            after = inside[i] + ([now] * cost if decision.allowed else [])
            assert got.remaining == rule.count - len(after), step
            oldest = min(after, default=now)
            assert got.reset_after == (oldest + rule.span_ms * 1000 - now) / 1e6, step
    assert seen == {(0, False), (0, True), (1, False), (1, True)}  # the trace tried each


async def test_fractional_costs_whose_sum_rounds_short_of_a_whole_hit() -> None:
    """0.1 nine times and once more is 0.9999999999999999, not 1: the floor of what is left
    comes out one short, and that unit is already back (found by the differential test)."""
    rl, _ = limiter("sliding-window")
    limit = rl.limit("5/s", key="k", cost=0.1)
    for _ in range(10):
        decision = await limit.decide()
        assert decision.allowed
        (state,) = decision.states
        assert state.remaining == decision.remaining
        assert state.reset_after >= 0
