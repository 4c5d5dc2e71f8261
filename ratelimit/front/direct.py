"""The direct path: what a decorated call of a plain limit needs, worked out when decorated.

Most limits are a fixed tree (one or two rules) whose selectors are the call's own
arguments, with a fixed cost, no ``settle=``, and a limiter without hooks or background
counting. For such a limit, :func:`direct_path` builds, once, a function that turns one
call's arguments into the :class:`~ratelimit.core.plan.Plan` the store decides, from a table of
this limit's own plans (no ``CallSite``, no ``CallKey``, no shared plan cache in the way),
or answers ``None`` when this call needs the general path of :mod:`ratelimit.front.limit`: an
override in force for the key (or the copy of them to refresh first), a refusal standing
in the denial cache for this call, a closed limiter, hooks or background counting set
since, arguments that do not bind (the general path raises the function's own error).

Nothing is decided differently: the same store decides the same plan. On ``memory://``
the store's admission (:func:`admission`, ``backends/memory/admit.py``) answers without a
coroutine and builds no :class:`~ratelimit.core.decision.Decision` for an admitted call (no hook
could read it); a store with ``admits`` (the Redis script engine) answers an admission with
``None`` too, under the failure policy as ``Decider.ask`` (:func:`asker`); elsewhere
``Decider.ask`` asks the store. A refusal goes to the general path's tail
(``Limit._refusal``, ``Decider.refused``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ratelimit.algorithms import Algorithm
from ratelimit.backends.base import Admit, admitting, shortcut
from ratelimit.core.costs import per_leaf
from ratelimit.core.decision import Decision
from ratelimit.core.plan import PLANS, CompiledTree, Cost, Plan, cached_plan
from ratelimit.core.selectors import Parameters, SelectorSources, as_text
from ratelimit.errors import BackendError, ConfigurationError, LockTimeoutError
from ratelimit.pipeline.decider import CallKey, Decider, new_call_key

Values = tuple[str | None, ...]
"""One call's selector values, in the order of its tree's selectors."""
Direct = tuple[Plan, Values]
"""One call's plan (made once per selector values, and kept) and its selector values, of
which :func:`call_key` makes the :class:`~ratelimit.pipeline.decider.CallKey` the general path names
the call by (the denial cache's key) when one is needed: a refusal, or the cache holding
some. A table of plans alone holds one object the garbage collector tracks per entry
(with a ``CallKey`` and the pair, three): with more selector values than :data:`PLANS`,
the table starts again and again, what it held reaches the oldest generation, and full
collections came twice as often (half the CPU of such a decision)."""
PlanOf = Callable[..., "Direct | None"]
"""``plan_of(args, kwargs)``: one call's :data:`Direct`, or ``None`` for the general path;
``plan_of(args, kwargs, cost)`` of a call whose cost its limit's callable answered (checked:
:func:`pricing`)."""

# PLANS (ratelimit.core.plan): plans one limit keeps, by selector values; past it, it starts again


def admission(decider: Decider, compiled: CompiledTree) -> Admit | None:
    """The store's admission of plans of ``compiled`` without a coroutine, when it has one
    (:func:`~ratelimit.backends.base.admitting`; ``memory://``)."""
    admitter = admitting(decider.backend)
    return None if admitter is None else admitter(compiled, decider.algorithm)


Ask = Callable[[Plan], Awaitable["Decision | None"]]
"""``await ask(plan)``: the store's decision under the failure policy, where an admission
may be ``None`` (:func:`asker`)."""


def asker(decider: Decider) -> Ask:
    """What ``Decider.ask`` answers, with ``None`` for an admission the store answered so
    (its ``admits``: the class that defines it defines the ``decide`` in force, as
    :func:`~ratelimit.backends.base.admitting` asks of ``admitter``); ``Decider.ask``
    itself for a store without one. The failure policy answers a failed call as
    ``Decider.ask`` does: its answers, degraded admissions included, are decisions."""
    backend, policy = decider.backend, decider.policy
    admits: Ask | None = shortcut(backend, "admits", "decide")
    if admits is None:
        return decider.ask
    store: Ask = admits

    async def ask(plan: Plan) -> Decision | None:
        if policy.outage_started is not None:  # an outage under way: rarely
            return await policy.decide(backend, plan)
        try:
            return await store(plan)
        except BackendError as exc:
            return await policy.failed_plan(exc, plan)
        except LockTimeoutError as exc:
            return policy.lock_timed_out(exc, plan.key)

    return ask


Whole = Callable[[Plan], Decision]
"""``whole(plan)``: the store's whole decision of ``plan``, without a coroutine."""


def whole(decider: Decider) -> Whole | None:
    """The store's ``decide_now`` when the class that defines it defines the ``decide`` in
    force (``memory://``): what the direct path of a limiter with hooks decides by, since
    its hooks read every decision; ``None`` elsewhere (``Decider.ask`` then decides)."""
    now: Whole | None = shortcut(decider.backend, "decide_now", "decide")
    return now


Price = Callable[[object], "Cost | None"]
"""``price(answer)``: what a limit's cost callable answered, checked as the plan takes it;
``None`` when the checks refuse it (the general path then says why, or refuses the call)."""


def pricing(compiled: CompiledTree, algorithm: Algorithm, what: str) -> Price:
    """:func:`~ratelimit.core.costs.per_leaf` of a limit's cost callable's answers, the
    numbers among them checked once each (up to :data:`PLANS` of them)."""
    checked: dict[tuple[type, object], Cost] = {}

    def price(answer: object) -> Cost | None:
        kind = answer.__class__
        plain = kind is int or kind is float  # a bool is refused, and 2.0 is not 2 here
        if plain:
            found = checked.get((kind, answer))
            if found is not None:
                return found
        try:
            cost = per_leaf(compiled, answer, algorithm, what)
        except ConfigurationError:
            return None
        if plain:
            if len(checked) >= PLANS:
                checked.clear()
            checked[kind, answer] = cost
        return cost

    return price


def call_key(
    decider: Decider, compiled: CompiledTree, key: str, values: Values, cost: Cost
) -> CallKey:
    """The :class:`~ratelimit.pipeline.decider.CallKey` of one call the direct path decides."""
    return new_call_key(
        CallKey, (compiled, decider.namespace, key, values, cost, decider.algorithm)
    )


def direct_path(
    decider: Decider,
    compiled: CompiledTree,
    key: str,
    sources: SelectorSources,
    parameters: Parameters,
    cost: Cost | None,
) -> PlanOf | None:
    """The direct path of one decorated limit, or ``None`` when its shape never allows one
    (a selector from ``limit()``'s keywords or a selector object, or not a parameter of
    the function; background counting on the limiter). ``cost``: the limit's fixed cost;
    ``None`` for a callable's, which each call gives ``plan_of`` (:func:`pricing`). With
    hooks, ``settle=`` or ``count_when=``, the decorator decides its plans by
    :func:`whole` decisions, which they read."""
    if decider.background is not None or sources.obj is not None:
        return None
    names = compiled.selectors
    if any(name in sources.keywords for name in names):
        return None
    positions = parameters.positions(names)
    if positions is None:
        return None
    fewest, most = parameters.positional_range()
    fewest = max([fewest, *(p + 1 for p in positions)])
    binds = parameters.binds
    lookup = parameters.lookup
    namespace, algorithm = decider.namespace, decider.algorithm
    plans: dict[object, Plan] = {}
    single = len(names) == 1
    position = positions[0] if single else -1

    fixed = cost

    def new_plan(values: Values, by: object, cost: Cost | None = fixed) -> Plan:
        assert cost is not None  # a priced limit's calls give theirs
        if len(plans) >= PLANS:
            plans.clear()
        plan: Plan = cached_plan(compiled, namespace, key, values, cost, algorithm)
        plans[by] = plan
        return plan

    hooks = decider.hooks

    def plan_of(
        args: tuple[Any, ...], kwargs: dict[str, Any], cost: Cost | None = fixed
    ) -> Direct | None:
        if decider.closed or decider.hooks is not hooks or decider.background is not None:
            return None  # closed, or hooks or background counting set since
        overrides = decider.overrides
        if overrides is not None and not overrides.quiet(key):
            return None
        values: Values
        if cost is fixed and not kwargs and fewest <= len(args) <= most and single:
            value = args[position]
            if value.__class__ is not str:
                value = as_text(value)
            values = (value,)
            plan = plans.get(value)
            if plan is None:
                plan = new_plan(values, value)
        else:
            if not kwargs and fewest <= len(args) <= most:
                values = tuple([as_text(args[p]) for p in positions])
            elif binds(args, kwargs):
                values = tuple([as_text(lookup(name, args, kwargs)) for name in names])
            else:
                return None  # the general path raises the function's own TypeError
            by = values if cost is fixed else (values, cost)  # a cost the callable answered
            plan = plans.get(by) or new_plan(values, by, cost)
        denials = decider.denials
        if denials.held:
            assert cost is not None  # a priced limit's calls give theirs
            if denials.get(call_key(decider, compiled, key, values, cost)) is not None:
                return None  # a refusal still standing: the general path answers it
        return plan, values

    return plan_of
