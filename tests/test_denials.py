"""The denial cache: refusals answered in-process until they lift, never an admission."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.core.decision import Decision, make_decision
from ratelimit.core.plan import Plan, compile_tree
from ratelimit.pipeline.decider import CallKey
from ratelimit.pipeline.denials import DenialCache
from ratelimit.rules.tree import to_tree
from tests.conftest import FakeClock


class Counting(MemoryBackend):
    """A memory backend that counts how often it is asked."""

    asked = 0

    async def decide(self, plan: Plan) -> Decision:
        self.asked += 1
        return await super().decide(plan)


async def test_a_refusal_is_answered_without_the_backend_until_it_lifts(
    clock: FakeClock,
) -> None:
    backend = Counting(clock=clock)
    rl = RateLimit(backend, "d")
    limit = rl.limit("user:2/10s", key="k", user="u")
    assert [(await limit.decide()).allowed for _ in range(3)] == [True, True, False]
    assert backend.asked == 3
    clock.advance(4)
    cached = await limit.decide()
    assert not cached.allowed
    assert cached.retry_after == pytest.approx(6.0)  # brought up to date
    assert backend.asked == 3  # not asked
    with pytest.raises(RateLimitExceeded):
        async with rl.limit("user:2/10s", key="k", user="u"):
            pass
    assert backend.asked == 3
    assert (await rl.limit("user:2/10s", key="k", user="v").decide()).allowed  # other value
    assert backend.asked == 4
    clock.advance(6)  # the refusal lifts: the backend decides again
    assert (await limit.decide()).allowed
    assert backend.asked == 5


async def test_the_cache_is_bounded_and_can_be_turned_off(clock: FakeClock) -> None:
    rl = RateLimit(Counting(clock=clock), "d", denial_cache=2)
    for user in ("a", "b", "c"):
        limit = rl.limit("user:1/m", key="k", user=user)
        await limit.decide()
        await limit.decide()  # refused, remembered
    assert rl.cached_refusals == 2  # "a" went first
    off = Counting(clock=clock)
    rl_off = RateLimit(off, "d", denial_cache=0)
    for _ in range(5):
        await rl_off.limit("1/m", key="k").decide()
    assert off.asked == 5
    assert rl_off.cached_refusals == 0


async def test_degraded_refusals_are_not_remembered(clock: FakeClock) -> None:
    class Failing(MemoryBackend):
        async def decide(self, plan: Plan) -> Decision:
            from ratelimit import BackendError

            raise BackendError("down")

    rl = RateLimit(Failing(clock=clock), "d", on_error="deny")
    decision = await rl.limit("1/m", key="k").decide()
    assert decision.degraded
    assert not decision.allowed
    assert rl.cached_refusals == 0


async def test_a_refund_lifts_the_refusals_of_its_key(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock), "d", algorithm="sliding-window")
    limit = rl.limit("2/m", key="jobs")
    assert [(await limit.decide()).allowed for _ in range(3)] == [True, True, False]
    assert rl.cached_refusals == 1
    await rl.increment("jobs", 60, -1)  # a failed job gives its call back
    assert rl.cached_refusals == 0
    assert (await limit.decide()).allowed


@pytest.mark.redis
async def test_redis_sees_no_command_while_a_key_is_refused(
    redis_client: aioredis.Redis, namespace: str
) -> None:
    rl = RateLimit(redis_client, namespace)
    limit = rl.limit("user:3/m", key="flood", user="bot")
    for _ in range(4):
        await limit.decide()
    before = (await redis_client.info("commandstats"))["cmdstat_evalsha"]["calls"]
    for _ in range(200):
        assert not (await limit.decide()).allowed
    after = (await redis_client.info("commandstats"))["cmdstat_evalsha"]["calls"]
    assert after == before


def test_refusals_are_counted_per_key_through_every_way_out() -> None:
    """``forget`` walks the cache only for a key it holds refusals of: the count per key
    follows remembering, replacing, expiring, evicting, forgetting and clearing."""
    clock = FakeClock()
    cache = DenialCache(size=3, clock=clock)
    refusal = make_decision(False, 5.0, None, 0, "a")

    def call(key: str, user: str) -> CallKey:
        return CallKey(compile_tree(to_tree("user:1/m")), "ns", key, (user,), 1, "sliding-log")

    for user in ("u1", "u2"):
        cache.remember(call("a", user), refusal)
    cache.remember(call("a", "u1"), refusal)  # again: still one refusal of u1
    cache.remember(call("b", "u1"), refusal)
    assert cache._keys == {("ns", "a"): 2, ("ns", "b"): 1}
    cache.remember(call("c", "u1"), refusal)  # the oldest, a/u2, is evicted
    assert cache._keys == {("ns", "a"): 1, ("ns", "b"): 1, ("ns", "c"): 1}
    cache.forget("ns", "a")
    assert cache.get(call("a", "u1")) is None
    assert cache._keys == {("ns", "b"): 1, ("ns", "c"): 1}
    cache.forget("ns", "zzz")  # nothing held: nothing walked, nothing changed
    clock.advance(6)
    assert cache.get(call("b", "u1")) is None  # expired
    assert cache._keys == {("ns", "c"): 1}
    assert cache.get(call("c", "u1")) is None
    assert cache._keys == {}
    cache.remember(call("d", "u1"), refusal)
    cache.clear()
    assert cache._keys == {}
    assert len(cache) == 0
