"""What :class:`~ratelimit.RateLimit` hands out: ``limit()`` and ``concurrency()``, typed
so that a type checker holds ``cost=`` and ``settle=`` against the function decorated.

``cost=`` given a callable binds the decorated function's parameters: a function whose
parameters the callable cannot take is an error (``cost=estimate`` on a function of other
arguments). ``settle=`` given a function with an annotated parameter binds the decorated
function's result: a function returning what it cannot take is an error. A ``lambda`` as
``settle=`` cannot be typed before the function is known, and is taken as it is.

Example::

    def estimate(key: str, prompt: str, max_tokens: int) -> dict[str, int]: ...
    def used(reply: Reply) -> dict[str, int]: ...

    @rl.limit("key:90000 tokens/m", cost=estimate, settle=used)
    async def complete(key: str, prompt: str, max_tokens: int) -> Reply: ...
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeAlias, overload

from ratelimit.core.costs import CostLike, CostValue
from ratelimit.core.settings import Settings
from ratelimit.core.settling import CountWhen
from ratelimit.front.chosen import RulesLike
from ratelimit.front.concurrency import DEFAULT_LEASE, Concurrency
from ratelimit.front.limit import Limit
from ratelimit.front.registry import Registry
from ratelimit.front.reserve import DEFAULT_BY
from ratelimit.front.wrapping import block_key
from ratelimit.pipeline.decider import Decider

if TYPE_CHECKING:  # defaults (PEP 696) for type checkers, which bring typing_extensions
    from typing_extensions import TypeVar

    R = TypeVar("R", contravariant=True, default=Any)
else:
    from typing import TypeVar

    R = TypeVar("R", contravariant=True)

P = ParamSpec("P")
P2 = ParamSpec("P2")
R2 = TypeVar("R2")
Returns: TypeAlias = "CostValue | Awaitable[CostValue]"
"""What ``cost=`` and ``settle=`` callables return: a cost, or an awaitable of one."""


class CostedLimit(Limit, Generic[P]):
    """A :class:`~ratelimit.front.limit.Limit` whose ``cost=`` is a callable of ``P``: it
    decorates functions of those parameters. (The same object as any limit; the type is a
    type checker's.)"""

    def __call__(  # type: ignore[override]
        self: CostedLimit[P2], func: Callable[P2, Awaitable[R2]]
    ) -> Callable[P2, Coroutine[object, None, R2]]:
        return super().__call__(func)


class SettledLimit(Limit, Generic[R]):
    """A :class:`~ratelimit.front.limit.Limit` whose ``settle=`` takes an ``R``: it decorates
    functions returning one."""

    def __call__(  # type: ignore[override]
        self: SettledLimit[R2], func: Callable[P2, Awaitable[R2]]
    ) -> Callable[P2, Coroutine[object, None, R2]]:
        return super().__call__(func)


class CostedSettledLimit(Limit, Generic[P, R]):
    """Both: ``cost=`` a callable of ``P``, ``settle=`` taking an ``R``."""

    def __call__(  # type: ignore[override]
        self: CostedSettledLimit[P2, R2], func: Callable[P2, Awaitable[R2]]
    ) -> Callable[P2, Coroutine[object, None, R2]]:
        return super().__call__(func)


class LimitMaker:
    """``limit()`` and ``concurrency()``, for :class:`~ratelimit.RateLimit`."""

    _decider: Decider
    _registry: Registry
    settings: Settings

    @overload
    def limit(
        self,
        rules: RulesLike | None = None,
        key: str | None = None,
        selector: object | None = None,
        *,
        cost: Callable[P, Returns],
        settle: Callable[[R], Returns],
        wait: float | bool = False,
        shadow: bool | None = None,
        penalty: str | None = None,
        count_when: CountWhen | None = None,
        lease: float | None = None,
        **selectors: object,
    ) -> CostedSettledLimit[P, R]: ...

    @overload
    def limit(
        self,
        rules: RulesLike | None = None,
        key: str | None = None,
        selector: object | None = None,
        *,
        cost: Callable[P, Returns],
        settle: None = None,
        wait: float | bool = False,
        shadow: bool | None = None,
        penalty: str | None = None,
        count_when: CountWhen | None = None,
        lease: float | None = None,
        **selectors: object,
    ) -> CostedLimit[P]: ...

    @overload
    def limit(
        self,
        rules: RulesLike | None = None,
        key: str | None = None,
        selector: object | None = None,
        *,
        cost: CostValue = 1,
        settle: Callable[[R], Returns],
        wait: float | bool = False,
        shadow: bool | None = None,
        penalty: str | None = None,
        count_when: CountWhen | None = None,
        lease: float | None = None,
        **selectors: object,
    ) -> SettledLimit[R]: ...

    @overload
    def limit(
        self,
        rules: RulesLike | None = None,
        key: str | None = None,
        selector: object | None = None,
        *,
        cost: CostValue = 1,
        settle: None = None,
        wait: float | bool = False,
        shadow: bool | None = None,
        penalty: str | None = None,
        count_when: CountWhen | None = None,
        lease: float | None = None,
        **selectors: object,
    ) -> Limit: ...

    def limit(
        self,
        rules: RulesLike | None = None,
        key: str | None = None,
        selector: object | None = None,
        *,
        cost: CostLike = 1,
        settle: Callable[[Any], CostValue | Awaitable[CostValue]] | None = None,
        wait: float | bool = False,
        shadow: bool | None = None,
        penalty: str | None = None,
        count_when: CountWhen | None = None,
        lease: float | None = None,
        **selectors: object,
    ) -> Limit:
        """A limit to use as ``@decorator`` or in ``async with``.

        ``rules``: text such as ``"apikey:100/h & (10/s | 15/m)"``, a ``Rule``/``And``/``Or``
        tree, or a list meaning ``Or``; parsed now, so a bad rule fails at import. Or rules
        chosen per call (:mod:`ratelimit.front.chosen`): a mapping from one keyword selector's
        values to rules (``{"free": "apikey:100/h", "pro": "apikey:10000/h"}`` with
        ``tier=get_tier``; ``"default"`` for other values), or a callable (sync or async)
        of the decorated call's arguments returning rules.
        ``key``: shares counters between functions (default: the function's
        ``module.qualname``; for ``async with`` and the methods, where ``limit()`` was
        called, ``module.qualname:line:column``: each such place counts on its own; give
        ``key=`` to a block that overrides or ``ratelimit peek``/``reset`` must name).
        ``limit(key=...)`` without rules reuses the rules and selectors registered for that
        key. ``selector``: an object whose items, attributes or methods give selector values.
        ``cost``: how many hits one call is worth, at most every rule's count (a whole
        number for the sliding log and GCRA; fractions allowed for the window counters);
        or a mapping from units to amounts, for rules that count a unit
        (``{"tokens": 1200}`` on ``"key:90000 tokens/m"``; rules without a unit count 1);
        or a callable (sync or async) of the decorated call's arguments returning either.
        ``settle``: a callable (sync or async) of the body's result returning what the call
        really cost (as ``cost``); the difference from the reservation is recorded once
        the body returns (a body that raises leaves the reservation as it is).
        ``wait``: how long a refused call may queue for admission, in seconds (``True``: as
        long as it takes); see :mod:`ratelimit.pipeline.waiting`.
        ``shadow``: decide and count as usual, but let refused calls through, marked
        ``Decision.shadow`` for hooks and logs (default: the limiter's ``shadow`` setting).
        ``penalty``: hold back an identifier its rules refused too often, such as
        ``"ip: 5 refusals/10m for 1h"`` (:mod:`~ratelimit.penalties`; memory://, Redis, Postgres).
        ``count_when``: count only the calls it says (flask-limiter's ``deduct_when``): a
        callable (sync or async) of the body's outcome, its result or the exception it
        raised (``None`` when an ``async with`` block ends), returning whether the call
        counts; one that does not is refunded as it ends (a settle to 0). So
        ``count_when=lambda ok: not ok`` counts failed logins only, and
        ``count_when=lambda outcome: isinstance(outcome, BadPassword)`` those that raise
        it. Every call is still decided first, its cost reserved while it runs.
        ``lease``: seconds this limit's calls may be admitted from a slice of it this
        process took from the store (:mod:`ratelimit.backends.leases`); ``0`` asks the
        store on every call; default: the limiter's ``lease`` setting.
        ``**selectors``: selector values as literals, callables or async callables.

        Raises ``RuleSyntaxError`` for a bad rule and ``ConfigurationError`` for a cost or
        a selector the rules cannot take, here; a refused call raises
        ``RateLimitExceeded`` (or waits, with ``wait``).

        Example::

            @rl.limit("apikey:100/h & (10/s | 15/m)", apikey=get_api_key)
            async def search(q: str) -> list[str]: ...

            async with rl.limit("user:3/m", user=name, key="login"):
                ...

            decision = await rl.limit("user:3/m", user=name, key="login").decide()
        """
        site = "" if key is not None else block_key(1)  # where its blocks count
        return self._limit_at(
            site, rules, key, selector, cost, settle, wait, shadow, selectors, penalty, count_when,
            lease,
        )  # fmt: skip

    def _limit_at(
        self,
        site: str,
        rules: RulesLike | None,
        key: str | None,
        selector: object | None,
        cost: CostLike,
        settle: Callable[[Any], CostValue | Awaitable[CostValue]] | None,
        wait: float | bool,
        shadow: bool | None,
        selectors: dict[str, object],
        penalty: str | None = None,
        count_when: CountWhen | None = None,
        lease: float | None = None,
    ) -> Limit:
        """:meth:`limit`, made at ``site`` (the key of its blocks without ``key=``): for
        :mod:`ratelimit.sync`, whose callers made it."""
        typed: type[Limit] = Limit
        if settle is not None:
            typed = SettledLimit if not callable(cost) else CostedSettledLimit
        elif callable(cost) and not isinstance(cost, Mapping):
            typed = CostedLimit
        return typed(
            self._decider,
            self._registry,
            rules,
            key,
            selector,
            selectors,
            cost,
            wait,
            self.settings.shadow if shadow is None else shadow,
            settle,
            site,
            penalty,
            count_when,
            lease,
        )

    def concurrency(
        self,
        limits: str,
        key: str | None = None,
        selector: object | None = None,
        *,
        lease: float = DEFAULT_LEASE,
        wait: float | bool = False,
        reserve: Mapping[str, int] | None = None,
        reserve_by: str = DEFAULT_BY,
        **selectors: object,
    ) -> Concurrency:
        """At most N bodies at once, as ``@decorator`` or in ``async with``.

        ``limits``: ``"user:5"`` (per value of a selector), ``"5"`` (every call of the key),
        or several that all apply, ``"user:5 | 100"``; parsed now. A call takes a slot of
        each on entry and gives them back when its body ends (return, exception or
        cancellation); a refused call raises ``ConcurrencyLimitExceeded`` (a
        ``RateLimitExceeded``). ``lease``: seconds after which a dead holder's slot frees;
        renewed every third of it while the body runs. ``wait``: how long a refused call
        may queue for a slot (``True``: as long as it takes). ``key``, ``selector`` and
        ``**selectors`` as in :meth:`limit` (a block without ``key=`` counts under where
        ``concurrency()`` was called). Slots and rates are separate counters: stack
        ``@rl.concurrency(...)`` over ``@rl.limit(...)`` for both. ``reserve``: slots kept
        for critical work, ``{"critical": 20}`` (most critical first; levels nest); a call's
        priority is the selector ``priority`` (or the one ``reserve_by`` names), and a call
        of no listed priority takes only what the reserve leaves (:mod:`ratelimit.front.reserve`).
        """
        site = "" if key is not None else block_key(1)
        return self._concurrency_at(
            site, limits, key, selector, selectors, lease, wait, reserve, reserve_by
        )

    def _concurrency_at(
        self,
        site: str,
        limits: str,
        key: str | None,
        selector: object | None,
        selectors: dict[str, object],
        lease: float,
        wait: float | bool,
        reserve: Mapping[str, int] | None = None,
        reserve_by: str = DEFAULT_BY,
    ) -> Concurrency:
        """:meth:`concurrency`, made at ``site`` (the key of its blocks without ``key=``)."""
        return Concurrency(
            self._decider, limits, key, selector, selectors, lease, wait, site, reserve, reserve_by
        )
