"""Kong's counter API, ``increment`` and ``sliding_window``, on every backend (fake clock at
1 000 000 s: 40 s into a minute-long window)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from ratelimit import ConfigurationError, MemoryBackend, RateLimit
from tests.conftest import FakeClock


@pytest.fixture
def counters(make_backend: Callable[..., object], clock: FakeClock, namespace: str) -> RateLimit:
    return RateLimit(make_backend(clock), namespace, algorithm="sliding-window")


async def test_increment_returns_the_sliding_rate(counters: RateLimit, clock: FakeClock) -> None:
    assert await counters.increment("x", 60) == 1.0
    assert await counters.increment("x", 60, 2) == 3.0
    assert await counters.sliding_window("x", 60) == 3.0  # reads, adds nothing
    assert await counters.sliding_window("x", 60) == 3.0
    clock.advance(20)  # the next window starts: the previous one weighs 1
    assert await counters.sliding_window("x", 60) == 3.0
    clock.advance(30)  # half way: it weighs 0.5
    assert await counters.sliding_window("x", 60) == 1.5
    assert await counters.increment("x", 60, 0.5) == 2.0
    assert await counters.increment("x", 60, -1) == 1.0  # a refund, as Kong's RLA does
    assert await counters.sliding_window("x", 60, weight=0) == -0.5  # a fixed window
    assert await counters.sliding_window("x", 60, weight=1) == 2.5
    clock.advance(120)
    assert await counters.sliding_window("x", 60) == 0.0


async def test_window_sizes_and_keys_count_apart(counters: RateLimit) -> None:
    await counters.increment("a", 60, 5)
    assert await counters.sliding_window("a", 1) == 0.0
    assert await counters.sliding_window("b", 60) == 0.0
    assert await counters.increment("a", 0.5, 2) == 2.0  # half-second windows


async def test_the_counter_is_the_one_a_limit_of_that_key_uses(
    counters: RateLimit,
) -> None:
    limit = counters.limit("5/m", key="search")
    for _ in range(5):
        assert (await limit.decide()).allowed
    assert not (await limit.decide()).allowed
    assert await counters.sliding_window("search", 60) == 5.0
    assert await counters.increment("search", 60, -5) == 0.0  # refund all five
    assert [(await limit.decide()).allowed for _ in range(6)] == [True] * 5 + [False]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0,), "window_size must be seconds above 0"),
        ((-1,), "window_size must be seconds above 0"),
        ((float("nan"),), "window_size must be"),
        (("60",), "window_size must be"),
        ((True,), "window_size must be"),
        ((1e-9,), "under a microsecond"),
        ((60, float("inf")), "value must be a finite number"),
        ((60, "1"), "value must be a finite number"),
        ((60, 1, 1.5), "weight must be from 0 to 1"),
        ((60, 1, -0.1), "weight must be from 0 to 1"),
    ],
)
async def test_bad_counter_arguments(args: tuple[object, ...], message: str) -> None:
    rl = RateLimit(MemoryBackend())
    with pytest.raises(ConfigurationError, match=message):
        await rl.increment("k", *args)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be text"):
        await rl.sliding_window(5, 60)  # type: ignore[arg-type]


@pytest.mark.redis
@pytest.mark.parametrize("use_scripts", [True, False], ids=["script", "commands"])
async def test_counter_keys_expire_after_two_windows(
    redis_client: aioredis.Redis, namespace: str, use_scripts: bool
) -> None:
    rl = RateLimit(redis_client, namespace, use_scripts=use_scripts)
    await rl.increment("k", 30, 2.5)
    key = f"rl:{{{namespace}:k}}:w"
    assert 59_000 < await redis_client.pttl(key) <= 60_000
    await rl.sliding_window("k", 3600)  # reading writes nothing, not even a longer TTL
    assert await redis_client.pttl(key) <= 60_000
    assert await rl.sliding_window("k", 30) == 2.5
