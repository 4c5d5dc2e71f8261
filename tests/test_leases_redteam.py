"""Red team of leases (``lease=``): probes that try to make a leased limit admit more calls
than its limit, or make the store count fewer calls than were admitted.

Every admission is timed here by the injected clock (calls in one batch share its time) and
checked against the promise of docs/leases.md: no fixed window admits more than the limit,
no span of a sliding log starting at any admission holds more than the limit. The tests
marked ``xfail(strict=True)`` are the limits docs/leases.md states (the sliding log needs
its give-back); the bugs this red team found (a reset racing a refill, a cancelled settle
of a leased call, leases never forgotten, ``limit(lease=)`` on ``sync_rate``) are fixed and
their probes pass; the others hold the promise where tests/test_leases.py does not look.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis

from ratelimit import (
    BackendError,
    ConfigurationError,
    MemoryBackend,
    RateLimit,
    RateLimitExceeded,
    RedisCommandBackend,
    RedisScriptBackend,
    SettleError,
)
from ratelimit.backends.leases import LeasedBackend, LeaseShare
from ratelimit.core.decision import Decision
from ratelimit.core.plan import PLANS, Plan
from ratelimit.core.settling import Settlement
from ratelimit.sync import RateLimit as SyncRateLimit
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(60)


# --- stores that fail, answer late, or hold an answer at a gate ---


async def _turns(n: int) -> None:
    """Let the event loop run ``n`` turns (a round trip's worth of other work)."""
    for _ in range(n):
        await asyncio.sleep(0)


class Gated(MemoryBackend):
    """``memory://`` whose answers to slices (decisions of more than one call) and whose
    settles can be held at a gate after the store decided (a reply in flight), and which
    fails on demand."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.slice_gate: asyncio.Event | None = None
        self.settle_gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.failing_decides = False
        self.failing_settles = False
        self.settles = 0

    async def decide(self, plan: Plan) -> Decision:
        if self.failing_decides:
            raise BackendError("the store is down (a test's)")
        decision = await super().decide(plan)
        gate = self.slice_gate
        if gate is not None and plan.cost > 1 and plan.record:
            self.entered.set()
            await gate.wait()  # decided and counted: the reply is on its way
        return decision

    async def settle(self, settlement: Settlement) -> None:
        gate = self.settle_gate
        if gate is not None:
            self.entered.set()
            await gate.wait()  # the write is on its way
        if self.failing_settles:
            raise BackendError("the store is down (a test's)")
        self.settles += 1
        await super().settle(settlement)


class GatedRedis(RedisScriptBackend):
    """The script engine (on fakeredis, or the client given) whose replies to slices can
    be held at a gate once Redis ran the slice's script."""

    def __init__(self, clock: FakeClock, client: Any = None) -> None:
        client = fakeredis.FakeAsyncRedis() if client is None else client
        super().__init__(client, clock=clock, owns_client=True)
        self.slice_gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def decide(self, plan: Plan) -> Decision:
        decision = await super().decide(plan)
        gate = self.slice_gate
        if gate is not None and plan.cost > 1 and plan.record:
            self.entered.set()
            await gate.wait()
        return decision


class Laggy(MemoryBackend):
    """``memory://`` whose every decision and settle takes a random few loop turns before
    and after the store acts (round trips of other lengths): calls of one process interleave
    with refills, give-backs and settles in every order."""

    def __init__(self, clock: FakeClock, rng: random.Random) -> None:
        super().__init__(clock=clock)
        self.rng = rng

    async def decide(self, plan: Plan) -> Decision:
        await _turns(self.rng.randrange(3))
        decision = await super().decide(plan)
        await _turns(self.rng.randrange(3))
        return decision

    async def settle(self, settlement: Settlement) -> None:
        await _turns(self.rng.randrange(3))
        await super().settle(settlement)
        await _turns(self.rng.randrange(3))


def _fake(clock: FakeClock, spread: bool = False) -> RedisScriptBackend:
    return RedisScriptBackend(
        fakeredis.FakeAsyncRedis(), clock=clock, owns_client=True, spread=spread or None
    )


def _store(kind: str, clock: FakeClock, rng: random.Random | None = None) -> Any:
    if kind == "memory":
        return MemoryBackend(clock=clock)
    if kind == "laggy":
        return Laggy(clock, rng or random.Random(0))
    if kind == "fakeredis-commands":
        return RedisCommandBackend(fakeredis.FakeAsyncRedis(), clock=clock, owns_client=True)
    return _fake(clock, spread=kind == "fakeredis-spread")


def _leased(rl: RateLimit) -> LeasedBackend:
    storage = rl.storage
    assert isinstance(storage, LeasedBackend)
    return storage


def _only_lease(rl: RateLimit) -> Any:
    """The one lease ``rl`` holds (private: ``LeasedBackend._leases``)."""
    leases = list(_leased(rl)._leases.values())
    assert len(leases) == 1
    return leases[0]


async def _given_back(*limiters: RateLimit) -> None:
    """Wait for the give-backs under way in ``limiters`` (tasks of their own)."""
    for rl in limiters:
        giving = list(_leased(rl)._giving)
        if giving:
            await asyncio.wait(giving)


def _fire_timers(*limiters: RateLimit) -> None:
    """What a lease's timer does on a limiter of the real clock (``LeasedBackend._expired``,
    armed only without an injected clock): end every lease past its hold."""
    for rl in limiters:
        storage = _leased(rl)
        now = storage._clock()
        for lease in storage._leases.values():
            if lease.reserved is not None and now >= lease.ends:
                storage._end(lease)


def _most_in_a_span(admitted: Iterable[tuple[float, float]], span: float) -> float:
    """The most cost admitted in any span of ``span`` seconds starting at an admission,
    of (time, cost) pairs."""
    ordered = sorted(admitted)
    most = 0.0
    for i, (start, _) in enumerate(ordered):
        inside = 0.0
        for at, cost in ordered[i:]:
            if at >= start + span - 1e-9:
                break
            inside += cost
        most = max(most, inside)
    return most


def _most_in_a_window(admitted: Iterable[tuple[float, float]], span: float) -> float:
    """The most cost admitted in one fixed window of ``span`` seconds (aligned as the
    stores align them: whole multiples of the span since the epoch)."""
    windows: defaultdict[int, float] = defaultdict(float)
    for at, cost in admitted:
        windows[math.floor(round(at * 1_000_000) / round(span * 1_000_000))] += cost
    return max(windows.values(), default=0.0)


async def _left(store: Any, namespace: str, rule: str, algorithm: str = "sliding-log") -> int:
    """What the store has left for ``rule`` of key ``hot``, apikey ``k`` (a peek of a
    limiter without leases: the count after a next call)."""
    plain = RateLimit(store, namespace, algorithm=algorithm)
    remaining = (await plain.limit(rule, key="hot", apikey="k").peek()).remaining
    assert remaining is not None
    return remaining


# --- the sliding log needs its give-back (docs/leases.md; xfail, strict) ---


@pytest.mark.xfail(
    strict=True,
    reason="stated in docs/leases.md: under an injected clock no timer ends a lease, so a "
    "sliding-log lease left idle is stamped again only at its next call or give_back; "
    "until then the calls it admitted late count from the slice's time, and once those "
    "stamps leave the span another process may be admitted up to that many more (a real "
    "clock's timer ends it after its hold)",
)
@pytest.mark.parametrize("kind", ["memory", "fakeredis"])
async def test_a_sliding_log_lease_left_idle_past_its_hold_is_not_counted_for_its_late_calls(
    kind: str, clock: FakeClock
) -> None:
    store = _store(kind, clock)
    namespace = f"rt-{uuid.uuid4().hex[:8]}"
    holder = RateLimit(store, namespace, lease=0.05)
    other = RateLimit(store, namespace)
    admitted = await _late_in_a_slice(holder, clock)
    clock.advance(0.965)  # the slice's stamps (t0) leave the span; its late calls do not
    await _another_process_within_a_span(holder, other, admitted, clock)


async def _late_in_a_slice(holder: RateLimit, clock: FakeClock) -> list[tuple[float, float]]:
    """``holder``'s calls of ``apikey:64/s``, (time, cost): 20 at t0 (slices of 1, 2, 4, 8;
    the last one partly used; those used up given back, so stamped again at t0), then,
    within the hold, the rest of the last slice."""
    hot = holder.limit("apikey:64/s", key="hot", apikey="k")
    admitted: list[tuple[float, float]] = []
    for _ in range(20):
        assert (await hot.decide()).allowed
        admitted.append((clock.now, 1))
    await _given_back(holder)
    lease = _only_lease(holder)
    assert lease.left >= 1
    clock.advance(0.04)
    while lease.left >= 1:
        assert (await hot.decide()).allowed
        admitted.append((clock.now, 1))
    return admitted


async def _another_process_within_a_span(
    holder: RateLimit, other: RateLimit, admitted: list[tuple[float, float]], clock: FakeClock
) -> None:
    """80 calls of another limiter on the same key, then: no span of a second admitted
    more than 64 (``admitted``, with them); both limiters closed."""
    limit = other.limit("apikey:64/s", key="hot", apikey="k")
    for _ in range(80):
        if (await limit.decide()).allowed:
            admitted.append((clock.now, 1))
    try:
        assert _most_in_a_span(admitted, 1.0) <= 64
    finally:
        await holder.aclose()
        await other.aclose()


@pytest.mark.xfail(
    strict=True,
    reason="stated in docs/leases.md: a sliding-log slice is stamped when taken and its "
    "calls again at the give-back; a give-back that fails (logged) leaves the calls "
    "admitted late counted from the slice's time, so the span after may admit up to that "
    "many more, once (so does a process that dies holding a lease); stamps placed at the "
    "hold's end instead would break the log's newest-first order, which decisions read "
    "by position",
)
async def test_a_failed_give_back_leaves_a_sliding_log_lease_counted_too_early(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = Gated(clock)
    holder = RateLimit(store, "rt", lease=0.05)
    other = RateLimit(store, "rt")
    admitted = await _late_in_a_slice(holder, clock)
    clock.advance(0.01)  # the hold is over: the lease is given back in time, and that fails
    store.failing_settles = True
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        await _leased(holder).give_back()
    assert "could not be given back" in caplog.text
    store.failing_settles = False  # healthy again
    clock.advance(0.955)
    await _another_process_within_a_span(holder, other, admitted, clock)


@pytest.mark.parametrize("algorithm", ["sliding-log", "fixed-window"])
@pytest.mark.parametrize(
    "kind", ["memory", "fakeredis", pytest.param("redis", marks=pytest.mark.redis)]
)
async def test_a_reset_during_a_refill_leaves_a_slice_the_store_forgot(
    kind: str, algorithm: str, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    store: Gated | GatedRedis
    if kind == "memory":
        store = Gated(clock)
    elif kind == "fakeredis":
        store = GatedRedis(clock)
    else:
        store = GatedRedis(clock, aioredis.Redis.from_url(request.getfixturevalue("redis_url")))
    namespace = f"rt-{uuid.uuid4().hex[:8]}"
    holder = RateLimit(store, namespace, algorithm=algorithm, lease=0.05)
    other = RateLimit(store, namespace, algorithm=algorithm)
    rule = "apikey:64/m"
    hot = holder.limit(rule, key="hot", apikey="k")
    for _ in range(7):  # slices of 1, 2, 4: used up, the next call takes a new one
        assert (await hot.decide()).allowed
    await _given_back(holder)
    lease = _only_lease(holder)
    assert lease.left == 0
    gate = store.slice_gate = asyncio.Event()
    taking = asyncio.ensure_future(hot.decide())
    try:
        await store.entered.wait()  # the store counted the slice; its reply is on its way
        await hot.reset()
    finally:
        store.slice_gate = None
        gate.set()
    assert (await taking).allowed  # decided before the reset: as a call alone would be
    clock.advance(0.001)  # what is reserved from now on is later than the reset's mark
    after = 0  # admitted after reset() returned: the store must count every one
    limit = other.limit(rule, key="hot", apikey="k")
    for _ in range(80):
        after += (await limit.decide()).allowed
    while lease.left >= 1:  # what this process holds of the slice the store forgot
        after += (await hot.decide()).allowed
    try:
        assert after <= 64
    finally:
        await holder.aclose()
        await other.aclose()


async def test_a_reset_racing_a_refill_on_fakeredis_leaves_a_slice_the_store_forgot(
    clock: FakeClock,
) -> None:
    algorithm = "fixed-window"  # no give-back of a slice used up to wait for first
    store = _fake(clock)
    namespace = f"rt-{uuid.uuid4().hex[:8]}"
    holder = RateLimit(store, namespace, algorithm=algorithm, lease=0.05)
    other = RateLimit(store, namespace, algorithm=algorithm)
    hot = holder.limit("apikey:64/m", key="hot", apikey="k")
    for _ in range(7):
        assert (await hot.decide()).allowed
    await _given_back(holder)
    lease = _only_lease(holder)
    assert lease.left == 0  # the next call takes a slice
    taken, _ = await asyncio.gather(hot.decide(), hot.reset())
    assert taken.allowed
    clock.advance(0.001)
    after = 0
    limit = other.limit("apikey:64/m", key="hot", apikey="k")
    for _ in range(80):
        after += (await limit.decide()).allowed
    while lease.left >= 1:
        after += (await hot.decide()).allowed
    try:
        assert after <= 64
    finally:
        await _leased(holder).give_back()
        await other.aclose()
        await holder.aclose()


SETTLE_STORES = [
    "memory-gated",
    "fakeredis-commands",
    pytest.param("redis-commands", marks=pytest.mark.redis),
]
"""Where a settle's write is on its way for a while: held at a gate; the command engine
taking its lock (on fakeredis and on a real Redis)."""


@pytest.mark.parametrize("kind", SETTLE_STORES)
async def test_a_cancelled_settle_of_a_leased_call_loses_its_excess(
    kind: str, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    assert not await _cancelled_excess_lost(kind, clock, request, lease=0.05)


@pytest.mark.parametrize("kind", SETTLE_STORES)
async def test_a_cancelled_settle_of_a_call_alone_still_writes_its_excess(
    kind: str, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """The control of the test above: without leases, the write goes on."""
    assert not await _cancelled_excess_lost(kind, clock, request, lease=0)


async def _cancelled_excess_lost(
    kind: str, clock: FakeClock, request: pytest.FixtureRequest, lease: float
) -> bool:
    """Whether the excess of a call settled at 101 (100 more) is lost when the settle's
    caller is cancelled while its write is on its way (``memory-gated``: held at a gate;
    the command engine: taking its lock), then settled again at the same cost."""
    store: Any
    if kind == "memory-gated":
        store = Gated(clock)
    elif kind == "fakeredis-commands":
        store = RedisCommandBackend(fakeredis.FakeAsyncRedis(), clock=clock, owns_client=True)
    else:
        client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
        store = RedisCommandBackend(client, clock=clock, owns_client=True)
    namespace = f"rt-{uuid.uuid4().hex[:8]}"
    rl = RateLimit(store, namespace, algorithm="fixed-window", lease=lease)
    limit = rl.limit("apikey:1000/m", key="hot", apikey="k")
    decisions = [await limit.decide() for _ in range(20)]
    assert all(d.allowed for d in decisions)
    gate = asyncio.Event()
    if isinstance(store, Gated):
        store.settle_gate = gate
    settling = asyncio.ensure_future(limit.settle(decisions[-1], 101))
    try:
        if isinstance(store, Gated):
            await store.entered.wait()
        else:
            await asyncio.sleep(0)  # the settle started: the engine takes its lock
        settling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settling
    finally:
        if isinstance(store, Gated):
            store.settle_gate = None
        gate.set()
    with contextlib.suppress(SettleError):  # a leased call's: "settled already"
        assert await limit.settle(decisions[-1], 101)  # what the write answered
    if lease:
        await _leased(rl).give_back()
    try:
        left = await _left(store, namespace, "apikey:1000/m", "fixed-window")
        return left != 1000 - 120 - 1
    finally:
        await rl.aclose()


async def test_leases_of_many_identifiers_are_bounded(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock), "rt", lease=0.05)
    for user in range(PLANS + 500):
        assert (await rl.limit("user:10/m", key="users", user=str(user)).decide()).allowed
    try:
        assert len(_leased(rl)._leases) <= PLANS
    finally:
        await rl.aclose()


async def test_lease_per_limit_on_a_sync_rate_limiter_is_refused() -> None:
    rl = RateLimit(fakeredis.FakeAsyncRedis(), "rt", sync_rate=1, algorithm="fixed-window")
    try:
        with pytest.raises(ConfigurationError, match="sync_rate"):
            rl.limit("apikey:64/m", key="hot", apikey="k", lease=0.05)
    finally:
        await rl.aclose()


# --- a random model check: several processes, refills, give-backs and settles interleaved ---

MODEL_RULES = {
    "one": "user:120/s",
    "or-identifiers": "user:100/s | 200/s",
    "or-spans": "user:80/s | user:600/m",
    "short": "user:20/100ms | user:150/s",
}
"""Trees a leased limit takes slices of: one rule; an ``|`` of a per-user rule and one all
users share (each user's lease takes slices of the shared rule); an ``|`` of two spans on
one identifier (a lease ends at the shorter window's end); a span so short that a hold of
50 ms is more than a quarter of it."""

STEPS = [0.0, 0.0, 0.0, 0.001, 0.004, 0.013, 0.03, 0.06, 0.11]
"""How far the clock moves between two batches of calls (seconds); rarely much further."""


class Admitted:
    """One admission: when, for which user, what it counts (its settled cost once settled)."""

    __slots__ = ("at", "cost", "decision", "limit", "user")

    def __init__(self, at: float, user: str, cost: float, decision: Decision, limit: Any) -> None:
        self.at = at
        self.user = user
        self.cost = cost
        self.decision = decision
        self.limit = limit


def _rules_of(rules: str) -> list[Any]:
    """The single rules of a tree's text."""
    from ratelimit.rules.tree import Rule, to_tree

    def leaves(node: Any) -> list[Any]:
        if isinstance(node, Rule):
            return [node]
        return [rule for child in node.children for rule in leaves(child)]

    return leaves(to_tree(rules))


def _check_promise(rules: str, algorithm: str, admitted: list[Admitted]) -> None:
    """No rule of ``rules`` admitted more than its count: per fixed window for the window
    counters, per span starting at any admission for the sliding log (per user for a rule
    with a selector, over all calls for a rule without)."""
    for rule in _rules_of(rules):
        groups: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
        for call in admitted:
            groups[call.user if rule.selector is not None else ""].append((call.at, call.cost))
        span = rule.span_ms / 1000
        for user, calls in groups.items():
            most = (
                _most_in_a_span(calls, span)
                if algorithm == "sliding-log"
                else _most_in_a_window(calls, span)
            )
            assert most <= rule.count + 1e-9, f"{rule} of user {user!r}: {most} admitted"


async def _model(
    kind: str,
    algorithm: str,
    rules: str,
    seed: int,
    steps: int = 90,
    timers: bool = True,
    costs: list[float] | None = None,
) -> tuple[int, int]:
    """Four processes (three leased, one per call) on one store, calling ``rules`` for
    three users at random costs for ``steps`` batches while the clock moves, settling
    some admitted calls later below their cost; the promise checked at the end. Returns
    (calls asked, calls admitted). ``timers``: leases past their hold end between
    batches, as their timers end them on a limiter of the real clock."""
    rng = random.Random(seed)
    clock = FakeClock(start=1_000_000.0 + rng.random())
    store = _store(kind, clock, rng)
    namespace = f"model-{uuid.uuid4().hex[:8]}"
    leased = [RateLimit(store, namespace, algorithm=algorithm, lease=h) for h in (0.05, 0.05, 0.2)]
    limiters = [*leased, RateLimit(store, namespace, algorithm=algorithm)]
    if costs is None:
        costs = [1, 1, 1, 1, 2, 3] if algorithm == "sliding-log" else [1, 1, 1, 2, 0.5, 2.5]
    admitted: list[Admitted] = []
    unsettled: list[Admitted] = []
    asked = 0

    async def call(rl: RateLimit, user: str, cost: float) -> None:
        limit = rl.limit(rules, key="hot", user=user, cost=cost)
        decision = await limit.decide()
        if decision.allowed:
            assert not decision.degraded
            made = Admitted(clock.now, user, cost, decision, limit)
            admitted.append(made)
            if rng.random() < 0.15:
                unsettled.append(made)

    try:
        for _ in range(steps):
            step = rng.choice(STEPS) if rng.random() > 0.03 else rng.choice([0.4, 1.3])
            clock.advance(step)
            if timers:
                _fire_timers(*leased)
            size = rng.randrange(1, 30) if rng.random() > 0.05 else 150  # now and then a burst
            batch = [
                call(rng.choice(limiters), rng.choice("abc"), rng.choice(costs))
                for _ in range(size)
            ]
            asked += len(batch)
            await asyncio.gather(*batch)
            while unsettled and rng.random() < 0.5:
                made = unsettled.pop(rng.randrange(len(unsettled)))
                actual = rng.choice([0, made.cost / 2 if algorithm != "sliding-log" else 1])
                assert await made.limit.settle(made.decision, actual)
                made.cost = min(made.cost, actual)
            await _turns(rng.randrange(4))
        _check_promise(rules, algorithm, admitted)
    finally:
        for rl in leased:  # every lease given back before the store they share closes
            await _leased(rl).give_back()
        for rl in limiters:
            await rl.aclose()
    return asked, len(admitted)


@pytest.mark.parametrize("rules", list(MODEL_RULES))
@pytest.mark.parametrize("algorithm", ["sliding-log", "fixed-window", "sliding-window"])
@pytest.mark.parametrize("kind", ["memory", "laggy", "fakeredis", "fakeredis-spread"])
async def test_random_processes_never_pass_the_limit(kind: str, algorithm: str, rules: str) -> None:
    seeds = range(2) if kind in ("memory", "laggy") else range(1)
    asked = admitted = 0
    for seed in seeds:
        calls, admissions = await _model(kind, algorithm, MODEL_RULES[rules], seed)
        asked, admitted = asked + calls, admitted + admissions
    assert asked > admitted > 0  # hammered past the limit, and something admitted


@pytest.mark.parametrize("algorithm", ["sliding-log", "fixed-window", "sliding-window"])
async def test_random_processes_on_the_command_engine(algorithm: str) -> None:
    """The same on the command engine (fakeredis), whose decisions and settles take its
    lock: two trees."""
    for rules in ("one", "or-identifiers"):
        await _model("fakeredis-commands", algorithm, MODEL_RULES[rules], 11, steps=60)


@pytest.mark.parametrize("algorithm", ["fixed-window", "sliding-window"])
@pytest.mark.parametrize("kind", ["memory", "laggy"])
async def test_fractional_costs_never_pass_a_window(kind: str, algorithm: str) -> None:
    """Costs that are no binary fractions (0.1, 0.3, 0.7, 0.01): what slices hold and
    give back is summed in floats, never past the limit."""
    for seed in range(2):
        for rules in ("one", "or-identifiers"):
            costs = [0.1, 0.3, 0.7, 0.01, 1.1]
            await _model(kind, algorithm, MODEL_RULES[rules], 200 + seed, costs=costs)


@pytest.mark.parametrize("algorithm", ["fixed-window", "sliding-window"])
@pytest.mark.parametrize("kind", ["memory", "laggy"])
async def test_window_counter_leases_need_no_timer(kind: str, algorithm: str) -> None:
    """The window counters end a lease at its window's end whenever it is given back:
    leases left idle past their hold (no timer under an injected clock) keep the promise."""
    for seed in range(2):
        for rules in MODEL_RULES.values():
            await _model(kind, algorithm, rules, 100 + seed, steps=60, timers=False)


# --- many coroutines of one process racing a refill; its caller cancelled ---


@pytest.mark.parametrize("how", ["cancel", "wait_for"])
@pytest.mark.parametrize("kind", ["memory", "fakeredis"])
async def test_the_caller_taking_a_slice_cancelled_mid_flight_leaves_no_waiter_hanging(
    kind: str, how: str, clock: FakeClock
) -> None:
    """The call taking a slice is cancelled while the store's reply is on its way: a
    coroutine waiting for that slice takes the refill over (no ``refilling`` left set),
    the slice the store counted is lost to this process (counted, never admitted: the
    store over-counts, never under), and the limit is never passed."""
    store: Gated | GatedRedis = Gated(clock) if kind == "memory" else GatedRedis(clock)
    rl = RateLimit(store, "rt", lease=0.05)
    hot = rl.limit("apikey:64/m", key="hot", apikey="k")
    admitted = 0
    for _ in range(7):
        admitted += (await hot.decide()).allowed
    await _given_back(rl)
    lease = _only_lease(rl)
    assert lease.left == 0
    gate = store.slice_gate = asyncio.Event()
    taking = asyncio.ensure_future(
        hot.decide() if how == "cancel" else asyncio.wait_for(hot.decide(), 0.01)
    )
    waiting: list[asyncio.Future[Decision]] = []
    try:
        await store.entered.wait()
        waiting = [asyncio.ensure_future(hot.decide()) for _ in range(6)]
        await _turns(2)
        assert lease.refilling is not None
        if how == "cancel":
            taking.cancel()
        with pytest.raises((asyncio.CancelledError, TimeoutError)):
            await taking  # wait_for: its deadline passes while the gate holds the reply
        await _turns(2)  # a waiter takes the refill over (held at the gate in turn)
    finally:
        store.slice_gate = None
        gate.set()
    admitted += sum(d.allowed for d in await asyncio.gather(*waiting))
    assert lease.refilling is None
    while (await hot.decide()).allowed:
        admitted += 1
    await _leased(rl).give_back()
    assert 64 - 8 <= admitted <= 64  # at most one slice (an eighth of what was left) lost
    assert await _left(store, "rt", "apikey:64/m") == 0  # never below what was admitted
    await rl.aclose()


@pytest.mark.parametrize("kind", ["laggy", "fakeredis"])
async def test_coroutines_of_varying_costs_racing_refills_admit_the_limit_exactly(
    kind: str, clock: FakeClock
) -> None:
    """Sixteen coroutines of one process, costs 1 to 4 by turns, every store call a few
    loop turns long: waiters of a slice in flight, slices ended early by a larger cost."""
    store = _store(kind, clock, random.Random(7))
    rl = RateLimit(store, "rt", algorithm="fixed-window", lease=0.05)
    spent = 0.0

    async def worker(n: int) -> None:
        nonlocal spent
        for i in range(40):
            cost = 1 + (n + i) % 4
            limit = rl.limit("apikey:1000/m", key="hot", apikey="k", cost=cost)
            if (await limit.decide()).allowed:
                spent += cost

    await asyncio.gather(*(worker(n) for n in range(16)))
    await _leased(rl).give_back()
    assert 1000 - 4 < spent <= 1000
    assert await _left(store, "rt", "apikey:1000/m", "fixed-window") == max(1000 - spent - 1, 0)
    await rl.aclose()


# --- reset, settle and count_when against leases ---


@pytest.mark.parametrize("algorithm", ["sliding-log", "fixed-window"])
async def test_a_reset_while_a_give_back_is_on_its_way_takes_nothing_counted_after_it(
    algorithm: str, clock: FakeClock
) -> None:
    """A give-back still on its way when the limit is reset lands after the reset: its
    refund must take nothing counted since (the store's reset marks), so every call
    admitted after the reset stays counted."""
    store = Gated(clock)
    holder = RateLimit(store, "rt", algorithm=algorithm, lease=0.05)
    other = RateLimit(store, "rt", algorithm=algorithm)
    hot = holder.limit("apikey:64/m", key="hot", apikey="k")
    for _ in range(10):  # the last slice partly used: its give-back refunds
        assert (await hot.decide()).allowed
    await _given_back(holder)
    assert _only_lease(holder).left >= 1
    clock.advance(0.06)  # the hold is over: the next call gives the slice back
    gate = store.settle_gate = asyncio.Event()
    taking = asyncio.ensure_future(hot.decide())
    resetting: asyncio.Future[None] | None = None
    try:
        await store.entered.wait()  # the give-back's write is on its way
        resetting = asyncio.ensure_future(hot.reset())
        await _turns(3)
    finally:
        store.settle_gate = None
        gate.set()
    await resetting
    await taking  # asked while the reset was under way: not counted below
    await _given_back(holder)
    clock.advance(0.001)
    after = 0
    limit = other.limit("apikey:64/m", key="hot", apikey="k")
    for _ in range(40):
        after += (await hot.decide()).allowed
        after += (await limit.decide()).allowed
    assert after <= 64
    await holder.aclose()
    await other.aclose()


@pytest.mark.parametrize("algorithm", ["sliding-log", "fixed-window", "sliding-window"])
async def test_refunds_never_give_a_lease_more_than_its_slice_holds(
    algorithm: str, clock: FakeClock
) -> None:
    """Calls admitted from slices of several generations settled to 0 in random order:
    a refund goes back to its own lease while it lasts, never to a later one, so a lease
    never holds more than what its slice has not admitted; settling again raises; and the
    calls that still count, with the calls admitted after, never pass the limit."""
    rng = random.Random(3)
    rl = RateLimit(MemoryBackend(clock=clock), "rt", algorithm=algorithm, lease=0.05)
    limit = rl.limit("apikey:64/m", key="hot", apikey="k")
    taken: list[Decision] = []
    counted = 0
    for _ in range(4):
        for _ in range(8):
            decision = await limit.decide()
            assert decision.allowed
            taken.append(decision)
        clock.advance(0.03)  # now and then past a hold: leases of other generations
    rng.shuffle(taken)
    lease = _only_lease(rl)
    back = late = 0
    for decision in taken:
        generation, before = lease.generation, lease.left
        held = lease.reserved
        reserved = decision._reservation
        assert reserved
        share = reserved[0] if isinstance(reserved[0], LeaseShare) else None
        assert await limit.settle(decision, 0)
        grew = lease.left - before
        ours = share is not None and share.generation == generation
        assert grew == (1 if ours and held is not None else 0)
        if held is not None:
            assert lease.left <= held._reservation[0].cost
        with pytest.raises(SettleError, match="settled already"):
            await limit.settle(decision, 0)
        counted += share is not None and not grew  # refunded too late: it stays counted
        back += bool(grew)
        late += share is not None and not grew
    assert back
    assert late
    while (await limit.decide()).allowed:
        counted += 1
    assert counted <= 64
    await rl.aclose()


async def test_settling_after_a_reset_takes_nothing_back_from_the_new_count(
    clock: FakeClock,
) -> None:
    rl = RateLimit(MemoryBackend(clock=clock), "rt", algorithm="fixed-window", lease=0.05)
    limit = rl.limit("apikey:64/m", key="hot", apikey="k")
    taken = [await limit.decide() for _ in range(20)]
    await limit.reset()
    clock.advance(0.001)
    after = [await limit.decide() for _ in range(10)]
    assert all(d.allowed for d in after)
    for decision in taken:
        assert await limit.settle(decision, 0)  # reserved before the reset: nothing back
    admitted = 10
    while (await limit.decide()).allowed:
        admitted += 1
    assert admitted == 64
    await rl.aclose()


@pytest.mark.parametrize("kind", ["memory", "fakeredis"])
async def test_count_when_and_settle_callables_on_a_leased_decorated_limit(
    kind: str, clock: FakeClock
) -> None:
    """A decorated limit of tokens, its cost a callable of the arguments and its settle a
    callable of the result (below the estimate), with count_when refunding the calls that
    raise: the tokens used by calls admitted in one window never pass the limit."""
    rng = random.Random(5)
    store = _store(kind, clock)
    rl = RateLimit(store, "rt", algorithm="fixed-window", lease=0.05)
    used: list[tuple[float, float]] = []

    @rl.limit(
        "user:2000 tokens/m",
        key="llm",
        cost=lambda user, estimate: {"tokens": estimate},
        settle=lambda result: {"tokens": result},
    )
    async def complete(user: str, estimate: int) -> int:
        actual = rng.randrange(estimate + 1)
        used.append((clock.now, actual))
        return actual

    @rl.limit("user:300/m", key="fails", count_when=lambda outcome: outcome is not None)
    async def flaky(user: str) -> int | None:
        if rng.random() < 0.5:
            raise ValueError("not counted")
        used_calls.append((clock.now, 1))
        return 1

    used_calls: list[tuple[float, float]] = []
    for _ in range(600):
        with contextlib.suppress(RateLimitExceeded):
            await complete("u", rng.choice([1, 5, 20]))
        with contextlib.suppress(RateLimitExceeded, ValueError):
            await flaky("u")
        if rng.random() < 0.05:
            clock.advance(0.03)
    assert _most_in_a_window(used, 60) <= 2000
    assert _most_in_a_window(used_calls, 60) <= 300
    await rl.aclose()


# --- overrides, the decorator's paths, the sync API, a limiter without the setting ---


@pytest.mark.parametrize("kind", ["memory", "fakeredis"])
async def test_overrides_changing_the_rules_while_leases_are_held(
    kind: str, clock: FakeClock
) -> None:
    """An override lowers the limit of a key whose lease holds room, then another lowers
    it below what was counted, then it goes back: the calls admitted in the window never
    pass the rules in force, by ``decide`` and by the decorated function alike."""
    store = _store(kind, clock)
    rl = RateLimit(store, "rt", lease=0.05, override_refresh=0)
    limit = rl.limit("apikey:200/m", key="hot", apikey="k")

    @rl.limit("apikey:200/m", key="hot")
    async def call(apikey: str) -> None:
        return None

    async def admitted(calls: int) -> int:
        made = 0
        for n in range(calls):
            if n % 2:
                made += (await limit.decide()).allowed
                continue
            with contextlib.suppress(RateLimitExceeded):
                await call("k")
                made += 1
        return made

    total = await admitted(40)
    assert total == 40
    assert _only_lease(rl).left >= 1  # room held under the old rules
    await rl.overrides.set("hot", "apikey:60/m", apikey="k")
    total += await admitted(100)
    assert total <= 60
    await rl.overrides.set("hot", "apikey:30/m", apikey="k")
    assert await admitted(50) == 0
    await rl.overrides.delete("hot", apikey="k")
    total += await admitted(300)
    assert total <= 200
    await _leased(rl).give_back()
    await rl.aclose()


@pytest.mark.parametrize("kind", ["memory", "fakeredis"])
async def test_the_fused_path_decide_and_async_with_share_one_lease_exactly(
    kind: str, clock: FakeClock
) -> None:
    """A decorated ``async def f(apikey)`` (the fused path on memory://, the direct path
    on Redis), ``limit.decide()`` and ``async with`` on one key take from one lease: the
    limit is admitted exactly, and the store counts what was admitted."""
    store = _store(kind, clock)
    rl = RateLimit(store, "rt", lease=0.05)

    @rl.limit("apikey:300/m", key="hot")
    async def call(apikey: str) -> None:
        return None

    limit = rl.limit("apikey:300/m", key="hot", apikey="k")
    admitted = refused = 0
    for n in range(500):
        try:
            if n % 3 == 0:
                await call("k")
            elif n % 3 == 1:
                async with rl.limit("apikey:300/m", key="hot", apikey="k"):
                    pass
            else:
                decision = await limit.decide()
                if not decision.allowed:
                    raise RuntimeError("refused")
            admitted += 1
        except (RateLimitExceeded, RuntimeError):
            refused += 1
    assert admitted == 300
    await _leased(rl).give_back()
    assert await _left(store, "rt", "apikey:300/m") == 0
    await rl.aclose()


async def test_limits_made_before_a_lease_per_limit_swapped_the_backend(
    clock: FakeClock,
) -> None:
    """A limiter without ``lease=`` gets leases from ``limit(..., lease=)``: limits made
    before (a decorated function on memory://'s own path, an ``async with`` limit) and
    after decide one key together, never past its limit."""
    store = MemoryBackend(clock=clock)
    rl = RateLimit(store, "rt")

    @rl.limit("apikey:200/m", key="hot")
    async def before(apikey: str) -> None:
        return None

    plain = rl.limit("apikey:200/m", key="hot", apikey="k")
    leased = rl.limit("apikey:200/m", key="hot", apikey="k", lease=0.05)

    @rl.limit("apikey:200/m", key="hot", lease=0.05)
    async def after(apikey: str) -> None:
        return None

    assert isinstance(rl.storage, LeasedBackend)
    admitted = 0
    refused_in_a_row = 0
    n = 0
    while refused_in_a_row < 8:
        n += 1
        try:
            if n % 4 == 0:
                await before("k")
            elif n % 4 == 1:
                await after("k")
            else:
                decision = await (plain if n % 4 == 2 else leased).decide()
                if not decision.allowed:
                    raise RuntimeError("refused")
            admitted += 1
            refused_in_a_row = 0
        except (RateLimitExceeded, RuntimeError):
            refused_in_a_row += 1
    assert admitted == 200
    await _leased(rl).give_back()
    assert await _left(store, "rt", "apikey:200/m") == 0
    await rl.aclose()


def test_the_sync_api_from_threads_with_leases_per_limit() -> None:
    """Eight threads on ``ratelimit.sync`` (a limiter with ``lease=`` and one limit of it
    per call, and a limit leased on a limiter without it): every limit admits exactly its
    count."""
    clock = FakeClock()
    leasing = SyncRateLimit.from_url("memory://", "rt", lease=0.05, clock=clock)
    plain = SyncRateLimit.from_url("memory://", "rt", clock=clock)
    counts: defaultdict[str, int] = defaultdict(int)
    lock = threading.Lock()
    limits = {
        "leased": leasing.limit("apikey:300/m", key="a", apikey="k"),
        "per-call": leasing.limit("apikey:300/m", key="a", apikey="k", lease=0),
        "leased-here": plain.limit("apikey:300/m", key="b", apikey="k", lease=0.05),
    }

    def worker(n: int) -> None:
        for i in range(120):
            name = ("leased", "per-call", "leased-here")[(n + i) % 3]
            if limits[name].decide().allowed:
                with lock:
                    counts["a" if name != "leased-here" else "b"] += 1

    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=50)
        assert counts == {"a": 300, "b": 300}
    finally:
        leasing.close()
        plain.close()


# --- the store failing mid-refill; clocks that step back ---


@pytest.mark.parametrize("on_error", ["allow", "deny", "local"])
async def test_the_store_failing_mid_refill_leaves_no_lease_stuck_nor_uncounted(
    on_error: str, clock: FakeClock
) -> None:
    """The store fails while a slice is asked for, and while slices are given back: the
    failure policy answers, no lease is left refilling, and once the store is back the
    calls it decided (not the policy's, marked degraded) never pass the limit."""
    store = Gated(clock)
    rl = RateLimit(store, "rt", algorithm="fixed-window", lease=0.05, on_error=on_error)
    limit = rl.limit("apikey:100/m", key="hot", apikey="k")
    counted = 0
    for _ in range(30):
        decision = await limit.decide()
        assert decision.allowed
        counted += not decision.degraded
    store.failing_decides = store.failing_settles = True
    for _ in range(50):
        decision = await limit.decide()
        counted += decision.allowed and not decision.degraded  # a lease held is spent
        await _turns(1)
    lease = _only_lease(rl)
    assert lease.refilling is None
    store.failing_decides = store.failing_settles = False
    await rl.ping(within=5)  # the store answers: the outage is over (as a probe finds)
    for _ in range(200):
        decision = await limit.decide()
        assert not decision.degraded
        counted += decision.allowed
    assert counted <= 100
    await rl.aclose()


@pytest.mark.parametrize("algorithm", ["sliding-log", "fixed-window", "sliding-window"])
async def test_a_clock_that_steps_back_within_a_window(algorithm: str) -> None:
    """The clock steps back 0.3 s and forward again, every admission within one window
    (fixed) or one span (sliding log) of the clock: the limit is never passed."""
    clock = FakeClock(start=1_000_000.1)
    store = MemoryBackend(clock=clock)
    rl = RateLimit(store, "rt", algorithm=algorithm, lease=0.05)
    limit = rl.limit("apikey:64/s", key="hot", apikey="k")
    admitted = 0
    for _ in range(20):
        admitted += (await limit.decide()).allowed
    clock.advance(0.4)
    for _ in range(10):
        admitted += (await limit.decide()).allowed
    clock.advance(-0.3)  # back
    await _turns(2)
    for _ in range(30):
        admitted += (await limit.decide()).allowed
        await _turns(1)
    clock.advance(0.6)  # 0.8 s after the first call
    for _ in range(80):
        admitted += (await limit.decide()).allowed
    assert admitted <= 64
    await rl.aclose()
