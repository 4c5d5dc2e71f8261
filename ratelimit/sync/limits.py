"""The sync API's ``Limit`` and ``Concurrency``: decorators of plain functions, ``with``
blocks and blocking methods, each running its async twin (:class:`ratelimit.Limit`,
:class:`ratelimit.Concurrency`) on the limiter's loop."""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

from ratelimit.core.costs import CostValue
from ratelimit.core.decision import Decision
from ratelimit.core.selectors import Parameters
from ratelimit.front.concurrency import Concurrency as AsyncConcurrency
from ratelimit.front.concurrency import Held
from ratelimit.front.limit import Limit as AsyncLimit
from ratelimit.front.wrapping import call_site, function_name, is_async
from ratelimit.sync.direct import DirectPath, ToTheLoop
from ratelimit.sync.portal import Portal

if TYPE_CHECKING:
    from ratelimit.front.limiter import RateLimit as AsyncRateLimit


class RateLimit(Protocol):
    """What a limit needs of the :class:`ratelimit.sync.RateLimit` that made it."""

    portal: Portal
    direct: DirectPath | None
    """Plain decisions in the calling thread, where the store allows."""
    generation: int
    twins: list[weakref.ref[_Twin[Any]]]
    """Its limits, oldest first (dead ones dropped now and then)."""

    @property
    def limiter(self) -> AsyncRateLimit: ...


P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A", AsyncLimit, AsyncConcurrency)


class _Twin(Generic[A]):
    """The async limit this one runs, made again with the limiter's (a forked child's own),
    with the functions it decorates bound to it again, in the order they were."""

    def __init__(self, owner: RateLimit, make: Callable[[AsyncRateLimit], A]) -> None:
        self._owner: RateLimit = owner
        self._make: Callable[[AsyncRateLimit], A] = make
        self._generation = owner.generation
        self._twin: A = make(owner.limiter)  # a bad rule or setting fails here, when made
        self._bound: list[Callable[..., Any]] = []
        owner_twins(owner).append(weakref.ref(self))

    def twin(self) -> A:
        owner = self._owner
        limiter = owner.limiter  # a forked child makes its own here
        if self._generation != owner.generation:
            remake(owner, limiter)
        return self._twin

    def _remake(self, limiter: AsyncRateLimit, generation: int) -> None:
        self._twin = self._make(limiter)
        for func in self._bound:
            self._twin._bind(func)
        self._generation = generation

    def _decorates(self, func: Callable[..., Any]) -> tuple[str, Any]:
        if is_async(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"ratelimit.sync decorates plain functions, not async def "
                f"{function_name(func)}: use ratelimit.RateLimit for coroutines"
            )
        bound = self.twin()._bind(func)
        self._bound.append(func)
        return bound


def owner_twins(owner: RateLimit) -> list[weakref.ref[_Twin[Any]]]:
    """The limits made by ``owner``, oldest first (dead ones dropped now and then)."""
    twins = owner.twins
    if len(twins) % 1024 == 1023:
        twins[:] = [ref for ref in twins if ref() is not None]
    return twins


_remaking = threading.Lock()


def remake(owner: RateLimit, limiter: AsyncRateLimit) -> None:
    """Make every limit of ``owner`` again on ``limiter``, oldest first (a limit reusing
    another's ``key=`` finds its rules registered)."""
    with _remaking:
        for ref in list(owner_twins(owner)):
            twin = ref()
            if twin is not None and twin._generation != owner.generation:
                twin._remake(limiter, owner.generation)


def _direct_parts(
    limit: AsyncLimit, key: str, parameters: Parameters, direct: DirectPath
) -> list[Any]:
    """The async ``limit``'s direct path and the store's admission of its plans in the
    calling thread (``memory://``'s own, or the Redis script engine's through ``direct``:
    :meth:`DirectPath.admission`; ``None`` for none): what a plain limit's calls are
    admitted by in the calling thread, from a table of its plans. Anything more (hooks,
    which run on the limiter's loop; settle, count_when, a cost callable, a penalty) is
    decided on the loop."""
    plan_of, admit, _ = limit._direct(key, parameters)
    plain = not (limit._settle or limit._count_when or limit._penalizer)
    if not plain or not limit._cost.fixed or limit._decider.told:
        plan_of = None
    if admit is None and plan_of is not None:
        admit = direct.admission()
    return [plan_of, admit]


