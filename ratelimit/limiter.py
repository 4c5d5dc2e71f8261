"""The front end: ``RateLimit`` and the ``Limit`` it hands out as decorator and ``async with``.

Example::

    rl = RateLimit.from_url("memory://", namespace="shop")

    @rl.limit("apikey:100/h & (10/s | 15/m)", apikey=get_api_key)
    async def search(q: str) -> list[str]: ...

    async with rl.limit("username:10/5m", username="vova", key="login"):
        ...
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from ratelimit.algorithms import ALGORITHMS, SLIDING_LOG
from ratelimit.backends import (
    Backend,
    EngineOptions,
    backend_for,
    backend_from_url,
)
from ratelimit.backends.base import Clock
from ratelimit.decision import Decision
from ratelimit.denials import DenialCache
from ratelimit.errors import (
    ConfigurationError,
    RateLimitExceeded,
    RuleConflictError,
    UnknownKeyError,
)
from ratelimit.hooks import Hook, Hooks
from ratelimit.plan import CompiledTree, cached_plan, compile_tree
from ratelimit.policy import FailurePolicy
from ratelimit.rules import RuleLike, to_tree
from ratelimit.selectors import CallSite, Parameters, SelectorSources, resolve
from ratelimit.settings import (
    check_cost,
    check_cost_type,
    check_timeout,
    counter_update,
    synced_backend,
)
from ratelimit.waiting import admitted, wait_seconds

P = ParamSpec("P")
R = TypeVar("R")

GLOBAL_KEY = ""


@dataclass(frozen=True, slots=True)
class _Registration:
    compiled: CompiledTree
    sources: SelectorSources


class RateLimit:
    """Rate limits shared by every process that points at the same storage.

    ``storage`` is a ``redis.asyncio.Redis``, a ``redis.asyncio.RedisCluster`` or a backend
    object (see :class:`~ratelimit.backends.Backend`). ``namespace`` keeps this application's
    counters apart from others on the same Redis. ``clock`` (seconds) replaces the storage's
    clock, for tests that step time.

    ``algorithm``: ``"sliding-log"`` (default; exact, memory O(N) per identifier),
    ``"sliding-window"`` (two counters per window size: O(1) memory, approximate) or
    ``"fixed-window"``.

    ``on_error``: what a decision does when Redis fails or misses its deadline: ``"allow"``
    (default, fail-open), ``"deny"`` or ``"raise"`` (``BackendError``); such decisions say
    ``degraded=True``. ``timeout`` (seconds, default 0.25; ``None`` for none) bounds each
    decision's work on Redis, so a hung Redis never hangs a caller; waiting for the command
    engine's lock is not part of it and never fails open.

    ``denial_cache``: how many refusals to remember in-process until they lift, answering
    the same call again without asking Redis (0 turns it off).

    ``hooks``: callables given every ``Decision`` (allowed, denied or degraded, with its
    rule, key and retry_after), for metrics and logs; one that raises is logged and skipped.

    ``sync_rate`` (Kong's three modes, window counters only): ``0`` (default) asks Redis on
    every decision; ``> 0`` decides in-process on local counters and syncs them with Redis
    every ``sync_rate`` seconds in the background (faster; each process may admit up to a
    limit per interval before it sees the others); ``< 0`` is local only, no Redis at all.

    With a Redis client, ``use_scripts=True`` (default) decides with one atomic Lua script;
    ``disable_locks`` then changes nothing. ``use_scripts=False`` sends no Lua: plain
    commands under a Redis lock per (namespace, key), held at most ``lock_ttl`` seconds if
    its holder dies, retried every ``lock_polling_interval`` seconds (with jitter) and given
    up after ``lock_timeout`` seconds with ``LockTimeoutError``; ``disable_locks=True``
    drops that lock, which is faster but admits a bounded overshoot under concurrency.

    Example::

        rl = RateLimit(redis.asyncio.Redis(), namespace="shop")

        @rl.limit("10/s")
        async def ping() -> str: ...
    """

    def __init__(
        self,
        storage: object,
        namespace: str = "",
        *,
        algorithm: str = SLIDING_LOG,
        sync_rate: float = 0,
        on_error: str = "allow",
        timeout: float | None = 0.25,
        denial_cache: int = 10_000,
        hooks: Sequence[Hook] = (),
        use_scripts: bool = True,
        disable_locks: bool = False,
        lock_ttl: float = 10.0,
        lock_polling_interval: float = 0.1,
        lock_timeout: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be text, not {type(namespace).__name__}")
        if algorithm not in ALGORITHMS:
            raise ConfigurationError(
                f"unknown algorithm {algorithm!r}: use one of {', '.join(ALGORITHMS)}"
            )
        self.namespace = namespace
        self.algorithm = algorithm
        check_timeout(timeout)
        engine = EngineOptions(
            use_scripts, disable_locks, lock_ttl, lock_polling_interval, lock_timeout, timeout
        )
        self.policy = FailurePolicy(on_error)
        self.backend: Backend = backend_for(storage, clock=clock, engine=engine)
        self._unused: Backend | None = None
        if sync_rate:
            self.backend, self._unused = synced_backend(self.backend, sync_rate, algorithm)
        self.denials = DenialCache(denial_cache, clock=getattr(self.backend, "clock", None))
        self.hooks = Hooks(hooks)
        self._registry: dict[str, _Registration] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "",
        *,
        algorithm: str = SLIDING_LOG,
        sync_rate: float = 0,
        on_error: str = "allow",
        timeout: float | None = 0.25,
        denial_cache: int = 10_000,
        hooks: Sequence[Hook] = (),
        use_scripts: bool = True,
        disable_locks: bool = False,
        lock_ttl: float = 10.0,
        lock_polling_interval: float = 0.1,
        lock_timeout: float = 10.0,
        clock: Clock | None = None,
        **options: Any,
    ) -> RateLimit:
        """Open storage by URL: ``memory://``, ``redis://``, ``rediss://`` or ``unix://``.

        The engine and lock settings are those of :class:`RateLimit`; ``options`` go to
        ``redis.asyncio.from_url``. The client opened here is closed by :meth:`aclose` (or
        by leaving ``async with``).
        """
        check_timeout(timeout)
        engine = EngineOptions(
            use_scripts, disable_locks, lock_ttl, lock_polling_interval, lock_timeout, timeout
        )
        backend = backend_from_url(url, clock=clock, engine=engine, **options)
        return cls(
            backend,
            namespace,
            algorithm=algorithm,
            sync_rate=sync_rate,
            on_error=on_error,
            denial_cache=denial_cache,
            hooks=hooks,
        )

    async def aclose(self) -> None:
        """Release the storage this limiter opened (after a last sync, with ``sync_rate``)."""
        await self.backend.aclose()
        if self._unused is not None:
            await self._unused.aclose()

    async def __aenter__(self) -> RateLimit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def limit(
        self,
        rules: RuleLike | None = None,
        key: str | None = None,
        selector: object | None = None,
        *,
        cost: float = 1,
        wait: float | bool = False,
        **selectors: object,
    ) -> Limit:
        """A limit to use as ``@decorator`` or in ``async with``.

        ``rules``: text such as ``"apikey:100/h & (10/s | 15/m)"``, a ``Rule``/``And``/``Or``
        tree, or a list meaning ``Or``; parsed now, so a bad rule fails at import.
        ``key``: shares counters between functions (default: the function's
        ``module.qualname``; for ``async with``, ``""``, shared by every such block).
        ``limit(key=...)`` without rules reuses the rules and selectors registered for that
        key. ``selector``: an object whose items, attributes or methods give selector values.
        ``cost``: how many hits one call is worth, at most every rule's count (a whole
        number for the sliding log; fractions allowed for the window counters).
        ``wait``: how long a refused call may queue for admission, in seconds (``True``: as
        long as it takes); see :mod:`ratelimit.waiting`.
        ``**selectors``: selector values as literals, callables or async callables.
        """
        return Limit(self, rules, key, selector, selectors, cost, wait)

    async def increment(
        self, key: str, window_size: float, value: float = 1, weight: float | None = None
    ) -> float:
        """Kong's ``increment``: add ``value`` to the current window of ``window_size``
        seconds counted for ``key``, and return the sliding rate after it.

        The counter is the one a selector-less rule of ``key`` with that span uses under
        ``algorithm="sliding-window"``, so your own policies and your limits can share it.
        ``value`` may be fractional or negative (a refund). ``weight`` is the previous
        window's weight (default ``(size - elapsed) / size``; ``0`` gives a fixed window).
        """
        rate = await self.backend.update_counter(
            counter_update(self.namespace, key, window_size, value, weight)
        )
        if value < 0:
            self.denials.forget(self.namespace, key)  # a refund can lift cached refusals
        return rate

    async def sliding_window(
        self, key: str, window_size: float, weight: float | None = None
    ) -> float:
        """Kong's ``sliding_window``: the rate :meth:`increment` would return, adding nothing."""
        return await self.backend.update_counter(
            counter_update(self.namespace, key, window_size, 0, weight)
        )

    def _register(self, key: str, compiled: CompiledTree, sources: SelectorSources) -> None:
        registered = self._registry.get(key)
        if registered is None:
            self._registry[key] = _Registration(compiled, sources)
        elif registered.compiled is not compiled and registered.compiled.tree != compiled.tree:
            raise RuleConflictError(key, registered.compiled.tree, compiled.tree)

    def _registered(self, key: str) -> _Registration:
        registration = self._registry.get(key)
        if registration is None:
            raise UnknownKeyError(key)
        return registration


