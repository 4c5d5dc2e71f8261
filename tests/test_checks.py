"""Bad settings fail when the limiter is made; misuse fails before anything is counted."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

from ratelimit import (
    ConfigurationError,
    LimiterClosedError,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
)
from ratelimit.backends.base import Backend
from tests.conftest import FakeClock

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"denial_cache": "10"}, TypeError, "denial_cache must be a whole number"),
        ({"denial_cache": NAN}, TypeError, "denial_cache must be a whole number"),
        ({"denial_cache": -1}, ConfigurationError, "denial_cache must be 0 or more"),
        ({"denial_cache": True}, TypeError, "denial_cache must be a whole number"),
        ({"background": "no"}, TypeError, "background must be True or False"),
        ({"disable_locks": "no"}, TypeError, "disable_locks must be True or False"),
        ({"use_scripts": 0}, TypeError, "use_scripts must be True or False"),
        ({"clock": 5}, TypeError, "clock must be a callable"),
        ({"hooks": [print, 5]}, TypeError, "a hook must be callable, not int"),
        ({"lock_ttl": INF}, ConfigurationError, "lock_ttl must be"),
        ({"lock_ttl": 1e300}, ConfigurationError, "lock_ttl must be"),
        ({"lock_ttl": 0.001}, ConfigurationError, "lock_ttl must be"),
        ({"lock_ttl": "10"}, ConfigurationError, "lock_ttl must be"),
        (
            {"lock_ttl": 0.2, "timeout": 0.25, "use_scripts": False},
            ConfigurationError,
            "longer than timeout",
        ),
        ({"lock_polling_interval": 0}, ConfigurationError, "lock_polling_interval must be"),
        ({"lock_polling_interval": NAN}, ConfigurationError, "lock_polling_interval must be"),
        ({"lock_timeout": -1}, ConfigurationError, "lock_timeout must be"),
        ({"lock_timeout": NAN}, ConfigurationError, "lock_timeout must be"),
    ],
)
@pytest.mark.parametrize("made_by", ["init", "from_url"])
def test_settings_are_checked_when_the_limiter_is_made(
    options: dict[str, Any], error: type[Exception], message: str, made_by: str
) -> None:
    def make() -> RateLimit:
        if made_by == "init":
            return RateLimit(fakeredis.FakeAsyncRedis(), "ns", **options)
        # checked before any client is opened, so nothing is left open
        return RateLimit.from_url("redis://127.0.0.1:1/0", "ns", **options)

    with pytest.raises(error, match=message):
        make()


def test_good_lock_settings_pass() -> None:
    RateLimit(fakeredis.FakeAsyncRedis(), lock_ttl=0.5, lock_timeout=INF, timeout=None)
    RateLimit(MemoryBackend(), denial_cache=0, hooks=[print], background=False)


@pytest.mark.parametrize("algorithm", ["sliding-log"])
def test_the_sliding_log_bounds_its_counts_and_costs(algorithm: str) -> None:
    rl = RateLimit(MemoryBackend(), algorithm=algorithm)
    rl.limit("100000/h")
    rl.limit("1000/h", cost=1000)
    with pytest.raises(ConfigurationError, match="at most 100000 .*sliding-window"):
        rl.limit("100001/h")
    with pytest.raises(ConfigurationError, match="cost of at most 1000 .*sliding-window"):
        rl.limit("5000/h", cost=2000)
    with pytest.raises(ConfigurationError, match="at most 100000"):
        rl.limit("apikey:10/s | 1000000000/d")
    counters = RateLimit(MemoryBackend(), algorithm="sliding-window")
    counters.limit("1000000000/d", cost=2_000_000)  # window counters: O(1) whatever the cost


async def test_a_cost_above_the_log_bound_on_a_reused_key_fails_before_counting() -> None:
    rl = RateLimit(MemoryBackend())

    @rl.limit("100000/h", key="big")
    async def light() -> None: ...

    heavy = rl.limit(key="big", cost=5000)
    with pytest.raises(ConfigurationError, match="cost of at most 1000"):
        await heavy.decide()


class Shop:
    def __init__(self, rl: RateLimit) -> None:
        self.sold = 0

    async def buy(self, item: str, *, count: int = 1) -> str:
        self.sold += count
        return item


async def test_a_call_that_cannot_bind_fails_without_counting() -> None:
    rl = RateLimit(MemoryBackend(), "shop")
    buy = rl.limit("2/m", key="buy")(Shop.buy)
    with pytest.raises(TypeError, match="missing a required argument: 'item'"):
        await buy("hat")  # type: ignore[call-arg, arg-type]  # on the class: no self
    with pytest.raises(TypeError, match="too many positional arguments"):
        await buy(Shop(rl), "hat", 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'size'"):
        await buy(Shop(rl), "hat", size=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="multiple values for argument 'item'"):
        await buy(Shop(rl), "hat", item="cap")  # type: ignore[misc]
    shop = Shop(rl)
    assert await buy(shop, "hat") == "hat"
    assert await buy(shop, item="cap", count=2) == "cap"  # the quota was untouched: 2 of 2
    with pytest.raises(RateLimitExceeded):
        await buy(shop, "hat")


async def test_binding_follows_every_kind_of_parameter() -> None:
    rl = RateLimit(MemoryBackend())

    async def kinds(
        a: int, /, b: int, *args: int, c: int, d: int = 4, **kw: int
    ) -> tuple[Any, ...]:
        return a, b, args, c, d, kw

    f: Any = rl.limit("100/m", key="kinds")(kinds)

    assert await f(1, 2, 3, c=5, e=6) == (1, 2, (3,), 5, 4, {"e": 6})
    assert await f(1, b=2, c=3) == (1, 2, (), 3, 4, {})
    assert await f(1, 2, c=3, a=9) == (1, 2, (), 3, 4, {"a": 9})  # a is positional-only
    for args, kwargs in [((1, 2), {}), ((), {"b": 2, "c": 3}), ((1,), {"c": 3})]:
        with pytest.raises(TypeError):
            await f(*args, **kwargs)
    decision = await rl.limit(key="kinds").peek()
    assert decision.remaining == 100 - 3 - 1  # 3 counted (those that bound), then this one


async def test_a_storage_refusal_says_what_happened() -> None:
    class Down:
        async def decide(self, plan: object) -> Any:
            from ratelimit import BackendError

            raise BackendError("redis failed: gone")

        async def reset(self, plan: object) -> None: ...
        async def update_counter(self, update: object) -> float:
            return 0.0

        async def aclose(self) -> None: ...

    rl = RateLimit(Down(), on_error="deny")
    with pytest.raises(RateLimitExceeded) as caught:
        async with rl.limit("5/s", key="k"):
            pass
    message = str(caught.value)
    assert "None" not in message
    assert "storage failed" in message
    assert "on_error='deny'" in message


LONE = json.loads('"\\ud800"')  # a lone surrogate, as JSON may carry one


async def test_lone_surrogates_in_selector_values_count_alike_everywhere(
    make_backend: Callable[..., Backend], namespace: str
) -> None:
    rl = RateLimit(make_backend(FakeClock()), namespace)
    for value in (LONE, "a" + LONE * 40, "\udcff"):
        limit = rl.limit("user:2/m", key="s", user=value)
        assert [(await limit.decide()).allowed for _ in range(3)] == [True, True, False], value
    # the byte 0xff decodes (surrogateescape) to the text "\udcff": one value, one counter
    assert not (await rl.limit("user:2/m", key="s", user=b"\xff").decide()).allowed
    assert (await rl.limit("user:2/m", key="s", user="\udcfe").decide()).allowed


async def test_use_after_aclose_raises(
    make_backend: Callable[..., Backend], namespace: str
) -> None:
    rl = RateLimit(make_backend(FakeClock()), namespace)
    limit = rl.limit("5/s", key="k")
    assert (await limit.decide()).allowed
    await rl.aclose()
    for use in (limit.decide, limit.peek, limit.reset, lambda: rl.increment("k", 60)):
        with pytest.raises(LimiterClosedError, match="closed"):
            await use()
    await rl.aclose()  # closing twice is fine


async def test_a_backend_used_after_aclose_raises(
    make_backend: Callable[..., Backend], namespace: str
) -> None:
    from ratelimit.core.plan import cached_plan, compile_tree
    from ratelimit.rules.tree import to_tree

    backend = make_backend(FakeClock())
    plan = cached_plan(compile_tree(to_tree("5/s")), namespace, "k", (), 1, "sliding-log")
    assert (await backend.decide(plan)).allowed
    await backend.aclose()
    with pytest.raises(LimiterClosedError):
        await backend.decide(plan)
    with pytest.raises(LimiterClosedError):
        await backend.reset(plan)
    await backend.aclose()
