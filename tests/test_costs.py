"""Rules of one call that count different costs (the service's descriptors, each with its
own ``hits_addend``) are decided in one atomic step: a refused call counts on none of them,
an admitted one counts each identifier's own cost. Every backend and algorithm alike."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.algorithms import ALGORITHMS
from ratelimit.core.checks import check_cost
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, Cost, cached_plan, compile_tree
from ratelimit.rules.tree import to_tree
from tests.conftest import BackendFactory, FakeClock, seeds, supporting

ALGORITHM = pytest.mark.parametrize("algorithm", ALGORITHMS)


Call = tuple[CompiledTree, tuple[str | None, ...], Cost]


def call(
    rl: RateLimit, rules: str, values: tuple[str | None, ...], cost: Cost, pinned: bool = False
) -> Call:
    compiled = compile_tree(to_tree(rules), pinned)
    rl.check(compiled, cost)
    return compiled, values, cost


async def decide(rl: RateLimit, call: Call) -> Decision:
    compiled, values, cost = call
    return await rl.decide(compiled, "costs", values, cost=cost)


@ALGORITHM
async def test_a_refused_call_counts_on_no_rule_whatever_its_costs(
    make_backend: BackendFactory, algorithm: str, clock: FakeClock
) -> None:
    rl = RateLimit(
        supporting(make_backend(clock), algorithm),
        f"costs-{uuid.uuid4().hex[:8]}",
        algorithm=algorithm,
    )
    both = call(rl, "a:5/h | b:2/h", ("x", "y"), (1, 2))  # a counts 1, b counts 2
    first = await decide(rl, both)
    assert first.allowed
    assert [(s.rule.selector, s.remaining) for s in first.states] == [("a", 4), ("b", 0)]
    for _ in range(3):  # refused by b each time: a must not count them
        refused = await decide(rl, both)
        assert not refused.allowed
        assert refused.rule is not None
        assert refused.rule.selector == "b"
        assert [(s.rule.selector, s.remaining) for s in refused.states] == [("a", 4), ("b", 0)]
    # a tree of one selector alone counts on the same counter, on a store that spreads too
    # (the layout is the identifier's, whatever the tree)
    a_alone = call(rl, "a:5/h", ("x",), 1)
    admitted = [(await decide(rl, a_alone)).allowed for _ in range(5)]
    assert admitted == [True, True, True, True, False]  # 4 left: one counted, not four
    await rl.aclose()


@ALGORITHM
async def test_rules_on_one_identifier_count_the_largest_cost_once(
    make_backend: BackendFactory, algorithm: str, clock: FakeClock
) -> None:
    rl = RateLimit(
        supporting(make_backend(clock), algorithm),
        f"costs-{uuid.uuid4().hex[:8]}",
        algorithm=algorithm,
    )
    tree = "a:10/h | a:20/2h | b:10/h"
    decision = await decide(rl, call(rl, tree, ("x", "y"), (3, 1, 2)))
    assert decision.allowed
    remaining = [(str(s.rule), s.remaining) for s in decision.states]
    assert remaining == [("a:10/h", 7), ("a:20/2h", 17), ("b:10/h", 8)]
    assert decision.remaining == 7  # the tightest after its own cost
    await rl.aclose()


async def test_the_binding_rule_is_the_one_with_least_left_after_its_cost(
    make_backend: BackendFactory, clock: FakeClock
) -> None:
    rl = RateLimit(make_backend(clock), f"costs-{uuid.uuid4().hex[:8]}")
    # a has 3 left before the call and 2 after; b has 5 before and 0 after
    for _ in range(2):
        await decide(rl, call(rl, "a:5/h", ("x",), 1))
    decision = await decide(rl, call(rl, "a:5/h | b:5/h", ("x", "y"), (1, 5)))
    assert decision.allowed
    assert decision.remaining == 0
    assert decision.rule is not None
    assert decision.rule.selector == "b"
    await rl.aclose()


def test_costs_per_leaf_are_checked_per_rule() -> None:
    compiled = compile_tree(to_tree("a:5/h | b:2/h"))
    check_cost(compiled, (5, 2), "sliding-log")
    with pytest.raises(Exception, match=r"cost 3 is above the count of rule 'b:2/h'"):
        check_cost(compiled, (1, 3), "sliding-log")
    with pytest.raises(Exception, match="one cost per rule"):
        check_cost(compiled, (1, 1, 1), "sliding-log")
    with pytest.raises(Exception, match="whole number"):
        check_cost(compiled, (1, 1.5), "gcra")


def test_equal_costs_give_the_plan_of_one_cost() -> None:
    compiled = compile_tree(to_tree("a:5/h | b:2/h"))
    one = cached_plan(compiled, "ns", "k", ("x", "y"), 2, "sliding-log")
    same = cached_plan(compiled, "ns", "k", ("x", "y"), (2, 2), "sliding-log")
    assert same.costs == ()
    assert same.cost == one.cost == 2
    differ = cached_plan(compiled, "ns", "k", ("x", "y"), (1, 2), "sliding-log")
    assert differ.costs == (1, 2)
    assert differ.identifiers == one.identifiers
    unresolved = cached_plan(compiled, "ns", "k", ("x", None), (1, 2), "sliding-log")
    assert unresolved.costs == ()  # b's rule does not apply: a alone counts, at 1
    assert unresolved.cost == 2
    assert unresolved.leaf_cost(0) == 2


# every identifier also has a rule of 10 s, so that no store drops a log or counter before
# another rule of it is done with it (Redis expires keys on its own clock, not the trace's)
TREES = [
    "a:4/s | b:3/s | 50/10s | a:90/10s & b:90/10s",
    "(a:5/s & b:3/s) | a:9/2s | 40/10s | a:80/10s & b:80/10s",
]


async def trace(rl: RateLimit, clock: FakeClock, seed: int) -> list[Decision]:
    rng = random.Random(seed)
    decisions = []
    for _ in range(150):
        clock.advance(rng.choice([0.0, 0.01, 0.1, 0.4, 1.1]))
        rules = rng.choice(TREES)
        leaves = len(compile_tree(to_tree(rules)).rules)
        costs = tuple(rng.choice([1, 2, 3]) for _ in range(leaves))
        values = (rng.choice(["u1", "u2", None]), rng.choice(["v1", "v2"]))
        decisions.append(await decide(rl, call(rl, rules, values, costs)))
    return decisions


@ALGORITHM
@pytest.mark.parametrize("seed", seeds(2, 1))
async def test_every_backend_decides_costs_as_memory_does(
    make_backend: BackendFactory, algorithm: str, seed: int
) -> None:
    from ratelimit import MemoryBackend

    mine, reference = FakeClock(), FakeClock()
    rl = RateLimit(
        supporting(make_backend(mine), algorithm),
        f"costs-{uuid.uuid4().hex[:8]}",
        algorithm=algorithm,
    )
    ref = RateLimit(MemoryBackend(clock=reference), "costs", algorithm=algorithm)
    got, want = await trace(rl, mine, seed), await trace(ref, reference, seed)
    assert 0 < sum(d.allowed for d in want) < len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"step {step}"
        assert g.states == w.states, f"step {step}"
    await rl.aclose()
    await ref.aclose()


@pytest.mark.postgres
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["sliding-window", "fixed-window"])
async def test_postgres_decides_costs_as_memory_does(postgres_url: str, algorithm: str) -> None:
    from ratelimit import MemoryBackend
    from ratelimit.backends.postgres import PostgresBackend

    mine, reference = FakeClock(), FakeClock()
    namespace = f"costs-{uuid.uuid4().hex[:8]}"
    backend = PostgresBackend(postgres_url, clock=mine, timeout=10)
    rl = RateLimit(backend, namespace, algorithm=algorithm)
    ref = RateLimit(MemoryBackend(clock=reference), namespace, algorithm=algorithm)
    both = call(rl, "a:5/h | b:2/h", ("x", "y"), (1, 2))
    assert (await decide(rl, both)).allowed
    for _ in range(2):  # refused by b: a counts neither
        assert not (await decide(rl, both)).allowed
    # a tree of one selector alone counts on the same counter, on a store that spreads too
    # (the layout is the identifier's, whatever the tree)
    a_alone = call(rl, "a:5/h", ("x",), 1)
    admitted = [(await decide(rl, a_alone)).allowed for _ in range(5)]
    assert admitted == [True, True, True, True, False]
    got, want = await trace(rl, mine, 0), await trace(ref, reference, 0)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"step {step}"
        assert g.states == w.states, f"step {step}"
    await rl.aclose()
    await ref.aclose()


async def test_a_decorated_call_awaits_what_its_cost_callable_returns_once() -> None:
    """A cost callable that is a coroutine function, or returns an awaitable, is awaited
    once per decorated call (the direct path calls it without a coroutine of its own)."""
    rl = RateLimit(MemoryBackend())
    asked: list[str] = []

    async def price(user: str) -> int:
        asked.append(user)
        return 3

    def later(user: str) -> Any:
        return price(user)

    for n, cost in enumerate((price, later)):

        @rl.limit("user:10/m", key=f"k{n}", cost=cost)
        async def work(user: str) -> str:
            return user

        asked.clear()
        for _ in range(3):
            assert await work("u") == "u"
        with pytest.raises(RateLimitExceeded) as refused:
            await work("u")  # 9 counted: 3 more is past 10
        assert refused.value.decision.remaining == 0
        assert asked == ["u"] * 4
    await rl.aclose()
