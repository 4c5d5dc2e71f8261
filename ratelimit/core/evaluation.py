"""How the counts a backend read become a :class:`~ratelimit.core.decision.Decision`, so that
every backend computes ``allowed``, ``retry_after``, ``remaining``, the binding rule and the
per-rule states the same way (the memory backend's direct-path admissions,
``backends/memory/admit.py``, decide an admission inline and come here for a refusal).

The storage scripts (``sliding_log.lua``, ``window_counters.lua``, ``gcra.lua``) and
Postgres's ``ratelimit_decide`` compute the same "limited" flag per leaf and walk the same
prefix program; ``tests/test_differential.py`` holds them together. That is why
:func:`stored_verdict` may take a script's verdict as it is, without deciding again. Where
the two disagree all the same (a bug in one twin), the store's verdict stands (it recorded
what it decided) and the disagreement is logged, once per limit, with both answers.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from ratelimit.algorithms import Outcome
from ratelimit.core.decision import Decision, RuleState, make_decision
from ratelimit.core.plan import OP_AND, OP_LEAF, OP_OR, CompiledTree, Plan

T = TypeVar("T")

logger = logging.getLogger("ratelimit")

_DISAGREED: set[tuple[str, str]] = set()
"""The limits (namespace, key) whose store and evaluator disagreed, logged once each."""
MAX_DISAGREED = 1000


def _leaf(plan: Plan, i: int, now_us: int, counts: Sequence[tuple[float, float]]) -> Outcome:
    """The outcome of leaf ``i`` under the plan's algorithm, as the tree compares them.

    When the plan's identifiers count different costs (:attr:`Plan.costs`), what is left is
    shifted by ``plan.cost - cost``, so that comparing leaves (the tree's binding rule) and
    subtracting ``plan.cost`` (:func:`decided`) both read what is left after the leaf's own
    cost."""
    if plan.leaf_identifiers[i] < 0:
        return (False, 0, None, None)
    if not plan.costs:
        return _outcome(plan, i, plan.cost, now_us, counts)
    cost = plan.leaf_cost(i)
    outcome = _outcome(plan, i, cost, now_us, counts)
    limited, retry_us, left, binding = outcome
    if limited or left is None:
        return outcome
    return (limited, retry_us, left - cost + plan.cost, binding)


def _outcome(
    plan: Plan, i: int, cost: float, now_us: int, counts: Sequence[tuple[float, float]]
) -> Outcome:
    """Leaf ``i``'s outcome for a call of ``cost`` under the plan's algorithm."""
    return plan.algorithm.outcome(plan.compiled.rules[i], i, cost, counts[i], now_us)


def evaluate(plan: Plan, now_us: int, counts: Sequence[tuple[float, float]]) -> Decision:
    """Turn per-leaf counts into the decision for the whole tree.

    ``counts[i]`` is what storage counted for leaf ``i``, read by the plan's algorithm: for
    the sliding log (hits among the newest ``plan.depth(rule)``, the last of them when all
    are inside the window); for the window counters (current count, previous count); for
    GCRA (the rule's arrival time: whole microseconds and remainder in ``1/count`` of one,
    ``(0, 0)`` when none is stored).
    """
    if len(plan.compiled.rules) == 1:  # the common single rule: no tree to walk
        return decided(plan, _leaf(plan, 0, now_us, counts), now_us, counts)
    return decided(plan, _root(plan, now_us, counts), now_us, counts)


def stored_verdict(
    plan: Plan,
    allowed: bool,
    now_us: int,
    counts: Sequence[tuple[float, float]],
    report: bool = True,
) -> Decision:
    """The decision of a store that decided already (a script answered ``allowed`` and
    the counts it read): its verdict stands, and the counts give the rest (``retry_after``,
    ``remaining``, the binding rule; the states when first read), as :func:`evaluate`
    would. The store and :func:`evaluate` agree by construction and by
    ``tests/test_differential.py``, so nothing is decided twice; where the counts read
    otherwise all the same, the store's verdict stands with nothing left (``remaining``
    0, or ``retry_after`` 0.0), and the disagreement is logged (:func:`disagreed`) when
    ``report`` (not for a verdict by parts, whose counts were read at several instants)."""
    rules = plan.compiled.rules
    if len(rules) == 1 and not plan.costs:  # the common single rule: one outcome
        if plan.leaf_identifiers[0] < 0:
            outcome: Outcome = (False, 0, None, None)
        else:
            outcome = plan.algorithm.outcome(rules[0], 0, plan.cost, counts[0], now_us)
    else:
        outcome = _root(plan, now_us, counts)
    if outcome[0] == allowed:  # the counts read otherwise (a bug in one twin): nothing left
        if report:
            disagreed(plan, allowed, counts)
        outcome = (not allowed, 0, plan.cost if allowed else None, outcome[3])
    return decided(plan, outcome, now_us, counts, not allowed)


def disagreed(plan: Plan, allowed: bool, counts: Sequence[tuple[float, float]]) -> None:
    """Log, once per limit, that the store's verdict (``allowed``) and this module's reading
    of the ``counts`` it answered disagree: one of the twins has a bug. The call is
    decided by the store's verdict, which the store has recorded."""
    limit = (plan.namespace, plan.key)
    if limit in _DISAGREED or len(_DISAGREED) >= MAX_DISAGREED:
        return
    _DISAGREED.add(limit)
    logger.error(
        "ratelimit: the store %s a call of key %r that its counts say to %s (rules %s, "
        "algorithm %s, counts %s); decided by the store's verdict. The store and the "
        "evaluator disagree: please report this as a bug",
        "admitted" if allowed else "refused",
        plan.key,
        "refuse" if allowed else "admit",
        str(plan.compiled.tree),
        plan.algorithm.name,
        list(counts),
    )


