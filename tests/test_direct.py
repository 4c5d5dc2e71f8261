"""The direct path (``ratelimit/front/direct.py``): a decorated call of a plain limit decided
without the general path's layers keeps every promise the general path keeps, on every
store and algorithm; a call the direct path cannot take goes the general way."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.algorithms import ALGORITHMS, Algorithm
from ratelimit.backends.base import Admit, admitting
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, Plan
from ratelimit.errors import LimiterClosedError
from tests.conftest import FakeClock, Maker


async def through(work: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether a decorated call was admitted (its body ran)."""
    try:
        await work(*args, **kwargs)
    except RateLimitExceeded:
        return False
    return True


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_decorated_limit_admits_exactly_its_count(
    make_limiter: Maker, clock: FakeClock, algorithm: str
) -> None:
    rl = make_limiter(algorithm)

    @rl.limit("user:5/m")
    async def work(user: str) -> str:
        return user

    assert [await through(work, "ann") for _ in range(8)] == [True] * 5 + [False] * 3
    assert [await through(work, "bob") for _ in range(6)] == [True] * 5 + [False]
    peeked = await rl.limit("user:5/m", key=f"{__name__}.{work.__qualname__}", user="ann").peek()
    assert not peeked.allowed  # the general path reads what the direct path counted
    clock.advance(120)  # two spans: every algorithm's window has let go
    assert [await through(work, "ann") for _ in range(6)] == [True] * 5 + [False]


@pytest.mark.parametrize("algorithm", ["sliding-log", "gcra"])
async def test_a_fixed_cost_counts_on_the_direct_path(make_limiter: Maker, algorithm: str) -> None:
    rl = make_limiter(algorithm)

    @rl.limit("user:5/m", cost=2)
    async def work(user: str) -> None: ...

    assert [await through(work, "ann") for _ in range(4)] == [True, True, False, False]


async def test_arguments_name_the_same_identifier_however_they_are_given() -> None:
    rl = RateLimit(MemoryBackend(), "direct")

    @rl.limit("user:3/m")
    async def work(user: Any, page: int = 1) -> None: ...

    assert await through(work, "7")
    assert await through(work, 7)  # as text: the same user
    assert await through(work, user=b"7", page=2)  # keywords: the same
    assert not await through(work, "7", page=3)
    assert [await through(work, None) for _ in range(5)] == [True] * 5  # no value: no limit
    wrong: Any = work
    with pytest.raises(TypeError, match="work"):
        await wrong("8", 1, 2)  # cannot bind: refused before anything is counted
    assert [await through(work, "8") for _ in range(4)] == [True] * 3 + [False]


async def test_methods_and_several_selectors_take_the_direct_path_too() -> None:
    rl = RateLimit(MemoryBackend(), "direct")

    class Shop:
        @rl.limit("user:2/m | (user:5/m & region:3/m)")
        async def buy(self, user: str, region: str) -> None: ...

    shop = Shop()
    assert [await through(shop.buy, "ann", "eu") for _ in range(3)] == [True, True, False]


@pytest.mark.parametrize("algorithm", ["sliding-log", "gcra"])
async def test_an_override_set_after_the_first_calls_applies_to_the_next(
    make_limiter: Maker, algorithm: str
) -> None:
    rl = make_limiter(algorithm)

    @rl.limit("user:5/m", key="search")
    async def work(user: str) -> None: ...

    assert await through(work, "ann")
    await rl.overrides.set("search", "user:2/m", user="ann")
    assert [await through(work, "ann") for _ in range(3)] == [True, False, False]
    assert [await through(work, "bob") for _ in range(6)] == [True] * 5 + [False]
    await rl.overrides.delete("search", user="ann")
    assert [await through(work, "ann") for _ in range(4)] == [True, True, True, False]


class Counting(MemoryBackend):
    """A memory store counting the decisions it is asked for, by either entry."""

    asked = 0

    async def decide(self, plan: Plan) -> Decision:
        self.asked += 1
        return await super().decide(plan)

    def admitter(self, compiled: CompiledTree, algorithm: Algorithm) -> Admit:
        admit = super().admitter(compiled, algorithm)

        def counted(plan: Plan) -> Decision | None:
            self.asked += 1
            return admit(plan)

        return counted


async def test_a_refusal_is_remembered_and_answered_without_the_store() -> None:
    backend = Counting()
    rl = RateLimit(backend, "direct")

    @rl.limit("user:2/m")
    async def work(user: str) -> None: ...

    assert admitting(backend) is not None  # this store's own pair: the direct path uses it
    assert [await through(work, "ann") for _ in range(5)] == [True, True, False, False, False]
    assert backend.asked == 3  # the first refusal asked the store; the others the cache
    assert await through(work, "bob")  # another call: the store
    assert backend.asked == 4


async def test_a_store_overriding_decide_alone_is_asked_through_decide() -> None:
    asked: list[Plan] = []

    class Decides(MemoryBackend):
        async def decide(self, plan: Plan) -> Decision:
            asked.append(plan)
            return await super().decide(plan)

    backend = Decides()
    assert admitting(backend) is None
    rl = RateLimit(backend, "direct")

    @rl.limit("user:2/m")
    async def work(user: str) -> None: ...

    assert [await through(work, "ann") for _ in range(3)] == [True, True, False]
    assert len(asked) == 3


async def test_shadow_lets_a_refusal_through_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    rl = RateLimit(MemoryBackend(), "direct")
    ran: list[str] = []

    @rl.limit("user:1/m", shadow=True)
    async def work(user: str) -> None:
        ran.append(user)

    with caplog.at_level(logging.INFO, logger="ratelimit.shadow"):
        await work("ann")
        await work("ann")
    assert ran == ["ann", "ann"]
    assert "shadow mode let through" in caplog.text


async def test_hooks_see_every_decorated_decision() -> None:
    seen: list[bool] = []
    rl = RateLimit(MemoryBackend(), "direct", hooks=[lambda d: seen.append(d.allowed)])

    @rl.limit("user:2/m")
    async def work(user: str) -> None: ...

    assert [await through(work, "ann") for _ in range(3)] == [True, True, False]
    assert seen == [True, True, False]


async def test_a_closed_limiter_refuses_decorated_calls() -> None:
    rl = RateLimit(MemoryBackend(), "direct")

    @rl.limit("user:2/m")
    async def work(user: str) -> None: ...

    await work("ann")
    await rl.aclose()
    with pytest.raises(LimiterClosedError):
        await work("ann")


async def test_the_plan_table_starts_again_when_full_and_still_counts_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("ratelimit.front.direct.PLANS", 4)
    rl = RateLimit(MemoryBackend(), "direct")

    @rl.limit("user:3/m")
    async def work(user: str) -> None: ...

    users = [f"u{n}" for n in range(10)]
    admitted = [sum([await through(work, user) for user in users]) for _ in range(4)]
    assert admitted == [10, 10, 10, 0]


async def test_hooks_installed_after_decorating_see_the_next_call() -> None:
    from ratelimit.pipeline.hooks import Hooks

    seen: list[bool] = []
    rl = RateLimit(MemoryBackend(), "direct")

    @rl.limit("user:2/m")
    async def work(user: str) -> None: ...

    await work("ann")
    rl._decider.hooks = Hooks([lambda d: seen.append(d.allowed)])  # no public way: the seam
    assert [await through(work, "ann") for _ in range(2)] == [True, False]
    assert seen == [True, False]
