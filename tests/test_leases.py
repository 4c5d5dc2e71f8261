"""Leases (``lease=``): a process takes a slice of a limit from the store at once and admits
from it in-process; the store never counts more than the limit, what is left is given back,
and near the limit every call asks the store (:mod:`ratelimit.backends.leases`).

These run on ``memory://`` and fakeredis driven by a fake clock (the lease clock follows
the store's injected one); tests/test_lease_processes.py counts admissions of several OS
processes on a real Redis.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from typing import Any

import fakeredis
import pytest

from ratelimit import (
    BackendError,
    ConfigurationError,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
    RedisScriptBackend,
    SettleError,
)
from ratelimit.backends.base import OverrideStore, SettleStore, shortcut
from ratelimit.backends.leases import LeasedBackend, leasable
from ratelimit.backends.leases.sizing import SHARE, Sizer
from ratelimit.backends.penalty_store import PenaltyStore
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan, compile_tree
from ratelimit.rules.tree import to_tree
from ratelimit.settings import Settings
from ratelimit.sync import RateLimit as SyncRateLimit
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(60)

ALGORITHMS = ["sliding-log", "gcra", "sliding-window", "fixed-window"]


class Counting(MemoryBackend):
    """``memory://`` that counts the decisions it is asked for, and can be made to fail."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.asked = 0
        self.failing = False

    async def decide(self, plan: Plan) -> Decision:
        if self.failing:
            raise BackendError("the store is down (a test's)")
        self.asked += 1
        return await super().decide(plan)


def _fake(clock: FakeClock) -> RedisScriptBackend:
    return RedisScriptBackend(fakeredis.FakeAsyncRedis(), clock=clock, owns_client=True)


def _store(kind: str, clock: FakeClock) -> Any:
    return Counting(clock) if kind == "memory" else _fake(clock)


async def _hammer(rl: RateLimit, rule: str, calls: int, tasks: int = 16, cost: int = 1) -> int:
    """``tasks`` coroutines making ``calls`` calls each of one hot ``rule``; how many were
    admitted (counted here)."""
    admitted = 0

    async def worker() -> None:
        nonlocal admitted
        for _ in range(calls):
            if (await rl.limit(rule, key="hot", apikey="k", cost=cost).decide()).allowed:
                admitted += 1

    await asyncio.gather(*(worker() for _ in range(tasks)))
    return admitted


async def _counted(store: Any, rule: str, algorithm: str, namespace: str) -> int | None:
    """What the store has left for ``rule`` (a limiter without leases peeks)."""
    plain = RateLimit(store, namespace, algorithm=algorithm)
    decision = await plain.limit(rule, key="hot", apikey="k").peek()
    return decision.remaining


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("kind", ["memory", "fakeredis"])
async def test_a_hot_limit_admits_exactly_its_count_and_the_store_counts_them(
    kind: str, algorithm: str, clock: FakeClock
) -> None:
    store = _store(kind, clock)
    rl = RateLimit(store, "lease", algorithm=algorithm, lease=0.05)
    try:
        admitted = await _hammer(rl, "apikey:500/m", calls=60)  # 960 asked
        assert admitted == 500
        await rl.storage.give_back()  # type: ignore[attr-defined]
        assert await _counted(store, "apikey:500/m", algorithm, "lease") == 0
    finally:
        await rl.aclose()


LEASED = ["sliding-log", "sliding-window", "fixed-window"]


@pytest.mark.parametrize("algorithm", LEASED)
async def test_leases_take_few_store_calls_and_give_back_what_is_left(
    algorithm: str, clock: FakeClock
) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", algorithm=algorithm, lease=0.05)
    admitted = await _hammer(rl, "apikey:100000/m", calls=200)  # 3200, far below the limit
    assert admitted == 3200
    assert store.asked / admitted <= 0.05, store.asked
    await rl.storage.give_back()  # type: ignore[attr-defined]
    assert await _counted(store, "apikey:100000/m", algorithm, "lease") == 100000 - 3200 - 1
    await rl.aclose()


async def test_gcra_decides_every_call_at_the_store(clock: FakeClock) -> None:
    """A GCRA slice taken at once would let the bucket refill while its calls were still
    to come: GCRA decides per call under ``lease=``."""
    store = Counting(clock)
    rl = RateLimit(store, "lease", algorithm="gcra", lease=0.05)
    assert await _hammer(rl, "apikey:100000/m", calls=10) == 160
    assert store.asked == 160
    await rl.aclose()


