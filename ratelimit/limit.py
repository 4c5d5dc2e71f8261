"""``Limit``: rules bound to a ``RateLimit``, as decorator, ``async with`` or methods."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from ratelimit.decider import CallKey, Decider, new_call_key
from ratelimit.decision import Decision, RateLimitExceeded
from ratelimit.plan import compile_tree
from ratelimit.registry import Registration, Registry
from ratelimit.rules import RuleLike, to_tree
from ratelimit.selectors import CallSite, SelectorSources, resolve
from ratelimit.settings import check_cost, check_cost_type, check_flag
from ratelimit.waiting import admitted, wait_seconds
from ratelimit.wrapping import call_site, function_name, run_body, wrappable

P = ParamSpec("P")
R = TypeVar("R")

GLOBAL_KEY = ""


class Limit:
    """Rules bound to a :class:`RateLimit`: a decorator, an ``async with`` block, or
    :meth:`decide` for a decision without an exception.

    As a decorator, a refused call raises :class:`RateLimitExceeded` and the function body
    does not run; a plain ``def`` becomes a coroutine function. ``async with`` raises on
    entry in the same way.
    """

    def __init__(
        self,
        decider: Decider,
        registry: Registry,
        rules: RuleLike | None,
        key: str | None,
        selector: object | None,
        selectors: dict[str, object],
        cost: float = 1,
        wait: float | bool = False,
        shadow: bool = False,
    ) -> None:
        check_cost_type(cost, decider.algorithm)
        check_flag("shadow", shadow)
        self._shadow = shadow
        self._wait = wait_seconds(wait)
        if rules is None and key is None:
            raise TypeError("limit() needs rules, or key= naming rules registered elsewhere")
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be text, not {type(key).__name__}")
        self._decider = decider
        self._registry = registry
        self._key = key
        self._sources = SelectorSources(selectors, selector)
        self._cost = cost
        self._compiled = None if rules is None else compile_tree(to_tree(rules))
        if self._compiled is not None:
            check_cost(self._compiled, cost, decider.algorithm)
        # Without rules, the registration of ``key`` is looked up at the first call.
        self._registration = (
            None if self._compiled is None else Registration(self._compiled, self._sources)
        )
        if self._compiled is not None and key:
            registry.register(key, self._compiled, self._sources)

    def _registered(self, key: str) -> Registration:
        """Rules and selector sources of this limit, or of ``key`` when it has no rules."""
        if self._registration is None:
            registered = self._registry.registered(key)
            check_cost(registered.compiled, self._cost, self._decider.algorithm)
            self._registration = Registration(
                registered.compiled, self._sources.merged_over(registered.sources)
            )
        return self._registration

    async def _call(self, key: str, call: CallSite | None) -> CallKey:
        """What identifies one call under ``key``."""
        registration = self._registered(key)
        compiled = registration.compiled
        values = (
            await resolve(compiled.selectors, registration.sources, key, call)
            if compiled.selectors
            else ()
        )
        decider = self._decider
        return new_call_key(  # CallKey(...) built in C: this is every call's path
            CallKey, (compiled, decider.namespace, key, values, self._cost, decider.algorithm)
        )

    async def _decide(self, key: str, call: CallSite | None, record: bool = True) -> Decision:
        return await self._decider.decide(await self._call(key, call), record, self._shadow)

    async def peek(self) -> Decision:
        """The decision ``decide()`` would give, recording nothing."""
        return await self._decide(GLOBAL_KEY if self._key is None else self._key, None, False)

    async def reset(self) -> None:
        """Forget the hits of this limit's identifiers (with ``limit()``'s selectors)."""
        key = GLOBAL_KEY if self._key is None else self._key
        await self._decider.reset(await self._call(key, None))

    async def decide(self) -> Decision:
        """Decide one call under this limit's key without raising: the hit is recorded only
        if ``Decision.allowed``. Selectors come from ``limit()``'s arguments."""
        return await self._decider.decide(
            await self._call(GLOBAL_KEY if self._key is None else self._key, None),
            True,
            self._shadow,
        )

    async def acquire(self, wait: float | bool | None = None) -> Decision:
        """Be admitted, waiting up to ``wait`` seconds (default: the limit's ``wait=``), or
        raise ``RateLimitExceeded``. What ``async with`` does on entry."""
        seconds = self._wait if wait is None else wait_seconds(wait)
        return await admitted(self.decide, seconds)

    async def __aenter__(self) -> Decision:
        return await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    @overload
    def __call__(
        self, func: Callable[P, Awaitable[R]]
    ) -> Callable[P, Coroutine[object, None, R]]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, Coroutine[object, None, R]]: ...

    def __call__(self, func: Callable[P, Any]) -> Callable[P, Coroutine[object, None, Any]]:
        parameters = wrappable(
            func,
            "limit",
            "the limit would count the call, not the iteration; limit the code that consumes "
            "it instead",
        )
        key = self._key if self._key is not None else function_name(func)
        if self._compiled is not None and self._key is None:
            self._registry.register(key, self._compiled, self._sources)
        is_coroutine = inspect.iscoroutinefunction(func)
        shadow = self._shadow

        @functools.wraps(func)
        async def limited(*args: P.args, **kwargs: P.kwargs) -> Any:
            site = call_site(func, parameters, args, kwargs)  # a call that cannot bind: free
            decision = await self._decider.decide(await self._call(key, site), True, shadow)
            if not decision.allowed and not decision.shadow:
                if not self._wait:
                    raise RateLimitExceeded(decision)
                await admitted(lambda: self._decide(key, site), self._wait, first=decision)
            return await run_body(func, is_coroutine, args, kwargs)

        return limited
