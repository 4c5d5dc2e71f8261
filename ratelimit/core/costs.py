"""What one call costs: a number, a mapping from units to amounts, or a callable of the call.

A number counts on every rule of the tree (``cost=2``: two hits on each). A mapping counts
per unit: a rule that names one (``apikey:90000 tokens/m``) counts that unit's amount, a
rule that names none counts 1, so ``{"tokens": 1200}`` on ``apikey:60/m | apikey:90000
tokens/m`` is one call and 1 200 tokens, decided at once. A callable (sync or async) is
called with the decorated call's own arguments (with none for ``decide()`` and
``acquire()``) and returns a number or a mapping.

Every cost becomes a :data:`~ratelimit.core.plan.Cost` for the plan: a number, or one number per
leaf of the compiled tree. Costs known when the limit is made are checked then; a
callable's answers are checked at each call.

Example::

    @rl.limit("apikey:60/m | apikey:90000 tokens/m", cost=lambda key, prompt, max_tokens:
              {"tokens": max_tokens})
    async def complete(key: str, prompt: str, max_tokens: int) -> Reply: ...
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias

from ratelimit.algorithms import Algorithm
from ratelimit.core.checks import check_cost
from ratelimit.core.plan import CompiledTree, Cost
from ratelimit.errors import ConfigurationError

CostValue: TypeAlias = "float | Mapping[str, float]"
"""What a call counts: one number on every rule, or per unit (rules without a unit count 1)."""
CostLike: TypeAlias = "CostValue | Callable[..., CostValue | Awaitable[CostValue]]"
"""What ``cost=`` takes: a :data:`CostValue`, or a callable (sync or async) returning one."""


def units(compiled: CompiledTree) -> tuple[str, ...]:
    """The units the rules of ``compiled`` count, in order of first appearance."""
    return tuple(dict.fromkeys(r.unit for r in compiled.rules if r.unit is not None))


def per_leaf(
    compiled: CompiledTree | None,
    value: object,
    algorithm: Algorithm,
    what: str,
    settled: bool = False,
    bounded: bool = True,
) -> Cost:
    """``value`` (a :data:`CostValue`, or one number per rule as the plan takes it) as the
    plan takes it, checked against every rule of ``compiled`` under ``algorithm`` (``None``:
    a number checked alone): a cost per rule passes the checks a number does;
    ``ConfigurationError`` naming ``what`` (where the cost came from) otherwise.
    ``settled``: a call's real cost, after it ran (0 allowed, no bound:
    :meth:`~ratelimit.algorithms.Algorithm.check_actual`). ``bounded=False``: a cost
    above what a rule admits at once passes (:func:`~ratelimit.core.checks.check_cost`)."""
    check = algorithm.check_actual if settled else algorithm.check_cost_type
    cost: Cost
    if _is_number(value):  # first: a number is the common cost, and no Mapping
        cost = _checked(value, check, what)
    elif isinstance(value, Mapping) and compiled is not None:
        named = units(compiled)
        unknown = [unit for unit in value if unit not in named]
        if unknown:
            have = f"its rules count {', '.join(map(repr, named))}" if named else "none counts one"
            raise ConfigurationError(
                f"{what} names unit {unknown[0]!r}, which no rule of '{compiled.tree}' counts "
                f"({have})"
            )
        missing = [unit for unit in named if unit not in value]
        if missing:
            raise ConfigurationError(
                f"{what} gives no amount for unit {missing[0]!r}, which rules of "
                f"'{compiled.tree}' count"
            )
        for unit, amount in value.items():
            _checked(amount, check, f"{what}[{unit!r}]")
        leaves = tuple(1 if r.unit is None else value[r.unit] for r in compiled.rules)
        cost = leaves[0] if len(leaves) == 1 else leaves
    elif isinstance(value, tuple) and compiled is not None:
        if len(value) != len(compiled.rules):
            raise ConfigurationError(
                f"{what} {value!r}: one cost per rule of '{compiled.tree}' "
                f"({len(compiled.rules)}), not {len(value)}"
            )
        for leaf, amount in enumerate(value):
            _checked(amount, check, f"{what}[{leaf}]")
        cost = value
    else:
        raise ConfigurationError(
            f"{what} must be a number, a mapping from units to numbers (such as "
            f"{{'tokens': 1200}}) or a callable returning one, not {type(value).__name__}"
        )
    if settled or compiled is None:
        return cost
    try:
        check_cost(compiled, cost, algorithm, bounded)
    except ConfigurationError as exc:
        if what in _PLAIN:
            raise
        raise ConfigurationError(f"{what}: {exc}") from None
    return cost


_PLAIN = ("cost", "the settled cost", "the recorded cost")
"""Where a cost came from that its checks' messages already say."""


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _checked(amount: object, check: Callable[[object], None], what: str) -> float:
    try:
        check(amount)
    except ConfigurationError as exc:
        if what in _PLAIN:
            raise
        raise ConfigurationError(f"{what}: {exc}") from None
    return amount  # type: ignore[return-value]