async def test_the_sliding_log_stamps_a_leases_calls_again_when_it_ends(
    clock: FakeClock,
) -> None:
    """A call admitted from a lease is counted from when its lease ends, not from when the
    slice was taken: no stamp is older than its call."""
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    limit = rl.limit("apikey:64/s", key="hot", apikey="k")
    assert (await limit.decide()).allowed  # one call, at the store: stamped now (t0)
    assert (await limit.decide()).allowed  # a slice of two taken at t0
    assert store.asked == 2
    clock.advance(0.03)
    assert (await limit.decide()).allowed  # from the slice, at t0 + 0.03
    assert store.asked == 2
    clock.advance(0.01)
    await rl.storage.give_back()  # type: ignore[attr-defined]  # its two calls: t0 + 0.04
    clock.advance(0.97)  # t0 + 1.01: the slice's own stamps (t0) would have left
    assert await _counted(store, "apikey:64/s", "sliding-log", "lease") == 64 - 2 - 1
    clock.advance(0.04)  # t0 + 1.05: a second after the lease ended
    assert await _counted(store, "apikey:64/s", "sliding-log", "lease") == 64 - 1
    await rl.aclose()


@pytest.mark.parametrize("algorithm", LEASED)
async def test_a_leased_call_settles_against_its_lease(algorithm: str, clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", algorithm=algorithm, lease=0.05)
    limit = rl.limit("apikey:1000/m", key="hot", apikey="k")
    for _ in range(8):
        await limit.decide()
    decision = await limit.decide()
    assert decision.allowed
    asked = store.asked
    assert await limit.settle(decision, 0)  # back to the lease
    with pytest.raises(SettleError, match="settled already"):
        await limit.settle(decision, 0)
    excess = await limit.decide()
    assert await limit.settle(excess, 5)  # four more, recorded now
    assert store.asked == asked  # a settle is no decision
    await rl.storage.give_back()  # type: ignore[attr-defined]
    assert await _counted(store, "apikey:1000/m", algorithm, "lease") == 1000 - (9 - 1 + 5) - 1
    await rl.aclose()


async def test_aclose_gives_back_what_leases_hold(clock: FakeClock) -> None:
    server = fakeredis.FakeServer()

    def store() -> RedisScriptBackend:
        client = fakeredis.FakeAsyncRedis(server=server)
        return RedisScriptBackend(client, clock=clock, owns_client=True)

    rl = RateLimit(store(), "lease", lease=0.05)
    assert await _hammer(rl, "apikey:100000/m", calls=50) == 800
    await rl.aclose()  # gives back what its lease holds, then closes its store
    other = store()
    assert await _counted(other, "apikey:100000/m", "sliding-log", "lease") == 100000 - 800 - 1
    await other.aclose()


async def test_a_lease_ends_after_its_hold_and_gives_back_what_is_left(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    limit = rl.limit("apikey:1000/m", key="hot", apikey="k")
    for _ in range(64):  # leases grow: one call, then doubling
        assert (await limit.decide()).allowed
    asked = store.asked
    assert asked < 64
    clock.advance(0.06)  # past the hold: the next call takes a new lease
    assert (await limit.decide()).allowed
    assert store.asked == asked + 1
    await asyncio.sleep(0)  # the give-back's task
    await rl.storage.give_back()  # type: ignore[attr-defined]
    assert await _counted(store, "apikey:1000/m", "sliding-log", "lease") == 1000 - 65 - 1
    await rl.aclose()


async def test_near_the_limit_every_call_asks_the_store(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    limit = rl.limit("apikey:40/m", key="hot", apikey="k")
    for _ in range(40):
        assert (await limit.decide()).allowed
    asked = store.asked
    refused = await limit.decide()
    assert not refused.allowed
    assert refused.retry_after == pytest.approx(60, abs=0.01)
    assert store.asked == asked + 1  # the refusal is the store's own
    with pytest.raises(RateLimitExceeded):
        async with rl.limit("apikey:40/m", key="hot", apikey="k"):
            pass
    await rl.aclose()


def test_sizes_start_at_one_call_double_at_most_and_keep_a_share_of_what_is_left() -> None:
    sizer = Sizer(hold=0.1)
    assert sizer.size(0.0, 1, None, 1000) == 1  # nothing known yet
    for _ in range(99):
        sizer.asked(1)
    assert sizer.size(0.1, 1, 10_000, 10_000) == 2  # 1000/s x 0.1 s wants 100: doubles at most
    assert sizer.size(0.1001, 1, 10_000, 10_000) == 4
    assert sizer.size(0.1002, 1, 40, 10_000) == 4  # an eighth of 40 is 5: 4
    assert sizer.size(0.1003, 1, 7, 10_000) == 1  # an eighth of 7 is below 2: per call
    assert sizer.size(0.1004, 3, 10_000, 10_000) == 6  # multiples of the call's cost
    assert sizer.size(0.1005, 1, 10_000, 16) <= 16  # never more than a call may cost
    assert SHARE == 0.125


async def test_an_idle_process_holds_one_call_only(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    limit = rl.limit("apikey:1000/m", key="hot", apikey="k")
    for _ in range(5):
        assert (await limit.decide()).allowed
        clock.advance(10)  # one call every 10 s: each asks the store for itself
    assert store.asked == 5
    await rl.aclose()


async def test_an_and_tree_decides_every_call_at_the_store(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    limit = rl.limit("apikey:100/m & 1000/h", key="hot", apikey="k")
    for _ in range(30):
        assert (await limit.decide()).allowed
    assert store.asked == 30
    assert not leasable(compile_tree(to_tree("a:1/s & 2/m")))
    assert leasable(compile_tree(to_tree("a:1/s | (2/m | b:3/h)")))
    await rl.aclose()


async def test_an_or_tree_is_leased_and_never_passes_its_tightest_rule(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    admitted = await _hammer(rl, "apikey:300/m | 5000/h", calls=40)
    assert admitted == 300
    assert store.asked < 300
    await rl.aclose()


async def test_costs_are_taken_from_the_slice(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    assert await _hammer(rl, "apikey:999/m", calls=40, cost=3) == 333
    await rl.aclose()


async def test_a_peek_asks_the_store_and_takes_nothing(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    limit = rl.limit("apikey:10/m", key="hot", apikey="k")
    for _ in range(3):
        assert (await limit.peek()).remaining == 9
    assert store.asked == 3
    await rl.aclose()


async def test_reset_ends_the_leases_of_its_identifiers(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    assert await _hammer(rl, "apikey:100/m", calls=20) == 100
    limit = rl.limit("apikey:100/m", key="hot", apikey="k")
    await limit.reset()
    clock.advance(0.001)  # a give-back never takes back across a reset of its microsecond
    assert await _hammer(rl, "apikey:100/m", calls=20) == 100
    await rl.aclose()


async def test_a_lease_held_when_the_store_fails_is_spent_then_the_policy_answers(
    clock: FakeClock,
) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05, on_error="deny")
    limit = rl.limit("apikey:100000/m", key="hot", apikey="k")
    for _ in range(100):
        assert (await limit.decide()).allowed
    store.failing = True
    spent = 0
    while (decision := await limit.decide()).allowed:
        assert not decision.degraded
        spent += 1
    assert decision.degraded  # on_error="deny" answers once the lease is spent
    assert 0 < spent <= 128
    await rl.aclose()


async def test_the_window_counters_end_a_lease_where_its_window_ends() -> None:
    clock = FakeClock(start=1_000_000.99)  # 10 ms before a second ends
    store = Counting(clock)
    rl = RateLimit(store, "lease", algorithm="fixed-window", lease=0.05)
    limit = rl.limit("apikey:1000/s", key="hot", apikey="k")
    for _ in range(64):
        assert (await limit.decide()).allowed
    asked = store.asked
    clock.advance(0.02)  # the next second: what is left of the lease is not used there
    assert (await limit.decide()).allowed
    assert store.asked == asked + 1
    await rl.aclose()


async def test_lease_per_limit_turns_a_limit_to_per_call(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    for _ in range(20):
        limit = rl.limit("apikey:1000/m", key="cold", apikey="k", lease=0)
        assert (await limit.decide()).allowed
    assert store.asked == 20
    await rl.aclose()


async def test_lease_per_limit_on_a_limiter_without_leases(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease")

    @rl.limit("apikey:1000/m")
    async def plain(apikey: str) -> None:
        return None

    @rl.limit("apikey:1000/m", lease=0.05)
    async def leased(apikey: str) -> None:
        return None

    for _ in range(100):
        await plain("k")
    assert store.asked == 100  # made before leases came: decides as it did
    for _ in range(100):
        await leased("k")
    assert store.asked < 100 + 20
    blocks = store.asked
    for _ in range(100):
        async with rl.limit("apikey:1000/m", key="block", apikey="k", lease=0.05):
            pass
    assert store.asked < blocks + 20
    await rl.aclose()


@pytest.mark.parametrize("bad", [-1, 61, "0.05", True])
def test_a_bad_lease_per_limit_is_refused_when_the_limit_is_made(bad: object) -> None:
    rl = RateLimit.from_url("memory://")
    with pytest.raises(ConfigurationError, match=r"limit\(lease=\) must be seconds"):
        rl.limit("apikey:5/m", apikey="k", lease=bad)  # type: ignore[call-overload]


async def test_the_decorator_direct_path_takes_from_the_lease(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)

    @rl.limit("apikey:1000/m")
    async def call(apikey: str) -> None:
        return None

    for _ in range(200):
        await call("k")
    assert store.asked < 20
    await rl.aclose()


@pytest.mark.parametrize("bad", [-1, 61, float("nan"), float("inf"), "0.05", True])
def test_a_bad_lease_is_refused_when_the_limiter_is_made(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="lease must be seconds from 0 to 60"):
        RateLimit.from_url("memory://", lease=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lease must be seconds"):
        Settings(lease=bad)  # type: ignore[arg-type]


def test_lease_with_sync_rate_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="lease and sync_rate"):
        Settings(lease=0.05, sync_rate=1, algorithm="fixed-window")


def test_the_sync_api_takes_leases() -> None:
    namespace = f"sync-{uuid.uuid4().hex[:8]}"
    rl = SyncRateLimit.from_url("memory://", namespace, lease=0.05)
    try:
        limit = rl.limit("apikey:50/m", key="hot", apikey="k")
        assert sum(limit.decide().allowed for _ in range(80)) == 50
        one = rl.limit("apikey:50/m", key="one", apikey="k", lease=0)
        assert sum(one.decide().allowed for _ in range(80)) == 50
    finally:
        rl.close()


def test_a_store_that_cannot_settle_is_refused() -> None:
    class Plain:
        async def decide(self, plan: Plan) -> Decision:
            raise NotImplementedError

        async def reset(self, plan: Plan) -> None:
            return None

        async def update_counter(self, update: Any) -> float:
            return 0.0

        async def aclose(self) -> None:
            return None

    with pytest.raises(ConfigurationError, match="cannot settle"):
        LeasedBackend(Plain(), 0.05)


async def test_a_leased_call_has_its_rules_states(clock: FakeClock) -> None:
    """HTTP's RateLimit headers and the service read a decision's states: a call admitted
    from a lease has each rule's, with what the store left after the slice and what the
    lease still holds."""
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    limit = rl.limit("apikey:1000/m | apikey:5000/h", key="hot", apikey="k")
    decisions = [await limit.decide() for _ in range(40)]
    assert store.asked < 40
    last = decisions[-1]
    assert [state.rule.count for state in last.states] == [1000, 5000]
    assert last.states[0].remaining == last.remaining
    assert last.states[1].remaining == last.remaining + 4000
    assert all(0 < state.reset_after <= 3600 for state in last.states)
    await rl.aclose()


async def test_a_refusal_is_asked_again_once_leases_elsewhere_have_ended(
    clock: FakeClock,
) -> None:
    """Room held in another process's lease comes back within its hold: a refusal is kept
    in the denial cache for at most the hold, and reports the store's whole wait meanwhile."""
    store = Counting(clock)
    holder = RateLimit(store, "lease", lease=0.05)
    other = RateLimit(store, "lease", lease=0.05)
    hot = holder.limit("apikey:64/m", key="hot", apikey="k")
    for _ in range(16):
        assert (await hot.decide()).allowed  # slices taken: some of them not used yet
    taken = 64 - (await _counted(store, "apikey:64/m", "sliding-log", "lease") or 0) - 1
    limit = other.limit("apikey:64/m", key="hot", apikey="k")
    admitted = 0
    while (await limit.decide()).allowed:
        admitted += 1
    assert admitted == 64 - taken
    asked = store.asked
    clock.advance(0.01)
    cached = await limit.decide()
    assert not cached.allowed
    assert cached.retry_after > 59  # the store's wait, not the hold
    assert store.asked == asked  # answered by the denial cache
    clock.advance(0.05)  # the holder's lease ended: what it held is given back
    await holder.storage.give_back()  # type: ignore[attr-defined]
    assert (await limit.decide()).allowed  # asked again, and room was back
    assert store.asked == asked + 1
    await holder.storage.give_back()  # type: ignore[attr-defined]
    await other.aclose()


async def test_a_penalized_limit_under_leases_still_holds_back(clock: FakeClock) -> None:
    store = Counting(clock)
    rl = RateLimit(store, "lease", lease=0.05)
    limit = rl.limit("user:40/m", key="hot", user="u", penalty="user: 3 refusals/m for 10m")
    assert sum([(await limit.decide()).allowed for _ in range(40)]) == 40
    refusals = [await limit.decide() for _ in range(5)]
    assert not any(d.allowed for d in refusals)
    clock.advance(61)  # the window has passed, the hold has not
    held = await limit.decide()
    assert not held.allowed
    assert held.penalty == pytest.approx(600 - 61, abs=1)
    await rl.aclose()


class _DecidesOnly:
    """A store that decides and settles, and keeps nothing else."""

    def __init__(self) -> None:
        self.inner = MemoryBackend()

    async def decide(self, plan: Plan) -> Decision:
        return await self.inner.decide(plan)

    async def settle(self, settlement: Any) -> None:
        await self.inner.settle(settlement)


def test_a_leased_store_has_its_store_s_capabilities_in_its_class() -> None:
    """The store protocols' ``isinstance`` checks read attributes statically since Python
    3.12 (``inspect.getattr_static``: no ``__getattr__``): a leased store's class holds
    the store's methods, so it settles and keeps overrides and penalties as its store
    does, on every Python, and claims none its store lacks."""
    leased = LeasedBackend(MemoryBackend(), 0.05)
    for name in ("settle", "overrides_write", "penalty_left", "settle_now"):
        assert inspect.getattr_static(leased, name, None) is not None, name
    assert isinstance(leased, SettleStore)
    assert isinstance(leased, OverrideStore)
    assert isinstance(leased, PenaltyStore)
    bare = LeasedBackend(_DecidesOnly(), 0.05)  # type: ignore[arg-type]
    assert isinstance(bare, SettleStore)
    assert inspect.getattr_static(bare, "overrides_write", None) is None
    assert not isinstance(bare, OverrideStore)
    assert type(bare).__name__ == type(leased).__name__ == "LeasedBackend"


def test_shortcuts_look_through_a_leased_store() -> None:
    """A shortcut of two methods both the store's is the store's own (a subclass overriding
    ``settle`` alone keeps every settle on it); one whose general method the leases hold
    (``decide``) is none: every decision goes through the lease."""

    class CountsSettles(MemoryBackend):
        async def settle(self, settlement: Any) -> None:
            await super().settle(settlement)

    plain = LeasedBackend(MemoryBackend(), 0.05)
    assert shortcut(plain, "settle_now", "settle") is not None
    assert shortcut(plain, "decide_now", "decide") is None
    assert shortcut(plain, "decide_unless_held", "decide") is None
    assert shortcut(LeasedBackend(CountsSettles(), 0.05), "settle_now", "settle") is None


def test_a_subclass_of_the_leased_store_keeps_its_own_methods() -> None:
    """The class made per store class is made per leased class too: a subclass of
    ``LeasedBackend`` made after a plain one is itself (its ``decide``), and a plain one
    made after it is not."""

    class Counted(LeasedBackend):
        async def decide(self, plan: Plan) -> Decision:
            return await super().decide(plan)

    plain = LeasedBackend(MemoryBackend(), 0.05)
    counted = Counted(MemoryBackend(), 0.05)
    again = LeasedBackend(MemoryBackend(), 0.05)
    assert isinstance(counted, Counted)
    assert counted.hold == 0.05  # its __init__ ran
    assert not isinstance(plain, Counted)
    assert not isinstance(again, Counted)
