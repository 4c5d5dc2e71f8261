"""GCRA's arithmetic (issue 14, first step) against a reference written plainly in exact
fractions: on random traces, every admission, refusal, retry_after and remaining agrees."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from ratelimit.algorithms import gcra_next, gcra_outcome
from ratelimit.rules import Rule


def reference(
    rule: Rule, burst: int, cost: int, tat: Fraction, now: int
) -> tuple[bool, Fraction, Fraction, Fraction]:
    """(admitted, new arrival time, wait in us, hits left after): a token bucket of
    ``burst`` tokens refilled one every span/count, as the textbook writes GCRA."""
    interval = Fraction(rule.span_ms * 1000, rule.count)
    tolerance = burst * interval
    start = max(tat, Fraction(now))
    new_tat = start + cost * interval
    if new_tat - now > tolerance:
        return False, tat, new_tat - tolerance - now, Fraction(0)
    return True, new_tat, Fraction(0), (tolerance - (new_tat - now)) / interval


@pytest.mark.parametrize("seed", range(8))
def test_gcra_agrees_with_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    rule = Rule(rng.choice([1, 3, 5, 7, 10, 60]), rng.choice([1000, 1500, 60_000]))
    burst = rule.count
    now, tat, exact = 10**12, 0.0, Fraction(0)
    seen = set()
    for step in range(400):
        now += rng.choice([0, 0, 0, 0, 1, 17, 333, 1000, 50_000])
        cost = rng.choice([1, 1, 1, 2])
        if cost > burst:
            continue
        admitted, new_exact, wait, left = reference(rule, burst, cost, exact, now)
        limited, retry_us, before, _ = gcra_outcome(rule, 0, cost, tat, now)
        interval = Fraction(rule.span_ms * 1000, rule.count)
        start: Fraction = max(exact, Fraction(now))
        margin = start + cost * interval - now - burst * interval  # > 0: refused
        if limited != (not admitted) and abs(margin) < Fraction(1, 1000):
            continue  # within a nanosecond of the boundary: floats may round either way
        assert limited == (not admitted), step
        seen.add(admitted)
        if admitted:
            assert before is not None
            assert math.floor(before - cost + 1e-9) == math.floor(left), step
            tat, exact = gcra_next(rule, cost, tat, now), new_exact
            assert abs(tat - float(exact)) < 1  # microseconds
        else:
            assert retry_us == math.ceil(wait), step
    assert seen == {True, False}  # the trace both admitted and refused


def test_a_burst_then_the_steady_rate() -> None:
    rule = Rule(10, 1000)  # 10/s: a burst of 10, then one every 100 ms
    now, tat = 10**12, 0.0
    for _ in range(10):
        limited, _, _, _ = gcra_outcome(rule, 0, 1, tat, now)
        assert not limited
        tat = gcra_next(rule, 1, tat, now)
    limited, retry_us, _, _ = gcra_outcome(rule, 0, 1, tat, now)
    assert limited
    assert retry_us == 100_000
    limited, _, left, _ = gcra_outcome(rule, 0, 1, tat, now + 100_000)
    assert not limited
    assert left == 1
