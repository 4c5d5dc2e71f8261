"""Calls an override lowered below their cost: the override's rules refuse them here,
without asking the store (DESIGN §9: "a limit lowered below a call's cost refuses it").

A call of cost 10 under an override ``apikey:5/h`` can never be admitted, however little
is counted; the stores' evaluators (Lua, SQL, Python) take only costs a rule can admit at
once, so such a call is never sent to them. Its refusal names the rule, with what is left
(0) and a ``retry_after`` of that rule's span (the call is refused until the override
changes or expires).

Under ``&`` too: an override ``user:2/h & user:20/h`` refuses calls of cost 5 although
``&`` alone would leave ``20/h`` to decide. A rule that can never admit the call is taken
as the operator's word that such calls stop (the service answers alike); refusing sooner
never admits more than any rule of the override allows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TypeAlias

from ratelimit.algorithms import Algorithm, named
from ratelimit.algorithms.gcra import gcra_burst
from ratelimit.core.checks import check_cost
from ratelimit.core.costs import CostValue, per_leaf
from ratelimit.core.decision import Decision, NeverAdmitted, RuleState, make_decision
from ratelimit.core.plan import CompiledTree, Cost, cached_plan
from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import Rule

logger = logging.getLogger("ratelimit")


@dataclass(frozen=True, slots=True)
class Never:
    """A call whose cost its own rules can never admit: ``rule`` the first that cannot,
    ``why`` what to tell the caller. Given as ``override=``, it refuses the call without
    asking the store (:class:`~ratelimit.core.decision.NeverAdmitted`)."""

    rule: Rule
    why: str


Overriding: TypeAlias = "bool | Rule | Never"
"""How a call's rules stand (``override=`` of ``decide``): ``False``, the limit's own;
``True``, an override's; a :class:`~ratelimit.rules.tree.Rule`, an override's that can never
admit the call's cost (refused); :class:`Never`, the limit's own that never can (refused)."""


def beyond(
    compiled: CompiledTree,
    namespace: str,
    key: str,
    values: tuple[str | None, ...],
    cost: Cost,
    algorithm: Algorithm | str,
) -> Rule | None:
    """The first rule of ``compiled`` that refuses a call of ``cost`` however little is
    counted (its count, or under GCRA its burst, below the call's cost on it), whatever
    the tree joining it (see the module's docstring); ``None`` when every rule could."""
    chosen = named(algorithm)
    plan = cached_plan(compiled, namespace, key, values, cost, chosen, False)
    for leaf, rule in enumerate(compiled.rules):
        if plan.leaf_identifiers[leaf] < 0:  # its selector did not resolve: counts nothing
            continue
        try:
            chosen.check_rule(rule, plan.leaf_cost(leaf))
            chosen.check_cost(plan.leaf_cost(leaf))
        except ConfigurationError:
            return rule
    return None


def never(
    compiled: CompiledTree,
    namespace: str,
    key: str,
    values: tuple[str | None, ...],
    value: CostValue,
    algorithm: Algorithm | str,
) -> tuple[Cost, Never] | None:
    """For a call whose cost ``value`` (chosen per call: by a ``cost=`` callable, a
    request, ``decide(cost=...)``) failed its check against its own rules ``compiled``:
    the cost as the plan takes it and the :class:`Never` that refuses it, when some rule
    can never admit it; ``None`` when the cost is wrong for another reason (a fraction
    under the sliding log, a unit no rule counts: then the check's error stands)."""
    chosen = named(algorithm)
    try:
        counted = per_leaf(compiled, value, chosen, "cost", bounded=False)
    except ConfigurationError:
        return None
    rule = beyond(compiled, namespace, key, values, counted, chosen)
    if rule is None:
        return None
    plan = cached_plan(compiled, namespace, key, values, counted, chosen, False)
    leaf_cost = plan.leaf_cost(compiled.rules.index(rule))
    quota = gcra_burst(rule) if chosen.bursts else rule.count
    limit = quota if leaf_cost > quota else None
    if limit is not None:
        why = f"its cost ({leaf_cost:g}) is more than rule '{rule}' admits at once ({limit})"
    else:
        why = f"its cost ({leaf_cost:g}) is more than this limiter counts in one call"
        if key not in _WARNED:  # the rule would admit it: the operator's choice refuses it
            _WARNED.add(key)
            try:
                chosen.check_cost(leaf_cost)
            except ConfigurationError as exc:
                logger.warning(
                    "ratelimit: key %r refuses calls of its rule '%s': %s", key, rule, exc
                )
    return counted, Never(rule, why)


_WARNED: set[str] = set()
"""Keys whose calls were refused for a cost their algorithm cannot count at once (warned)."""


def refusing(
    compiled: CompiledTree,
    namespace: str,
    key: str,
    values: tuple[str | None, ...],
    cost: Cost,
    algorithm: Algorithm | str,
) -> Rule:
    """:func:`beyond`'s rule; the cost's own ``ConfigurationError`` when none is."""
    rule = beyond(compiled, namespace, key, values, cost, algorithm)
    if rule is None:
        check_cost(compiled, cost, named(algorithm))  # raises: why
        raise ConfigurationError(f"cost {cost!r} cannot be counted")
    return rule


def refusal(compiled: CompiledTree, key: str, rule: Rule | Never) -> Decision:
    """The refusal of a call of ``key`` that ``rule`` (of ``compiled``) can never admit:
    a :class:`~ratelimit.core.decision.NeverAdmitted` for a :class:`Never`."""
    if isinstance(rule, Never):
        span = rule.rule.span_ms / 1000
        state = RuleState(rule.rule, compiled.rules.index(rule.rule), True, 0, span)
        return NeverAdmitted(False, span, rule.rule, 0, key, _states=(state,), why=rule.why)
    span = rule.span_ms / 1000
    state = RuleState(rule, compiled.rules.index(rule), True, 0, span)
    return make_decision(False, span, rule, 0, key, (state,))


def lowered(
    compiled: CompiledTree,
    namespace: str,
    key: str,
    values: tuple[str | None, ...],
    cost: Cost | CostValue,
    algorithm: Algorithm | str,
) -> tuple[Cost, Rule] | None:
    """For front ends of their own (the HTTP edge): a call of ``cost`` that an override's
    rules ``compiled`` refused to check (``RateLimit.check`` raised), as ``RateLimit.decide``
    takes its cost, and the rule that can never admit it (pass it as ``override=``); ``None``
    when the cost is wrong for another reason (then ``check``'s error stands)."""
    chosen = named(algorithm)
    try:
        if isinstance(cost, tuple):
            check_cost(compiled, cost, chosen, bounded=False)
            counted: Cost = cost
        else:
            counted = per_leaf(compiled, cost, chosen, "cost", bounded=False)
    except ConfigurationError:
        return None
    rule = beyond(compiled, namespace, key, values, counted, chosen)
    return None if rule is None else (counted, rule)