class Limit:
    """Rules bound to a :class:`RateLimit`: a decorator, an ``async with`` block, or
    :meth:`decide` for a decision without an exception.

    As a decorator, a refused call raises :class:`RateLimitExceeded` and the function body
    does not run; a plain ``def`` becomes a coroutine function. ``async with`` raises on
    entry in the same way.
    """

    def __init__(
        self,
        owner: RateLimit,
        rules: RuleLike | None,
        key: str | None,
        selector: object | None,
        selectors: dict[str, object],
        cost: float = 1,
        wait: float | bool = False,
    ) -> None:
        check_cost_type(cost, owner.algorithm)
        self._wait = wait_seconds(wait)
        if rules is None and key is None:
            raise TypeError("limit() needs rules, or key= naming rules registered elsewhere")
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be text, not {type(key).__name__}")
        self._owner = owner
        self._key = key
        self._sources = SelectorSources(selectors, selector)
        self._cost = cost
        self._compiled = None if rules is None else compile_tree(to_tree(rules))
        if self._compiled is not None:
            check_cost(self._compiled, cost)
        # Without rules, the registration of ``key`` is looked up at the first call.
        self._registration = (
            None if self._compiled is None else _Registration(self._compiled, self._sources)
        )
        if self._compiled is not None and key:
            owner._register(key, self._compiled, self._sources)

    def _registered(self, key: str) -> _Registration:
        """Rules and selector sources of this limit, or of ``key`` when it has no rules."""
        if self._registration is None:
            registered = self._owner._registered(key)
            check_cost(registered.compiled, self._cost)
            self._registration = _Registration(
                registered.compiled, self._sources.merged_over(registered.sources)
            )
        return self._registration

    async def _decide(self, key: str, call: CallSite | None) -> Decision:
        registration = self._registered(key)
        compiled = registration.compiled
        values = (
            await resolve(compiled.selectors, registration.sources, key, call)
            if compiled.selectors
            else ()
        )
        owner = self._owner
        this = (compiled, owner.namespace, key, values, self._cost, owner.algorithm)
        decision = owner.denials.get(this)  # still refused: the storage is not asked again
        if decision is None:
            decision = await owner.policy.decide(owner.backend, cached_plan(*this))
            if not decision.allowed:
                owner.denials.remember(this, decision)
        if owner.hooks:
            owner.hooks(decision)
        return decision

    async def decide(self) -> Decision:
        """Decide one call under this limit's key without raising: the hit is recorded only
        if ``Decision.allowed``. Selectors come from ``limit()``'s arguments."""
        return await self._decide(GLOBAL_KEY if self._key is None else self._key, None)

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
    def __call__(self, func: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __call__(self, func: Callable[P, Any]) -> Callable[P, Coroutine[Any, Any, Any]]:
        if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
            raise TypeError(
                f"cannot limit generator function {_name(func)}: the limit would count the "
                "call, not the iteration; limit the code that consumes it instead"
            )
        if not callable(func):
            raise TypeError(f"limit() decorates functions, not {type(func).__name__}")
        key = self._key if self._key is not None else _name(func)
        if self._compiled is not None and self._key is None:
            self._owner._register(key, self._compiled, self._sources)
        parameters = Parameters(inspect.signature(func))
        is_coroutine = inspect.iscoroutinefunction(func)

        @functools.wraps(func)
        async def limited(*args: P.args, **kwargs: P.kwargs) -> Any:
            site = CallSite(parameters, args, kwargs)
            decision = await self._decide(key, site)
            if not decision.allowed:
                if not self._wait:
                    raise RateLimitExceeded(decision)
                await admitted(lambda: self._decide(key, site), self._wait)
            if is_coroutine:
                return await func(*args, **kwargs)
            result = func(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return limited


def _name(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', None) or '?'}.{getattr(func, '__qualname__', func)}"