def _root(plan: Plan, now_us: int, counts: Sequence[tuple[float, float]]) -> Outcome:
    """The outcome of the plan's whole tree: its leaves' outcomes walked through its
    And/Or program (the binding rule, how long it holds or how much it leaves)."""
    rules = plan.compiled.rules
    if len(rules) == 1:  # the common single rule: no tree to walk
        return _leaf(plan, 0, now_us, counts)

    def node(pos: int) -> tuple[Outcome, int]:
        op, operand = plan.compiled.program[pos], plan.compiled.program[pos + 1]
        pos += 2
        if op == OP_LEAF:
            return _leaf(plan, operand, now_us, counts), pos
        children: list[Outcome] = []
        for _ in range(operand):
            child, pos = node(pos)
            children.append(child)
        limited = [c for c in children if c[0]]
        if op == OP_OR and limited:
            return max(limited, key=lambda c: c[1]), pos
        if op == OP_AND and len(limited) == len(children):
            return min(limited, key=lambda c: c[1]), pos
        open_children = [c for c in children if not c[0]]
        bounded = [c for c in open_children if c[2] is not None]
        if not bounded or (op == OP_AND and len(bounded) < len(open_children)):
            return (False, 0, None, None), pos
        pick = min if op == OP_OR else max
        return pick(bounded, key=lambda c: c[2]), pos  # type: ignore[arg-type, return-value]

    return node(0)[0]


def decided(
    plan: Plan,
    outcome: Outcome,
    now_us: int,
    counts: Sequence[tuple[float, float]],
    limited: bool | None = None,
) -> Decision:
    """The decision of the whole tree from its root's outcome, its per-rule states computed
    from the same counts when first read (``counts`` must not change afterwards).
    ``limited``: the verdict, when a store gave it (else the outcome's own)."""
    if limited is None:
        limited = outcome[0]
    _, retry_us, remaining, binding = outcome
    rule = plan.compiled.rules[binding] if binding is not None else None
    states = _partial(rule_states, plan, now_us, counts, not limited)
    if limited:
        return make_decision(False, max(retry_us, 0) / 1_000_000, rule, 0, plan.key, states)
    left = None if remaining is None else math.floor(remaining - plan.cost)
    reserved = [plan, now_us, counts] if plan.record else None  # what a settle reads
    return make_decision(True, 0.0, rule, left, plan.key, states, reserved)


_partial = functools.partial


def rule_states(
    plan: Plan, now_us: int, counts: Sequence[tuple[float, float]], allowed: bool
) -> tuple[RuleState, ...]:
    """Per rule that applied: what it has left after the decision (after the call's cost
    when ``allowed``) and for how long (see :class:`~ratelimit.core.decision.RuleState`)."""
    states = []
    for i, rule in enumerate(plan.compiled.rules):
        if plan.leaf_identifiers[i] < 0:
            continue
        cost = plan.leaf_cost(i)
        used = cost if allowed else 0
        limited, retry_us, left, _ = _outcome(plan, i, cost, now_us, counts)
        if limited:
            states.append(RuleState(rule, i, True, 0, max(retry_us, 0) / 1_000_000))
            continue
        assert left is not None  # an applied rule that admits has a count
        remaining = max(math.floor(left - used), 0)
        reset_us = plan.algorithm.reset_us(rule, counts[i], now_us, used, remaining)
        states.append(RuleState(rule, i, False, remaining, max(reset_us, 0) / 1_000_000))
    return tuple(states)


def leaf_limited(plan: Plan, leaf: int, now_us: int, counts: Sequence[tuple[float, float]]) -> bool:
    """Whether leaf ``leaf`` of ``plan`` is limited by the counts read for it."""
    return _leaf(plan, leaf, now_us, counts)[0]


def tree_wait(compiled: CompiledTree, wait: Callable[[int], float]) -> float:
    """Seconds until ``compiled`` admits, its leaf ``i`` refusing for ``wait(i)`` more
    seconds (0: it admits now): an ``Or`` admits once every child does, an ``And`` once one
    does. For a part of a decided tree, as :func:`tree_limited`."""
    return float(_folded(compiled, wait, max, min))


def tree_limited(compiled: CompiledTree, limited: Callable[[int], bool]) -> bool:
    """Whether ``compiled`` refuses when the leaves for which ``limited(i)`` is true refuse
    and the others admit: the And/Or walk of :func:`evaluate` on flags alone (an ``Or``
    refuses when a child does, an ``And`` when all do). For a part of a decided tree, such
    as one descriptor's rules among a request's."""
    return _folded(compiled, limited, any, all)


def _folded(
    compiled: CompiledTree,
    leaf: Callable[[int], T],
    either: Callable[[list[T]], T],
    both: Callable[[list[T]], T],
) -> T:
    """``compiled``'s And/Or program folded: each leaf's ``leaf(i)``, an ``Or``'s children
    by ``either``, an ``And``'s by ``both``."""

    def node(pos: int) -> tuple[T, int]:
        op, operand = compiled.program[pos], compiled.program[pos + 1]
        pos += 2
        if op == OP_LEAF:
            return leaf(operand), pos
        children = []
        for _ in range(operand):
            child, pos = node(pos)
            children.append(child)
        return (either(children) if op == OP_OR else both(children)), pos

    return node(0)[0]
