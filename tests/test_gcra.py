"""GCRA (``algorithm="gcra"``, issue 14): a reference written plainly in exact fractions, and
every engine (memory, the script, the command engine; fakeredis and a real Redis) agreeing
with it on the same traces, admissions, ``retry_after`` and ``remaining`` included."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratelimit import ConfigurationError, RateLimit, RedisScriptBackend, Rule
from ratelimit.algorithms import gcra_next, gcra_outcome
from ratelimit.backends.redis.keys import arrival_key
from ratelimit.core.plan import Identifier
from ratelimit.rules.tree import And, Node, Or, to_tree
from tests.conftest import FakeClock, seeds, selecting


class Reference:
    """GCRA as the textbook writes it, in exact fractions: per (identifier, rule) a
    theoretical arrival time; a rule admits a call of ``cost`` when
    ``max(tat, now) + cost * T - now <= burst * T`` (T = span / count). An admitted call
    pushes every rule's arrival time on, at most ``burst * T`` ahead of now."""

    def __init__(self) -> None:
        self.tats: dict[tuple[str, Rule], Fraction] = {}

    def limited(self, rule: Rule, value: str, cost: int, now: int) -> tuple[bool, Fraction, int]:
        """(limited, wait in us, hits left before the call)."""
        interval = Fraction(rule.span_ms * 1000, rule.count)
        tolerance = (rule.burst or rule.count) * interval
        start = max(self.tats.get((value, rule), Fraction(0)), Fraction(now))
        ahead = start + cost * interval - now
        left = math.floor((tolerance - (start - now)) / interval)
        return ahead > tolerance, ahead - tolerance, left

    def decide(
        self, tree: Node, values: dict[str, str], cost: int, now: int
    ) -> tuple[bool, float, int | None]:
        """(allowed, retry_after in seconds, remaining) of the whole tree."""
        limited, wait, left = self._node(tree, values, cost, now)
        if not limited:
            for rule in _rules(tree):
                key = (values.get(rule.selector or "", ""), rule)
                interval = Fraction(rule.span_ms * 1000, rule.count)
                start = max(self.tats.get(key, Fraction(0)), Fraction(now))
                cap = now + (rule.burst or rule.count) * interval
                self.tats[key] = min(start + cost * interval, cap)
            return True, 0.0, left - cost
        return False, math.ceil(wait) / 1_000_000, 0

    def _node(
        self, node: Node, values: dict[str, str], cost: int, now: int
    ) -> tuple[bool, Fraction, int]:
        if isinstance(node, Rule):
            return self.limited(node, values.get(node.selector or "", ""), cost, now)
        children = [self._node(child, values, cost, now) for child in node.children]
        refusing = [c for c in children if c[0]]
        if isinstance(node, Or) and refusing:
            return max(refusing, key=lambda c: c[1])
        if isinstance(node, And) and len(refusing) == len(children):
            return min(refusing, key=lambda c: c[1])
        admitting = [c for c in children if not c[0]]
        pick = min if isinstance(node, Or) else max
        return pick(admitting, key=lambda c: c[2])


def _rules(node: Node) -> list[Rule]:
    if isinstance(node, Rule):
        return [node]
    return [rule for child in node.children for rule in _rules(child)]


@pytest.mark.parametrize("seed", seeds(8, 3))
def test_the_arithmetic_agrees_with_the_reference_exactly(seed: int) -> None:
    rng = random.Random(seed)
    burst = rng.choice([None, 1, 2, 7, 30])
    count = rng.choice([1, 3, 5, 7, 10, 60, 997])
    rule = Rule(count, rng.choice([1000, 1500, 60_000]), None, burst)
    reference = Reference()
    now, tat = 1_700_000_000_000_000, (0, 0)  # today's microseconds: floats round to 1/4 us
    seen = set()
    for step in range(600):
        now += rng.choice([0, 0, 0, 0, 1, 17, 333, 1000, 50_000])
        cost = rng.choice([1, 1, 1, 2])
        if cost > (burst or rule.count):
            continue
        limited, wait, left = reference.limited(rule, "", cost, now)
        got_limited, retry_us, before, _ = gcra_outcome(rule, 0, cost, tat, now)
        assert got_limited == limited, step
        seen.add(limited)
        if limited:
            assert retry_us == math.ceil(wait), step
            continue
        assert before == left, step
        tat = gcra_next(rule, cost, tat, now)
        exact = reference.tats[("", rule)] = min(
            max(reference.tats.get(("", rule), Fraction(0)), Fraction(now))
            + cost * Fraction(rule.span_ms * 1000, rule.count),
            now + (burst or rule.count) * Fraction(rule.span_ms * 1000, rule.count),
        )
        assert Fraction(tat[0]) + Fraction(tat[1], rule.count) == exact, step
    assert seen == {True, False}  # the trace both admitted and refused


