"""What a call of a function decorated with ``@rl.limit(...)`` does (``Limit.__call__``).

A limit works out, when it decorates, the paths its calls take (:func:`paths_of`): the fused
path of the commonest limit (:mod:`ratelimit.front.fused`), the direct path of any limit of
a tree of its own or of a rules mapping keyed by a keyword selector
(:mod:`ratelimit.front.direct`, :class:`~ratelimit.front.chosen.Chooser`), with whatever it
adds: a cost callable's answer (checked), whole decisions for what reads them (hooks,
``settle=``, ``count_when=``), a penalty's hold read without a coroutine
(``Penalizer.unheld``). A call none of them covers (an override in force, a refusal still
standing, a selector object, a penalty's hold, ...) takes the general path
(``Limit._admit``), given whatever the direct one resolved already (a cost callable's
answer, the rules mapping's value), so nothing of the caller's runs twice.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple, ParamSpec, Protocol, TypeVar

from ratelimit.backends.base import Admit
from ratelimit.core.costs import CallCost
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, Cost
from ratelimit.core.selectors import CallSite, Parameters
from ratelimit.front.chosen import UNRESOLVED, Chooser, ChosenRules
from ratelimit.front.direct import Ask, Direct, PlanOf, Price, Whole, asker, pricing, whole
from ratelimit.front.fused import DirectPaths, Fused
from ratelimit.front.wrapping import call_site, coroutine_only
from ratelimit.penalties.penalizer import Penalizer
from ratelimit.pipeline.decider import CallKey, Decider

P = ParamSpec("P")
R = TypeVar("R")


class Limit(Protocol):
    """What the decorator reads of the :class:`~ratelimit.front.limit.Limit` it is made
    for: its settings, its paths, and the general path's steps it hands calls to."""

    _decider: Decider
    _compiled: CompiledTree | ChosenRules | None
    _cost: CallCost
    _penalizer: Penalizer | None
    _shadow: bool
    _settle: Callable[[Any], Any] | None
    _count_when: Callable[[Any], Any] | None

    def _bind(self, func: Callable[..., Any]) -> tuple[str, Parameters]: ...
    def _direct(self, key: str, parameters: Parameters) -> DirectPaths: ...
    def _chooser(self, key: str, parameters: Parameters) -> Chooser | None: ...
    async def _admit(
        self,
        key: str,
        site: CallSite,
        shadow: bool | None = None,
        answered: object = ...,
        chosen: object = ...,
    ) -> Decision: ...
    async def _settled(self, decision: Decision, result: Any, raised: bool = False) -> None: ...
    async def _penalized(
        self,
        known: Direct,
        refusal: Decision,
        shadow: bool,
        target: Any,
        cost: Cost | None,
        started: float = 0.0,
    ) -> Decision: ...
    async def _waited(self, call: CallKey, refusal: Decision) -> Decision: ...
    def _refusal(
        self,
        known: Direct,
        decision: Decision,
        shadow: bool,
        started: float | None = None,
        cost: Cost | None = None,
        raising: bool = True,
    ) -> tuple[CallKey, Decision]: ...


UNANSWERED = object()
"""What the limit's cost callable answered, before it is called (``Limit._admit``)."""


class Paths(NamedTuple):
    """What a decorated limit decides its calls by, worked out when it decorates."""

    direct: PlanOf | None
    """The direct path (``None``: none for this limit, or a chooser's per call)."""
    admit: Admit | None
    """The store's admission without a coroutine (``memory://``)."""
    fused: Fused | None
    """The fused path."""
    chooser: Chooser | None
    """A rules mapping's paths, by its selector's value."""
    price: Price | None
    """A cost callable's answers, checked (the direct path then takes the cost per call)."""
    penalizer: Penalizer | None
    """The limit's penalty, read without a coroutine on the direct path."""
    wholes: bool
    """Whether something reads each decision whole: hooks, ``settle=``, ``count_when=``."""
    now: Whole | None
    """The store's whole decision without a coroutine (``memory://``)."""
    ask: Ask
    """The store's decision under the failure policy (``None`` for an admission)."""


