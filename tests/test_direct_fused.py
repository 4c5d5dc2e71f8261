"""Differential tests of the fused direct path (``ratelimit/front/fused.py``, the
``identified`` admissions of ``backends/memory/admit.py``): the same random calls decided
the fused way, the direct way without it, and the general way (``Limit._direct`` answering
nothing), with clock steps both ways, sweeps, overrides set and deleted mid-way, resets,
refusals held in the denial cache, shadow, another limit sharing the identifiers, a closed
limiter; the same answers, the same logs and arrival times, the same sweep count."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ratelimit import ConfigurationError, MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.backends.base import Admit
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, Plan
from ratelimit.front.limit import Limit
from ratelimit.rules.tree import to_tree
from tests.conftest import FakeClock

MODES = ("fused", "direct", "general")
RULES = ["user:3/m", "user:2/s", "user:4/10s", "user:1/m", "user:5/h"]
USERS: list[Any] = ["ann", "bob", "cy", "dee", "7", 7, "", None, b"7"]
STEPS = [0.1, 0.5, 1, 5, 30, 61, 3601, -0.5, -3, -61, 0.000001]


def decided_by(limit: Limit, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``limit`` deciding its decorated calls the ``mode`` way."""
    if mode == "fused":
        return
    made = limit._direct

    def paths(key: str, parameters: Any) -> Any:
        direct, admit, _ = made(key, parameters)
        return (direct, admit, None) if mode == "direct" else (None, None, None)

    monkeypatch.setattr(limit, "_direct", paths)
    choosing = limit._chooser

    def chooser(key: str, parameters: Any) -> Any:
        chosen = choosing(key, parameters)
        if chosen is None or mode == "general":
            return None
        chosen._paths = {value: (*made[:2], None) for value, made in chosen._paths.items()}
        return chosen

    monkeypatch.setattr(limit, "_chooser", chooser)


async def outcome(work: Any, *args: Any, **kwargs: Any) -> object:
    try:
        return await work(*args, **kwargs)
    except RateLimitExceeded as exc:
        decision = exc.decision
        return ("refused", type(decision).__name__, decision.rule, round(decision.retry_after, 6))
    except Exception as exc:  # a closed limiter, a value that names nothing
        return (type(exc).__name__, str(exc))


