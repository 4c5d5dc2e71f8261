"""The window counters (sliding and fixed window) on every backend, with a fake clock.

The fake clock starts at 1 000 000 s, which is 40 s into a minute-long window (windows start
at multiples of their size: 999 960 s here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratelimit import ConfigurationError, MemoryBackend, RateLimit, Rule
from tests.conftest import FakeClock, supporting


@pytest.fixture
def sliding(make_backend: Callable[..., object], clock: FakeClock, namespace: str) -> RateLimit:
    return RateLimit(make_backend(clock), namespace, algorithm="sliding-window")


@pytest.fixture
def fixed(make_backend: Callable[..., object], clock: FakeClock, namespace: str) -> RateLimit:
    return RateLimit(make_backend(clock), namespace, algorithm="fixed-window")


async def admitted(rl: RateLimit, rules: str, n: int, **options: object) -> int:
    limit = rl.limit(rules, key=rules, **options)  # type: ignore[call-overload]
    return sum([(await limit.decide()).allowed for _ in range(n)])


async def test_fixed_window_resets_at_the_window_boundary(
    fixed: RateLimit, clock: FakeClock
) -> None:
    assert await admitted(fixed, "10/m", 12) == 10
    denied = await fixed.limit("10/m", key="10/m").decide()
    assert denied.retry_after == pytest.approx(20.0, abs=1e-6)  # the window ends at 1 000 020
    clock.advance(19.999)
    assert await admitted(fixed, "10/m", 1) == 0
    clock.advance(0.001)
    assert await admitted(fixed, "10/m", 12) == 10  # a fresh window: the boundary burst


async def test_sliding_window_weighs_the_previous_window(
    sliding: RateLimit, clock: FakeClock
) -> None:
    assert await admitted(sliding, "10/m", 12) == 10
    clock.advance(20)  # a new window: previous = 10 at weight 1
    denied = await sliding.limit("10/m", key="10/m").decide()
    assert not denied.allowed
    # 10 * (60 - e) / 60 + 1 <= 10 once e >= 6 s
    assert denied.retry_after == pytest.approx(6.0, abs=1e-6)
    clock.advance(5.999)
    assert await admitted(sliding, "10/m", 1) == 0
    clock.advance(0.001)
    assert await admitted(sliding, "10/m", 1) == 1  # rate 9 + 1
    assert await admitted(sliding, "10/m", 1) == 0
    clock.advance(60)  # 6 s into the next window: the 1 call above weighs 0.9
    assert await admitted(sliding, "10/m", 12) == 9  # 8 + 0.9 + 1 <= 10 < 9 + 0.9 + 1
    clock.advance(60)
    assert await admitted(sliding, "10/m", 12) == 1  # now those 9 weigh 8.1: 0 + 8.1 + 1


async def test_sliding_window_retry_when_the_current_window_is_full(
    sliding: RateLimit, clock: FakeClock
) -> None:
    clock.advance(20)  # the start of a window
    assert await admitted(sliding, "10/m", 10) == 10
    clock.advance(30)
    denied = await sliding.limit("10/m", key="10/m").decide()
    # next window at +30 s; then 10 * (60 - e) / 60 + 1 <= 10 once e >= 6 s: 36 s in all
    assert denied.retry_after == pytest.approx(36.0, abs=1e-6)
    clock.advance(denied.retry_after)
    assert await admitted(sliding, "10/m", 2) == 1


async def test_remaining_and_binding_rule(sliding: RateLimit) -> None:
    limit = sliding.limit("5/m | user:3/h", key="k", user="u")
    remaining = [(await limit.decide()).remaining for _ in range(4)]
    assert remaining == [2, 1, 0, 0]
    decision = await sliding.limit("5/m | user:3/h", key="k", user="v").decide()
    assert decision.rule == Rule(5, 60_000)  # 5/m has 1 left, user:3/h has 2 for v


@pytest.mark.parametrize("algorithm", ["sliding-window", "fixed-window"])
async def test_fractional_costs(
    make_backend: Callable[..., object], clock: FakeClock, namespace: str, algorithm: str
) -> None:
    rl = RateLimit(supporting(make_backend(clock), algorithm), namespace, algorithm=algorithm)
    assert await admitted(rl, "2/s", 5, cost=0.5) == 4
    assert await admitted(rl, "2/s", 1, cost=0.1) == 0
    assert await admitted(rl, "3/h", 20, cost=0.1) == 20  # 0.1 * 20 = 2.0000000000000004 < 3
    assert await admitted(rl, "3/h", 20, cost=0.1) == 9  # and up to 2.9999999999999996


async def test_and_or_and_denials_record_nothing(sliding: RateLimit, clock: FakeClock) -> None:
    tree = "user:2/m & ip:2/m"
    assert await admitted(sliding, tree, 3, user="u", ip="1") == 2
    assert await admitted(sliding, tree, 3, user="u", ip="2") == 2  # ip 2 is fresh: And admits
    assert await admitted(sliding, tree, 1, user="u", ip="2") == 0
    assert await admitted(sliding, "2/m | user:9/m", 5, user="w") == 2
    clock.advance(120)
    # the 3 denied calls above were not counted against user w
    assert await admitted(sliding, "2/m | user:9/m", 2, user="w") == 2


def test_a_fraction_with_the_sliding_log_and_unknown_algorithms_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="fractions need algorithm="):
        RateLimit(MemoryBackend()).limit("2/s", cost=0.5)
    with pytest.raises(ConfigurationError, match="unknown algorithm 'token-bucket'"):
        RateLimit(MemoryBackend(), algorithm="token-bucket")
    with pytest.raises(ConfigurationError, match="cost must be a number of hits above 0"):
        RateLimit(MemoryBackend(), algorithm="sliding-window").limit("2/s", cost=float("nan"))
    with pytest.raises(ConfigurationError, match="cost 2.5 is above the count of rule '2/s'"):
        RateLimit(MemoryBackend(), algorithm="sliding-window").limit("2/s", cost=2.5)


@pytest.mark.redis
@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
async def test_counters_on_real_redis_stay_small_and_expire(
    redis_client: aioredis.Redis, namespace: str, use_scripts: bool
) -> None:
    rl = RateLimit(redis_client, namespace, algorithm="sliding-window", use_scripts=use_scripts)
    limit = rl.limit("user:100000/h & 10/s | user:50/m", key="api", user="vova")
    for _ in range(300):
        await limit.decide()
    key = f"rl:{{{namespace}:api}}:user=vova:w"
    fields: dict[Any, Any] = await redis_client.hgetall(key)
    # two window sizes on this identifier, at most two slots each, count and index per slot
    assert 2 <= len(fields) <= 8
    assert float(fields[b"3600000000:" + str(newest_slot(fields, 3_600_000_000)).encode()]) > 0
    assert 0 < await redis_client.pttl(key) <= 3 * 3_600_000
    assert 0 < await redis_client.pttl(f"rl:{{{namespace}:api}}:w") <= 3 * 1000
    assert not await redis_client.exists(f"rl:{{{namespace}:api}}:user=vova")  # no log


def newest_slot(fields: dict[Any, Any], size: int) -> int:
    """The slot of ``size`` that holds the newest window."""
    slots = [s for s in (0, 1) if f"{size}:{s}w".encode() in fields]
    return max(slots, key=lambda s: int(fields[f"{size}:{s}w".encode()]))
