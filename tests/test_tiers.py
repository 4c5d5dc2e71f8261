"""Rules chosen per call (issue 24, item 1): a mapping from a keyword selector's values to
rules (tiers), or a callable of the call's arguments returning rules. On every backend of
the conftest (memory, fakeredis, a real Redis; both engines)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ratelimit import (
    ConfigurationError,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
    RuleConflictError,
    RuleSyntaxError,
)
from tests.conftest import BackendFactory, FakeClock

TIERS = {"free": "apikey:2/m", "pro": "apikey:5/m", "default": "apikey:1/m"}


async def admitted(call: Any, *args: Any, times: int) -> int:
    n = 0
    for _ in range(times):
        try:
            await call(*args)
            n += 1
        except RateLimitExceeded:
            pass
    return n


def limiter(make_backend: BackendFactory, clock: FakeClock, **options: Any) -> RateLimit:
    return RateLimit(make_backend(clock), f"tiers-{uuid.uuid4().hex[:8]}", **options)


async def test_a_mapping_picks_the_rules_by_a_selector_s_value(
    make_backend: BackendFactory, clock: FakeClock
) -> None:
    rl = limiter(make_backend, clock)
    plans = {"k-free": "free", "k-pro": "pro", "k-other": "enterprise"}

    def search_for(apikey: str) -> Any:
        @rl.limit(TIERS, key="search", tier=lambda: plans[apikey], apikey=apikey)
        async def search() -> str:
            return apikey

        return search

    assert await admitted(search_for("k-free"), times=4) == 2
    assert await admitted(search_for("k-pro"), times=7) == 5
    assert await admitted(search_for("k-other"), times=3) == 1  # the default entry


async def test_a_callable_chooses_the_rules_from_the_call_s_arguments(
    make_backend: BackendFactory, clock: FakeClock
) -> None:
    rl = limiter(make_backend, clock)

    async def rules(apikey: str, tier: str) -> str:
        return TIERS[tier]

    @rl.limit(rules, key="search")
    async def search(apikey: str, tier: str) -> str:
        return apikey

    assert await admitted(search, "a", "free", times=4) == 2
    assert await admitted(search, "b", "pro", times=7) == 5


@pytest.mark.parametrize("algorithm", ["sliding-log", "sliding-window", "fixed-window"])
async def test_counters_carry_on_when_a_caller_changes_tier(
    make_backend: BackendFactory, clock: FakeClock, algorithm: str
) -> None:
    rl = limiter(make_backend, clock, algorithm=algorithm)

    @rl.limit(lambda apikey, tier: TIERS[tier], key="upgrade")
    async def search(apikey: str, tier: str) -> str:
        return apikey

    assert await admitted(search, "k", "free", times=3) == 2
    assert await admitted(search, "k", "pro", times=5) == 3  # 2 counted: 3 more, not 5


async def test_a_value_without_rules_or_default_is_a_clear_error() -> None:
    rl = RateLimit(MemoryBackend())
    limit = rl.limit({"free": "apikey:2/m"}, key="strict", tier="gold", apikey="k")
    with pytest.raises(ConfigurationError, match="no rules for tier='gold'"):
        await limit.decide()


def test_a_mapping_needs_one_keyword_selector_to_be_keyed_by() -> None:
    rl = RateLimit(MemoryBackend())
    with pytest.raises(ConfigurationError, match="none is given"):
        rl.limit({"free": "2/m"}, key="a")
    with pytest.raises(ConfigurationError, match="several are: tier, plan"):
        rl.limit({"free": "2/m"}, key="b", tier="x", plan="y")
    with pytest.raises(RuleSyntaxError):
        rl.limit({"free": "2/x"}, key="c", tier="free")
    with pytest.raises(ConfigurationError, match="above the count"):
        rl.limit({"free": "1/m", "pro": "5/m"}, key="d", cost=3, tier="free")


async def test_a_bad_text_from_a_callable_raises_naming_it() -> None:
    rl = RateLimit(MemoryBackend())
    limit = rl.limit(lambda: "10/fortnight", key="bad")
    with pytest.raises(RuleSyntaxError, match="10/fortnight"):
        await limit.decide()


async def test_a_key_s_chosen_rules_are_registered_once() -> None:
    rl = RateLimit(MemoryBackend())
    rl.limit(TIERS, key="shared", tier="free", apikey="k")
    rl.limit(TIERS, key="shared", tier="pro", apikey="k")  # equal mapping: fine
    with pytest.raises(RuleConflictError):
        rl.limit({"free": "apikey:3/m"}, key="shared", tier="free", apikey="k")
    reused = rl.limit(key="shared", tier="free", apikey="j")
    assert [(await reused.decide()).allowed for _ in range(3)] == [True, True, False]