def paths_of(limit: Limit, key: str, parameters: Parameters) -> Paths:
    """The paths of ``limit`` decorating a function of ``parameters`` under ``key``."""
    direct, admit, fused = limit._direct(key, parameters)
    decider = limit._decider
    wholes = decider.told or limit._settle is not None or limit._count_when is not None
    price = None
    if direct is not None and not limit._cost.fixed:  # a callable's cost, checked
        assert type(limit._compiled) is CompiledTree  # the direct path's limits have one
        price = pricing(limit._compiled, decider.algorithm, limit._cost.what)
    return Paths(
        direct,
        admit,
        fused,
        limit._chooser(key, parameters),
        price,
        limit._penalizer if direct is not None else None,
        wholes,
        whole(decider) if wholes else None,
        asker(decider),
    )


async def _settled_after(
    limit: Limit,
    decision: Decision,
    func: Callable[..., Awaitable[R]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> R:
    """The body's result, once ``count_when`` (whether it counts, also when the body
    raised) and ``settle=`` (what it cost, when it returned) made of it what they say."""
    if limit._count_when is not None:
        try:
            result = await func(*args, **kwargs)
        except Exception as exc:
            await limit._settled(decision, exc, raised=True)
            raise
    else:
        result = await func(*args, **kwargs)
    await limit._settled(decision, result)
    return result


def decorate(
    limit: Limit, func: Callable[P, Awaitable[R]]
) -> Callable[P, Coroutine[object, None, R]]:
    """``limit`` around ``func``: each call admitted (or refused) before the body runs,
    then settled or refunded by what it returned when the limit says so."""
    coroutine_only(func, "limit")
    key, parameters = limit._bind(func)
    shadow, settle, counted = limit._shadow, limit._settle, limit._count_when
    direct, admit, fused, chooser, price, penalizer, wholes, now, ask = paths_of(
        limit, key, parameters
    )
    decider, answer, compiled = limit._decider, limit._cost.answer_now, limit._compiled
    answers = chooser is not None or price is not None  # a callable of the caller's, per call
    binds = parameters.binds

    @functools.wraps(func)
    async def limited(*args: P.args, **kwargs: P.kwargs) -> R:
        if fused is not None and fused(args, kwargs):  # ratelimit.front.fused
            return await func(*args, **kwargs)
        known, answered, cost, tier = None, UNANSWERED, None, UNRESOLVED
        plan_of, admits = direct, admit
        if answers and not binds(args, kwargs):  # the general path raises, calling nothing
            plan_of = None
        elif chooser is not None:  # the rules of the call's value, each with its paths
            tier = await chooser.value()
            plan_of, admits, chosen = chooser.paths(tier)
            if chosen is not None and chosen(args, kwargs):
                return await func(*args, **kwargs)
        if plan_of is not None:
            if price is None:
                known = plan_of(args, kwargs)
            else:  # the cost callable answers once, whichever path decides
                answered = answer(args, kwargs)  # a number, or an awaitable of one
                if answered.__class__ is not int and inspect.isawaitable(answered):
                    answered = await answered
                cost = price(answered)
                known = None if cost is None else plan_of(args, kwargs, cost)
        target = hold = None
        if known is not None and penalizer is not None:  # unless a hold may apply
            target = penalizer.unheld(compiled, key, known[1])  # type: ignore[arg-type]
            if target is False:
                known = None
            else:
                hold = penalizer.asking(target, shadow)  # the hold read with the decision
        if known is None:
            site = call_site(func, parameters, args, kwargs)  # one that cannot bind: free
            decision = await limit._admit(key, site, shadow, answered, tier)
        elif not wholes:  # nothing reads an admission
            plan = known[0]
            refused: Decision | None
            if hold is not None:
                refused = await decider.ask(plan, hold)
            else:
                refused = admits(plan) if admits is not None else await ask(plan)
            if refused is not None and not refused.allowed:
                if penalizer is not None:  # noted, as Penalizer.decide notes it
                    await limit._penalized(known, refused, shadow, target, cost)
                    return await func(*args, **kwargs)  # let through in shadow
                call, refused = limit._refusal(known, refused, shadow, cost=cost)
                if not refused.shadow:
                    await limit._waited(call, refused)
            return await func(*args, **kwargs)
        else:
            started = decider.started()
            decision = now(known[0]) if now is not None else await decider.ask(known[0], hold)
            if decision.allowed:
                decider.tell(decision, started)  # told as Decider.decide tells the hooks
            elif penalizer is not None:
                decision = await limit._penalized(known, decision, shadow, target, cost, started)
            else:
                call, decision = limit._refusal(known, decision, shadow, started, cost)
                if not decision.shadow:
                    decision = await limit._waited(call, decision)
        if counted is None and settle is None:
            return await func(*args, **kwargs)
        return await _settled_after(limit, decision, func, args, kwargs)

    return limited