@pytest.mark.parametrize("count", [3, 7, 997])
@pytest.mark.parametrize("now", [10**12, 1_700_000_000_000_000, 1_732_300_000_000_001])
def test_a_whole_burst_at_one_instant_then_the_steady_rate(count: int, now: int) -> None:
    """Floats (one every 333333.33 us, at 1.7e15 us) refused inside the burst; exactly
    ``count`` pass at once, then one per interval, to the microsecond."""
    rule = Rule(count, 1000)
    tat = (0, 0)
    for _ in range(count):
        limited, _, _, _ = gcra_outcome(rule, 0, 1, tat, now)
        assert not limited
        tat = gcra_next(rule, 1, tat, now)
    limited, retry_us, _, _ = gcra_outcome(rule, 0, 1, tat, now)
    assert limited
    assert retry_us == math.ceil(Fraction(1_000_000, count))  # one interval, rounded up
    assert not gcra_outcome(rule, 0, 1, tat, now + retry_us)[0]
    assert gcra_outcome(rule, 0, 1, tat, now + retry_us - 1)[0]


TREES = [
    "3/s",
    "user:10/s burst 2 & 3/m",
    "user:5/s burst 1 | ip:2/300ms burst 4",
    "(user:4/s | 7/10s burst 9) & ip:3/s burst 1",
    "user:2/s burst 1 & user:2/s | ip:10/m",
]


@pytest.mark.parametrize("seed", seeds(4, 2))
async def test_every_engine_agrees_with_the_reference(
    make_backend: Callable[..., Any], namespace: str, seed: int
) -> None:
    clock = FakeClock()
    rl = RateLimit(make_backend(clock), namespace, algorithm="gcra", denial_cache=0)
    reference = Reference()
    rng = random.Random(seed)
    allowed = 0
    for step in range(300):
        clock.advance(rng.choice([0.0, 0.0, 0.0, 0.000_001, 0.013, 0.1, 0.3333, 1.0]))
        index = rng.randrange(len(TREES))
        tree = to_tree(TREES[index])
        values: dict[str, Any] = {"user": rng.choice(["a", "b"]), "ip": rng.choice(["1", "2"])}
        cost = rng.choice([1, 1, 1, 2]) if index in (0, 1) else 1
        given = selecting(tree, **values)
        decision = await rl.limit(tree, key=f"t{index}", cost=cost, **given).decide()
        now = round(clock() * 1_000_000)
        want = reference.decide(tree, {k: f"t{index}/{v}" for k, v in values.items()}, cost, now)
        got = (decision.allowed, decision.retry_after, decision.remaining)
        assert got == want, (step, TREES[index])
        allowed += decision.allowed
    assert 0 < allowed < 300