class Told:
    """A timed hook: every decision it was told, as what a hook can read of it."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def __call__(self, decision: Decision) -> None:
        raise AssertionError("a timed hook is called by its timed method")

    def timed(self, decision: Decision, seconds: float) -> None:
        assert seconds >= 0
        self.seen.append(
            (
                type(decision).__name__,
                decision.allowed,
                round(decision.retry_after, 6),
                decision.rule,
                decision.remaining,
                decision.key,
                decision.degraded,
                decision.shadow,
                decision.override,
                decision.penalty,
                tuple(s._replace(reset_after=round(s.reset_after, 6)) for s in decision.states),
            )
        )


def costing(user: Any, region: str = "eu") -> object:
    """A cost callable's answers: 1 to 3 by the user, 9 for "cy" (above most rules' count:
    never admitted), a bad answer for "dee" (the general path raises)."""
    if user == "dee" and region == "us":
        return "two"
    return 9 if user == "cy" else 1 + len(str(user)) % 3


SHAPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "cost": {"cost": costing},
    "cost 2": {"cost": 2},
    "settle": {"settle": lambda result: result},
    "count_when": {"count_when": lambda result: result != 2},
    "penalty": {"penalty": "3 refusals/m for 30s"},
    "penalty by user": {"penalty": "user: 2 refusals/10s for 5s"},
    "tiers": {},
}
"""What a limit adds to its rules, each decided on the direct path (but for ``plain``,
whole decisions) and the general one alike."""


async def scripted(
    seed: int,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
    told: Told | None = None,
    shape: str = "plain",
) -> tuple[Any, ...]:
    chance = random.Random(seed)
    clock = FakeClock()
    algorithm = chance.choice(["sliding-log", "gcra", "sliding-window", "fixed-window"])
    rules = chance.choice(RULES + (["user:2/s burst 4"] if algorithm == "gcra" else []))
    backend = MemoryBackend(clock=clock, sweep_every=chance.choice([1, 2, 5, 1024]))
    rl = RateLimit(backend, "fused", algorithm=algorithm, hooks=[] if told is None else [told])
    answered: list[object] = []  # each time the cost callable answered
    extra = dict(SHAPES[shape])
    if shape == "cost 2":  # a fixed cost above 1, where the rule's count allows it
        extra["cost"] = 2 if to_tree(rules).count >= 2 else 1  # type: ignore[union-attr]
    if extra.get("cost") is costing:

        def counted(*args: Any, **kwargs: Any) -> object:
            answered.append(costing(*args, **kwargs))
            return answered[-1]

        extra["cost"] = counted
    key: Any = "k"
    limited: Any = rules
    if shape == "tiers":  # rules by a keyword selector's value, resolved once per call
        key = "t"  # the other limits below count on "k": one key, one set of rules
        limited = {"free": rules, "pro": "user:9/m"}
        if seed % 2:
            limited["default"] = "user:2/m"
        chosen = iter(range(1 << 30))

        def tier() -> str:
            n = next(chosen)
            answered.append(n)
            return ["free", "pro", "gold", "free"][n % 4]

        extra["tier"] = tier
    limit = rl.limit(limited, key=key, shadow=chance.random() < 0.1, **extra)
    decided_by(limit, mode, monkeypatch)

    async def body(user: Any, region: str = "eu") -> int:
        return len(str(user)) % 3  # what settle= and count_when= read

    work = limit(body)
    paths = limit._direct(key, limit._bind(body)[1])
    if shape == "tiers":
        assert (limit._chooser(key, limit._bind(body)[1]) is None) is (mode == "general")
    elif mode == "fused":
        assert paths[2] is not None  # the path under test
    elif mode == "direct":  # with hooks too: they read whole decisions
        assert paths[0] is not None
    # another function counting on the same key: of the same rules, or of another span (a
    # second arrival time on the same identifier) or count (a rate to rescale from)
    # (another limiter on the store: one limiter keeps one set of rules per key)
    others = random.Random(-1 - seed).choice([rules, rules, "user:2/s", "user:7/m", "user:9/h"])
    beside = rl if others == rules else RateLimit(backend, "fused", algorithm=algorithm)
    counting = beside.limit(others, key="k")
    decided_by(counting, mode, monkeypatch)
    other = counting(body)
    peeking = rl.limit(rules, key="k", user="ann")
    seen: list[object] = []
    closed = False
    for _ in range(150):
        step = chance.random()
        if closed and 0.12 <= step < 0.26:
            continue  # the limiter's own doors raise once it is closed
        if step < 0.12:
            clock.advance(chance.choice(STEPS))
        elif step < 0.15:
            user = chance.choice(["ann", "bob", "7"])
            if chance.random() < 0.5:
                new = chance.choice(["user:1/m", "user:6/m", "user:1/s"])
                await rl.overrides.set(key, new, user=user)
            else:
                await rl.overrides.delete(key, user=user)
        elif step < 0.17:
            await peeking.reset()
        elif step < 0.19:
            peeked = await peeking.peek()
            seen.append(("peek", peeked.allowed, round(peeked.retry_after, 6)))
        elif step < 0.25:
            seen.append(("other", await outcome(other, chance.choice(USERS[:4]))))
        elif step < 0.26 and chance.random() < 0.2:
            await rl.aclose()
            closed = True
        else:
            user = chance.choice(USERS)
            form = chance.randrange(5)
            if form == 0:
                seen.append(await outcome(work, user, "us"))
            elif form == 1:
                seen.append(await outcome(work, user=user))
            else:
                seen.append(await outcome(work, user))
    if told is not None:
        seen.append(told.seen)
    seen.append(("answered", answered))  # once per call, whichever path decided it
    state = (
        backend.logs(),
        backend.arrivals(),
        {i: {k: round(v, 9) for k, v in c.items()} for i, c in backend.counters().items()},
        len(backend),
        backend._since_sweep,
        {k: tuple(v) for k, v in backend.__dict__.get("_penalties", ({}, {}))[0].items()},
        dict(backend.__dict__.get("_penalties", ({}, {}))[1]),
    )
    if not closed:
        await rl.aclose()
    if beside is not rl:
        await beside.aclose()
    return algorithm, rules, others, seen, state


@pytest.mark.parametrize("seed", range(0, 200, 10))
async def test_random_scripts_come_out_the_same_fused_direct_and_general(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for one in range(seed, seed + 10):
        fused, direct, general = [await scripted(one, mode, monkeypatch) for mode in MODES]
        assert fused == direct == general, f"seed {one}"


@pytest.mark.parametrize("seed", range(0, 100, 10))
async def test_hooks_are_told_the_same_decisions_direct_and_general(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limiter with hooks decides on the direct path by whole decisions (the fused one
    builds none): the hooks read what the general path tells them, field by field."""
    for one in range(seed, seed + 10):
        direct, general = [await scripted(one, mode, monkeypatch, Told()) for mode in MODES[1:]]
        assert direct == general, f"seed {one}"
        assert direct[3][-1], "the hook was told"


