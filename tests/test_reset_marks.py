"""Reset marks (issue 35, findings E and F): a refund of a call reserved before reset() takes
nothing counted after it on every store and algorithm, however long ago the reset's plan was
set (an override in force at the reset, a rule longer than it reserved the call) and however
close in time the reset follows the reservation (the same microsecond, on the sliding log)."""

from __future__ import annotations

import uuid

import pytest

from ratelimit import RateLimit
from tests.conftest import STORES, FakeClock, Maker, admitted, store_backend

pytestmark = pytest.mark.timeout(60)


# --- E: a reset under another plan keeps its mark as long as a refund could take ---


async def test_a_gcra_refund_takes_nothing_after_a_reset_made_under_a_shorter_override(
    make_limiter: Maker, clock: FakeClock
) -> None:
    rl = make_limiter("gcra")
    limit = rl.limit("user:1/s burst 5", key="k", user="u")
    reserved = await limit.decide(cost=5)  # held 5 s ahead
    assert reserved.allowed
    await rl.overrides.set("k", "user:1/s", user="u")
    await limit.reset()  # under the override: its own plan would keep a mark 2 s
    await rl.overrides.delete("k", user="u")
    assert await admitted(limit, 10) == 5
    clock.advance(3)  # 3 of the 5 drained; the reservation could still give back 2
    assert await limit.settle(reserved, 0)  # reserved before the reset: takes nothing
    assert await admitted(limit, 10) == 3


@pytest.mark.parametrize("algorithm", ["sliding-window", "fixed-window", "sliding-log"])
async def test_a_refund_takes_nothing_after_a_reset_made_under_a_shorter_rule(
    make_limiter: Maker, clock: FakeClock, algorithm: str
) -> None:
    rl = make_limiter(algorithm)
    limit = rl.limit("user:5/h", key="k", user="u")
    reserved = await limit.decide(cost=5)
    assert reserved.allowed
    clock.advance(0.5)
    await rl.overrides.set("k", "user:5/s", user="u")
    await limit.reset()  # under a rule of a second: its own plan would keep a mark 2 s
    await rl.overrides.delete("k", user="u")
    clock.advance(0.5)
    assert await admitted(limit, 10) == 5
    clock.advance(3)
    assert await limit.settle(reserved, 0)
    assert await admitted(limit, 3) == 0


# The cases above on Redis with an injected clock keep every mark an hour (Redis expires
# on its own time): there, what a mark is kept for is read from Redis on its own clock.

REDIS_STORES = [kind for kind in STORES if "redis" in str(getattr(kind, "values", [kind])[0])]


@pytest.mark.parametrize("kind", REDIS_STORES)
@pytest.mark.parametrize(
    ("algorithm", "rules", "at_least_ms"),
    [
        ("gcra", "user:1/s burst 5", 3_000),  # the reservation is held 5 s
        ("sliding-window", "user:5/h", 3_600_000),  # its window is held 1-2 h
        ("fixed-window", "user:5/h", 3_600_000),
        ("sliding-log", "user:5/h", 3_600_000),  # its hits are held an hour
    ],
)
async def test_a_redis_reset_mark_lives_as_long_as_what_it_forgot(
    request: pytest.FixtureRequest, kind: str, algorithm: str, rules: str, at_least_ms: int
) -> None:
    backend = store_backend(request, kind)  # Redis's own clock
    namespace = f"marks-{uuid.uuid4().hex[:8]}"
    async with RateLimit(backend, namespace, algorithm=algorithm) as rl:
        limit = rl.limit(rules, key="k", user="u")
        assert (await limit.decide(cost=5)).allowed
        await rl.overrides.set("k", "user:1/s", user="u")
        await limit.reset()  # its own plan keeps a mark 2 s
        marks = [key async for key in backend.client.scan_iter(match=f"*{namespace}*:r")]
        assert len(marks) == 1
        assert await backend.client.pttl(marks[0]) >= at_least_ms


# --- F: the sliding log's refund reads the reset mark ---


@pytest.mark.parametrize("dt", [0, 0.0000004, 0.0000015, 0.002])
async def test_a_log_refund_right_after_a_reset_takes_no_hit_counted_after_it(
    make_limiter: Maker, clock: FakeClock, dt: float
) -> None:
    rl = make_limiter("sliding-log")
    limit = rl.limit("user:5/h", key="k", user="u")
    reserved = await limit.decide(cost=5)
    assert reserved.allowed
    clock.advance(dt)  # within the reservation's microsecond, or just after
    await limit.reset()
    assert await admitted(limit, 10) == 5  # hits of the reservation's microsecond
    assert await limit.settle(reserved, 0)  # reserved before the reset: takes nothing
    assert await admitted(limit, 10) == 0
