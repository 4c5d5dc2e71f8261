"""Reset marks (issue 35, findings E and F): a refund of a call reserved before reset() takes
nothing counted after it on every store and algorithm, however long ago the reset's plan was
set (an override in force at the reset, a rule longer than it reserved the call) and however
close in time the reset follows the reservation (the same microsecond, on the sliding log)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ratelimit import RateLimit
from tests.conftest import STORES, FakeClock, store_backend, supporting

pytestmark = pytest.mark.timeout(60)

Maker = Callable[[str], RateLimit]


@pytest.fixture(params=STORES)
async def make(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Maker]:
    """``make(algorithm)``: a limiter of a namespace of its own on the parametrized store,
    driven by the fake clock (skipped where the store does not decide ``algorithm``)."""
    kind: str = request.param
    made: list[RateLimit] = []

    def factory(algorithm: str) -> RateLimit:
        backend = supporting(store_backend(request, kind, clock), algorithm)
        limiter = RateLimit(backend, f"marks-{uuid.uuid4().hex[:8]}", algorithm=algorithm)
        made.append(limiter)
        return limiter

    yield factory
    for limiter in made:
        await limiter.aclose()


async def admitted(limit: Any, calls: int) -> int:
    """How many of ``calls`` decisions of one hit ``limit`` admits."""
    return sum([(await limit.decide()).allowed for _ in range(calls)])


# --- F: the sliding log's refund reads the reset mark ---


@pytest.mark.parametrize("dt", [0, 0.0000004, 0.0000015, 0.002])
async def test_a_log_refund_right_after_a_reset_takes_no_hit_counted_after_it(
    make: Maker, clock: FakeClock, dt: float
) -> None:
    rl = make("sliding-log")
    limit = rl.limit("user:5/h", key="k", user="u")
    reserved = await limit.decide(cost=5)
    assert reserved.allowed
    clock.advance(dt)  # within the reservation's microsecond, or just after
    await limit.reset()
    assert await admitted(limit, 10) == 5  # hits of the reservation's microsecond
    assert await limit.settle(reserved, 0)  # reserved before the reset: takes nothing
    assert await admitted(limit, 10) == 0