async def test_states_say_what_each_rule_has_left_and_when_one_more_comes(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    clock = FakeClock()
    rl = RateLimit(make_backend(clock), namespace, algorithm="gcra", denial_cache=0)
    limit = rl.limit("user:10/s burst 3 & 5/m", user="u")
    decision = await limit.decide()
    fast, slow = decision.states
    assert fast.remaining == 2
    assert fast.reset_after == pytest.approx(0.1)
    assert slow.remaining == 4
    assert slow.reset_after == pytest.approx(12.0)
    for _ in range(2):
        await limit.decide()
    decision = await limit.decide()  # the fast rule's burst is spent; the slow one admits
    assert decision.allowed
    fast, slow = decision.states
    assert fast.limited
    assert fast.reset_after == pytest.approx(0.1, abs=1e-6)
    assert (slow.remaining, slow.limited) == (1, False)


async def test_a_clock_stepping_back_never_admits_more(
    make_backend: Callable[..., Any], namespace: str
) -> None:
    clock = FakeClock()
    rl = RateLimit(make_backend(clock), namespace, algorithm="gcra", denial_cache=0)
    limit = rl.limit("5/h", key="back")
    assert [(await limit.decide()).allowed for _ in range(6)] == [True] * 5 + [False]
    clock.advance(-3600)
    assert not (await limit.decide()).allowed
    clock.advance(3600 + 720)  # one interval on from the burst: one more
    assert [(await limit.decide()).allowed for _ in range(2)] == [True, False]


async def test_peek_and_reset(make_backend: Callable[..., Any], namespace: str) -> None:
    clock = FakeClock()
    rl = RateLimit(make_backend(clock), namespace, algorithm="gcra", denial_cache=0)
    limit = rl.limit("user:2/m", user="u")
    assert (await limit.peek()).remaining == 1
    await limit.decide()
    assert (await limit.peek()).remaining == 0
    await limit.decide()
    assert not (await limit.peek()).allowed
    await limit.reset()
    assert (await limit.decide()).allowed


@pytest.mark.redis
async def test_on_redis_time_a_key_lives_until_its_arrival_time(
    redis_client: aioredis.Redis, namespace: str
) -> None:
    rl = RateLimit(RedisScriptBackend(redis_client), namespace, algorithm="gcra")
    limit = rl.limit("user:100/h", user="u", key="ttl")
    await limit.decide()
    await limit.decide()
    key = arrival_key(Identifier(namespace, "ttl", "user", "u"), Rule(100, 3_600_000, "user"))
    assert key.endswith(":user=u:g:3600000")  # per span: an override's rate carries it on
    ttl = await redis_client.pttl(key)
    assert 0 < ttl <= 72_001  # two calls of one every 36 s: 72 s, not the hour
    decision = await limit.decide()
    assert decision.remaining == 97


async def test_bursts_read_and_print_back() -> None:
    rule = Rule.parse("user:10/s burst 20")
    assert rule == Rule(10, 1000, "user", 20)
    assert str(rule) == "user:10/s burst 20"
    tree = to_tree("apikey:100/h & (10/s BURST 15 | 15/m)")
    assert to_tree(str(tree)) == tree
    assert str(tree) == "apikey:100/h & (10/s burst 15 | 15/m)"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda rl: rl.limit("10/s burst 0"), "burst must be an integer from 1"),
        (lambda rl: rl.limit("10/s burst"), "expected burst"),
        (lambda rl: rl.limit("10/s burst 2", cost=3), "above the burst of rule '10/s burst 2'"),
        (lambda rl: rl.limit("10/s", cost=1.5), "whole number of hits"),
        (lambda rl: rl.limit("1/d burst 1000000"), "longer than 3650 days"),
        (lambda rl: rl.limit("1000000000/s burst 1000000000"), "under 2\\*\\*53"),
    ],
)
def test_bad_gcra_limits_fail_when_made(make: Callable[[RateLimit], Any], message: str) -> None:
    rl = RateLimit.from_url("memory://", algorithm="gcra")
    with pytest.raises((ConfigurationError, ValueError), match=message):
        make(rl)


def test_a_burst_needs_gcra_and_gcra_cannot_sync_from_diffs() -> None:
    rl = RateLimit.from_url("memory://", algorithm="sliding-window")
    with pytest.raises(ConfigurationError, match="only algorithm='gcra' has"):
        rl.limit("10/s burst 20")
    with pytest.raises(ConfigurationError, match="GCRA arrival time cannot be merged"):
        RateLimit.from_url("memory://", algorithm="gcra", sync_rate=1.0)
    with pytest.raises(ConfigurationError, match="only algorithm='gcra' has"):
        RateLimit.from_url("memory://").limit(dataclasses.replace(Rule(1, 1000), burst=3))