class Limit(_Twin[AsyncLimit]):
    """Rules bound to a :class:`~ratelimit.sync.RateLimit`: a decorator of plain functions,
    a ``with`` block, or blocking methods (see :class:`ratelimit.Limit`)."""

    def __init__(self, owner: RateLimit, make: Callable[[AsyncRateLimit], AsyncLimit]) -> None:
        super().__init__(owner, make)
        self._entered = threading.local()
        """Under ``count_when``, each thread's ``with`` blocks under way: their decisions."""

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        key, parameters = self._decorates(func)
        owner = self._owner
        portal = owner.portal

        made: list[Any] = [None, None, None]  # the twin, and its direct path's parts

        @functools.wraps(func)
        def limited(*args: P.args, **kwargs: P.kwargs) -> R:
            limit = self.twin()
            direct = owner.direct
            if direct is not None and not portal.closed:
                portal.check_caller()
                if made[0] is not limit:  # the async limit's own direct path, made once
                    made[:] = [limit, *_direct_parts(limit, key, parameters, direct)]
                plan_of, admit = made[1], made[2]
                known = None if plan_of is None or admit is None else plan_of(args, kwargs)
                if known is not None:  # admitted here, from the plan, as the async decorator
                    try:
                        refused = admit(known[0])
                    except ToTheLoop:  # an outage under way: the loop's decisions end it
                        pass
                    else:
                        if refused is not None and not refused.allowed:
                            call, refused = limit._refusal(known, refused, limit._shadow)
                            if not refused.shadow:
                                portal.run(lambda: limit._waited(call, refused))
                        return func(*args, **kwargs)
            site = call_site(func, parameters, args, kwargs)
            decision = None
            if direct is not None and not portal.closed:
                decision = direct.admit(limit, key, site)  # a plain decision: no hand-over
            if decision is None:
                decision = portal.run(lambda: limit._admit(key, site))
            if limit._count_when is not None:  # the outcome says whether it counts
                try:
                    result = func(*args, **kwargs)
                except Exception as exc:
                    raised = exc
                    portal.run(lambda: limit._settled(decision, raised, raised=True))
                    raise
                portal.run(lambda: limit._settled(decision, result))
                return result
            result = func(*args, **kwargs)
            if limit._settle is not None:
                portal.run(lambda: limit._settled(decision, result))
            return result

        return limited

    def decide(self, *, cost: CostValue | None = None) -> Decision:
        """Decide one call without raising (:meth:`ratelimit.Limit.decide`): counted only
        if ``Decision.allowed``."""
        limit = self.twin()
        return self._owner.portal.run(lambda: limit.decide(cost=cost))

    def peek(self, *, cost: CostValue | None = None) -> Decision:
        """The decision :meth:`decide` would give, recording nothing."""
        limit = self.twin()
        return self._owner.portal.run(lambda: limit.peek(cost=cost))

    def reset(self) -> None:
        """Forget the hits of this limit's identifiers."""
        limit = self.twin()
        self._owner.portal.run(limit.reset)

    def acquire(
        self, wait: float | bool | None = None, *, cost: CostValue | None = None
    ) -> Decision:
        """Be admitted, blocking up to ``wait`` seconds (default: the limit's ``wait=``),
        or raise ``RateLimitExceeded``."""
        limit = self.twin()
        return self._owner.portal.run(lambda: limit.acquire(wait, cost=cost))

    def settle(self, decision: Decision, actual: CostValue) -> bool:
        """Record what the call ``decision`` admitted really cost
        (:meth:`ratelimit.Limit.settle`)."""
        limit = self.twin()
        return self._owner.portal.run(lambda: limit.settle(decision, actual))

    def __enter__(self) -> Decision:
        decision = self.acquire()
        if self.twin()._count_when is not None:  # the block's end settles it
            self._entered.__dict__.setdefault("stack", []).append(decision)
        return decision

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        limit = self.twin()
        if limit._count_when is None:
            return None
        decision = self._entered.stack.pop()
        if exc is None or isinstance(exc, Exception):
            self._owner.portal.run(lambda: limit._settled(decision, exc, raised=True))
        return None


class Concurrency(_Twin[AsyncConcurrency]):
    """Slots bound to a :class:`~ratelimit.sync.RateLimit`: a decorator of plain functions
    or a ``with`` block (see :class:`ratelimit.Concurrency`)."""

    def __init__(self, owner: RateLimit, make: Callable[[AsyncRateLimit], AsyncConcurrency]):
        super().__init__(owner, make)
        self._held = threading.local()

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        key, parameters = self._decorates(func)
        portal = self._owner.portal

        @functools.wraps(func)
        def limited(*args: P.args, **kwargs: P.kwargs) -> R:
            site = call_site(func, parameters, args, kwargs)
            slots = self.twin()
            held, _ = portal.run(lambda: slots._enter(key, site), lambda got: slots._exit(got[0]))
            try:
                return func(*args, **kwargs)
            finally:
                portal.run(lambda: slots._exit(held))

        return limited

    def __enter__(self) -> Decision:
        slots = self.twin()
        held, decision = self._owner.portal.run(
            lambda: slots._enter(slots.block_key(), None), lambda got: slots._exit(got[0])
        )
        stack: list[tuple[AsyncConcurrency, Held]] = self._held.__dict__.setdefault("stack", [])
        stack.append((slots, held))
        return decision

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        slots, held = self._held.stack.pop()
        self._owner.portal.run(lambda: slots._exit(held))
