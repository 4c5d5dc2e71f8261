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

from ratelimit.algorithms import Algorithm, named
from ratelimit.core.checks import check_cost
from ratelimit.core.costs import CostValue, per_leaf
from ratelimit.core.decision import Decision, RuleState, make_decision
from ratelimit.core.plan import CompiledTree, Cost, cached_plan
from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import Rule


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
        except ConfigurationError:
            return rule
    return None


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


def refusal(compiled: CompiledTree, key: str, rule: Rule) -> Decision:
    """The refusal of a call of ``key`` that ``rule`` (of ``compiled``) can never admit."""
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