@pytest.mark.parametrize(
    "shape", ["cost", "cost 2", "settle", "count_when", "penalty", "penalty by user", "tiers"]
)
@pytest.mark.parametrize("seed", range(0, 60, 10))
async def test_costs_settles_and_count_when_come_out_the_same_direct_and_general(
    seed: int, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cost callable (answered once, whichever path decides: a cost never admitted and a
    bad answer go the general way with it), ``settle=`` and ``count_when=`` (whole
    decisions, refunded as the body ends), ``penalty=`` (a hold read without a coroutine, a
    refusal noted) decide on the direct path as on the general one, hooks or none."""
    for one in range(seed, seed + 10):
        told = [Told(), Told()] if one % 2 else [None, None]
        direct, general = [
            await scripted(one, mode, monkeypatch, hook, shape)
            for mode, hook in zip(MODES[1:], told, strict=True)
        ]
        assert direct == general, f"seed {one}"
        if shape == "tiers" and not one % 2:  # each entry's fused path, without hooks
            assert await scripted(one, "fused", monkeypatch, None, shape) == general


class Counting(MemoryBackend):
    """A memory store that counts the decisions it is asked for, by either entry: a
    subclass overriding ``admitter`` and ``decide``."""

    asked = 0

    async def decide(self, plan: Plan) -> Decision:
        self.asked += 1
        return await super().decide(plan)

    def admitter(self, compiled: CompiledTree, algorithm: Any) -> Admit:
        admit = super().admitter(compiled, algorithm)

        def counted(plan: Plan) -> Decision | None:
            self.asked += 1
            return admit(plan)

        return counted


@pytest.mark.parametrize("algorithm", ["sliding-log", "gcra", "sliding-window", "fixed-window"])
async def test_a_store_overriding_its_admitter_is_never_bypassed(algorithm: str) -> None:
    backend = Counting()
    rl = RateLimit(backend, "fused", algorithm=algorithm)
    limit = rl.limit("user:5/m")

    async def work(user: str) -> None: ...

    assert limit._direct("work", limit._bind(work)[1])[2] is None
    decorated = limit(work)
    for _ in range(3):
        await decorated("ann")
    assert backend.asked == 3
    plain = RateLimit(MemoryBackend(), "fused", algorithm=algorithm).limit("user:5/m")
    assert plain._direct("work", plain._bind(work)[1])[2] is not None


@pytest.mark.parametrize("algorithm", ["sliding-log", "gcra", "sliding-window", "fixed-window"])
async def test_only_one_positional_selector_of_cost_one_is_fused(algorithm: str) -> None:
    rl = RateLimit(MemoryBackend(), "fused", algorithm=algorithm)

    async def work(user: str, region: str = "eu") -> None: ...

    def fused(limit: Limit) -> bool:
        return limit._direct("work", limit._bind(work)[1])[2] is not None

    assert fused(rl.limit("user:5/m", key="a"))
    assert not fused(rl.limit("user:5/m", key="b", cost=2))
    assert not fused(rl.limit("user:5/m & region:9/m", key="c"))
    assert not fused(rl.limit("user:5/m", key="d", user="ann"))


async def kept_longer(mode: str, override: str, monkeypatch: pytest.MonkeyPatch) -> object:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    rl = RateLimit(backend, "fused")
    limit = rl.limit("user:3/m", key="k")
    decided_by(limit, mode, monkeypatch)

    async def body(user: str) -> int:
        return 1

    work = limit(body)
    seen = [await outcome(work, "ann")]
    await rl.overrides.set("k", override, user="ann")
    for _ in range(4):  # no refusal: one held in the denial cache would turn the fused path away
        seen.append(await outcome(work, "ann"))
        clock.advance(1)
    await rl.overrides.delete("k", user="ann")
    for step in (58.5, 0.5, 61, 0.5, 0.5, 0.5, 61, 3600):
        clock.advance(step)
        seen.append(await outcome(work, "ann"))
    state = backend.logs()
    await rl.aclose()
    return seen, state


@pytest.mark.parametrize(
    "override", ["user:6/h", "user:2/m & user:6/h", "user:1/s | user:6/h", "user:1/s | user:2/m"]
)
async def test_a_log_an_override_kept_longer_is_recorded_alike(
    override: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An override of more hits over a longer span leaves the log keeping more than the
    limit's own count (``Log.kept``), an ``|`` over its count more hits than it keeps: the
    fused path records as ``Log.record`` does."""
    fused, direct, general = [await kept_longer(m, override, monkeypatch) for m in MODES]
    assert fused == direct == general


@pytest.mark.parametrize("algorithm", ["sliding-log", "gcra"])
async def test_a_cost_answered_as_a_float_is_checked_apart_from_the_int(algorithm: str) -> None:
    """The direct path checks each number a cost callable answers once: ``2.0`` is not
    ``2`` there (whole costs refuse it, as the general path does), nor ``True``."""
    answers = iter([2, 2.0, True])
    rl = RateLimit(MemoryBackend(), "fused", algorithm=algorithm)

    @rl.limit("user:10/m", cost=lambda user: next(answers))
    async def work(user: str) -> None: ...

    await work("ann")
    for _ in range(2):
        with pytest.raises(ConfigurationError):
            await work("ann")


async def test_a_call_that_cannot_bind_calls_no_callable_of_the_limit() -> None:
    """As on the general path, arguments that do not bind raise the function's error
    before the cost or the tier callable runs."""
    called: list[str] = []

    def cost(user: str) -> int:
        called.append("cost")
        return 1

    def tier() -> str:
        called.append("tier")
        return "free"

    rl = RateLimit(MemoryBackend(), "fused")

    @rl.limit("user:5/m", key="c", cost=cost)
    async def priced(user: str) -> None: ...

    @rl.limit({"free": "user:5/m"}, key="t", tier=tier)
    async def tiered(user: str) -> None: ...

    for work in (priced, tiered):
        with pytest.raises(TypeError):
            await work()  # type: ignore[call-arg]
    assert called == []
    await priced("ann")
    await tiered("ann")
    assert called == ["cost", "tier"]  # once each, when the call binds
