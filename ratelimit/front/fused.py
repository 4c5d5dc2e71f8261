"""The fused direct path: the commonest decorated limit decided in one step.

A limit of one rule whose one selector is a positional argument of the function, of cost 1,
on a store that admits a call by its identifier without a coroutine (``memory://``, its
sliding log and GCRA: :func:`~ratelimit.backends.memory.admit.identified`), decides an
admitted call here: the selector's value straight to the rule's identifier (kept per value,
worked out by :func:`~ratelimit.core.plan.cached_plan` as the direct path's plan has it), then
the store's admission. No :class:`~ratelimit.core.plan.Plan` is looked up and no tuple of values
is made. Whenever anything is not plain (keywords, a value that is not a ``str`` or names
nothing, an override or the copy of them to refresh, a refusal held in the denial cache, a
closed limiter, hooks or background counting set since, a refusal of the store), it answers
``False`` having changed nothing, and the call goes the direct path (:mod:`ratelimit.front.direct`),
which decides it as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ratelimit.algorithms import Algorithm
from ratelimit.backends.base import Admit, admitting, shortcut
from ratelimit.backends.memory.admit import AdmitIdentified
from ratelimit.core.plan import PLANS, CompiledTree, Cost, Identifier, cached_plan
from ratelimit.core.selectors import Parameters, SelectorSources
from ratelimit.front.direct import PlanOf, admission, direct_path
from ratelimit.pipeline.decider import Decider

Fused = Callable[[tuple[Any, ...], dict[str, Any]], bool]
"""``fused(args, kwargs)``: ``True`` when the call was admitted and recorded; ``False``,
nothing done, for the direct path to decide it."""
Free = Callable[[str], bool]
"""``free(value)``: nothing holds back a call of this selector value now (a penalty's hold,
read without a coroutine: ``Penalizer.free``); ``False`` sends it to the direct path."""
DirectPaths = tuple["PlanOf | None", "Admit | None", "Fused | None"]
"""A decorated limit's direct path, its store's admission, and its fused path."""


def direct_paths(
    decider: Decider,
    compiled: CompiledTree,
    key: str,
    sources: SelectorSources,
    parameters: Parameters,
    cost: Cost | None,
    free: Free | None = None,
) -> DirectPaths:
    """What a decorated limit of a tree of its own, of a fixed cost and no ``settle=``,
    decides its calls by (``Limit.__call__``): :func:`fused_path`, else
    :func:`~ratelimit.front.direct.direct_path` with :func:`~ratelimit.front.direct.admission`.
    ``free``: whether nothing holds back a call of a selector value (a penalty's holds)."""
    return (
        direct_path(decider, compiled, key, sources, parameters, cost),
        admission(decider, compiled),
        fused_path(decider, compiled, key, sources, parameters, cost, free),
    )


def identified_admitter(
    backend: object,
) -> Callable[[CompiledTree, Algorithm], AdmitIdentified | None] | None:
    """``backend.identified`` when the class that defines the ``admitter`` in force
    (:func:`~ratelimit.backends.base.admitting`: itself the one that defines ``decide``)
    defines it too: a subclass that overrides ``admitter`` or ``decide``, to count or change
    decisions, keeps every decision on them."""
    if admitting(backend) is None:
        return None
    identified: Callable[[CompiledTree, Algorithm], AdmitIdentified | None] | None
    identified = shortcut(backend, "identified", "admitter")
    return identified


def fused_path(
    decider: Decider,
    compiled: CompiledTree,
    key: str,
    sources: SelectorSources,
    parameters: Parameters,
    cost: Cost | None,
    free: Free | None = None,
) -> Fused | None:
    """The fused direct path of one decorated limit, or ``None`` when its shape or its store
    never allows one; ``free``: as for :func:`direct_paths`."""
    names = compiled.selectors
    if decider.hooks or decider.background is not None or sources.obj is not None:
        return None
    if len(names) != 1 or names[0] in sources.keywords or cost not in (1, (1,)):
        return None
    identifying = identified_admitter(decider.backend)
    admit = None if identifying is None else identifying(compiled, decider.algorithm)
    positions = parameters.positions(names)
    if admit is None or positions is None:
        return None
    position = positions[0]
    fewest, most = parameters.positional_range()
    fewest = max(fewest, position + 1)
    namespace, algorithm, hooks = decider.namespace, decider.algorithm, decider.hooks
    identifiers: dict[str, Identifier] = {}

    def fused(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if kwargs or not fewest <= len(args) <= most:
            return False
        if decider.closed or decider.hooks is not hooks or decider.background is not None:
            return False  # closed, or hooks or background counting set since
        overrides = decider.overrides
        if decider.denials.held or (overrides is not None and not overrides.quiet(key)):
            return False
        value = args[position]
        if value.__class__ is not str or (free is not None and not free(value)):
            return False
        identifier = identifiers.get(value)
        if identifier is None:
            plan = cached_plan(compiled, namespace, key, (value,), cost, algorithm)
            if not plan.identifiers:
                return False  # the rule is never limited for this value: the direct path's
            if len(identifiers) >= PLANS:
                identifiers.clear()
            identifier = identifiers[value] = plan.identifiers[0]
        return admit(identifier)

    return fused