class CallCost:
    """A limit's ``cost=``: fixed (checked once per rule tree) or a callable of each call."""

    __slots__ = ("_fixed", "_function", "_given", "_is_async", "_what")

    def __init__(self, cost: object, algorithm: Algorithm) -> None:
        self._given = cost
        self._function: Callable[..., Any] | None = None
        self._fixed: dict[CompiledTree, Cost] = {}
        if callable(cost) and not isinstance(cost, Mapping):
            self._function = cost
            self._is_async = inspect.iscoroutinefunction(cost)
            self._what = f"the cost {_name(cost)} returned"  # named once, not per call
        elif not isinstance(cost, Mapping):  # a bad number fails now, before any rules
            per_leaf(None, cost, algorithm, "cost")

    @property
    def fixed(self) -> bool:
        """Whether every call costs the same (not a callable)."""
        return self._function is None

    def check(self, compiled: CompiledTree, algorithm: Algorithm) -> None:
        """A fixed cost fits ``compiled``; a callable's answers are checked per call."""
        if self._function is None:
            self.of(compiled, algorithm)

    def of(self, compiled: CompiledTree, algorithm: Algorithm, bounded: bool = True) -> Cost:
        """The fixed cost, as the plan takes it for ``compiled`` (computed once).
        ``bounded=False``: see :func:`per_leaf` (an override's rules, computed per call)."""
        if not bounded:
            return per_leaf(compiled, self._given, algorithm, "cost", bounded=False)
        cost = self._fixed.get(compiled)
        if cost is None:
            cost = self._fixed[compiled] = per_leaf(compiled, self._given, algorithm, "cost")
        return cost

    async def call(
        self,
        compiled: CompiledTree,
        algorithm: Algorithm,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        bounded: bool = True,
    ) -> Cost:
        """This call's cost: the fixed one, or what the callable answers for ``args``."""
        if self._function is None:
            return self.of(compiled, algorithm, bounded)
        value = await self.answer(args, kwargs)
        return per_leaf(compiled, value, algorithm, self._what, bounded=bounded)

    async def answer(
        self, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        """What the callable answers for ``args`` (unchecked: :meth:`call` checks it;
        :attr:`what` names it in errors); the fixed cost as given."""
        value = self.answer_now(args, kwargs)
        if not _is_number(value) and inspect.isawaitable(value):
            value = await value
        return value

    def answer_now(
        self, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        """What the callable returns for ``args``, not awaited: a number, or an awaitable of
        one (:meth:`answer` awaits it; a decorated call does, without a coroutine of its
        own); the fixed cost as given."""
        function = self._function
        if function is None:
            return self._given
        return function(*args, **(kwargs or {}))

    @property
    def what(self) -> str:
        """Where the cost comes from, for errors: ``"cost"``, or the callable's answer."""
        return "cost" if self._function is None else self._what


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)
