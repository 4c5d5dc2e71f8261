"""The front end: ``RateLimit``, which hands out ``Limit`` objects (``limit.py``).

Example::

    rl = RateLimit.from_url("memory://", namespace="shop")

    @rl.limit("apikey:100/h & (10/s | 15/m)", apikey=get_api_key)
    async def search(q: str) -> list[str]: ...

    async with rl.limit("username:10/5m", username="vova", key="login"):
        ...
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

from ratelimit.algorithms import ALGORITHMS, SLIDING_LOG
from ratelimit.backends import (
    Backend,
    backend_for,
    backend_from_url,
)
from ratelimit.backends.base import Clock
from ratelimit.background import BackgroundCounter
from ratelimit.decider import Decider
from ratelimit.denials import DenialCache
from ratelimit.errors import (
    ConfigurationError,
)
from ratelimit.hooks import Hook, Hooks
from ratelimit.limit import Limit
from ratelimit.policy import FailurePolicy
from ratelimit.registry import Registry
from ratelimit.rules import RuleLike
from ratelimit.settings import (
    check_limiter,
    counter_update,
    engine_options,
    synced_backend,
)


def _check(
    namespace: object,
    algorithm: object,
    denial_cache: object,
    hooks: tuple[object, ...],
    background: object,
    clock: object,
) -> None:
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be text, not {type(namespace).__name__}")
    if algorithm not in ALGORITHMS:
        raise ConfigurationError(
            f"unknown algorithm {algorithm!r}: use one of {', '.join(ALGORITHMS)}"
        )
    check_limiter(denial_cache, background, clock)
    Hooks(hooks)  # type: ignore[arg-type]  # checks that each is callable


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

    ``background``: admit calls at once and count them off the request path; refusals
    reach the denial cache a round trip later (an overshoot of about that many calls).

    ``sync_rate`` (Kong's three modes, window counters only): ``0`` (default) asks Redis on
    every decision; ``> 0`` decides in-process on local counters and syncs them with Redis
    every ``sync_rate`` seconds in the background (faster; each process may admit up to a
    limit per interval before it sees the others); ``< 0`` is local only, no Redis at all.

    With a Redis client, ``use_scripts=True`` (default) decides with one atomic Lua script;
    ``disable_locks`` then changes nothing. ``auto_pipeline=True`` (default) sends the
    scripts of decisions made in the same event-loop turn together, in one pipeline (each
    still atomic, with its own reply or error); a decision made alone is sent at once.
    ``use_scripts=False`` sends no Lua: plain commands under a Redis lock per (namespace,
    key), held at most ``lock_ttl`` seconds if its holder dies, retried every
    ``lock_polling_interval`` seconds (with jitter) and given up after ``lock_timeout``
    seconds with ``LockTimeoutError``; ``disable_locks=True`` drops that lock, which is
    faster but admits a bounded overshoot under concurrency.

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
        background: bool = False,
        use_scripts: bool = True,
        auto_pipeline: bool = True,
        disable_locks: bool = False,
        lock_ttl: float = 10.0,
        lock_polling_interval: float = 0.1,
        lock_timeout: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        hooks = tuple(hooks)
        _check(namespace, algorithm, denial_cache, hooks, background, clock)
        self.namespace = namespace
        self.algorithm = algorithm
        engine = engine_options(
            use_scripts,
            auto_pipeline,
            disable_locks,
            lock_ttl,
            lock_polling_interval,
            lock_timeout,
            timeout,
        )
        self.policy = FailurePolicy(on_error)
        self.backend: Backend = backend_for(storage, clock=clock, engine=engine)
        self._unused: Backend | None = None
        if sync_rate:
            self.backend, self._unused = synced_backend(self.backend, sync_rate, algorithm)
        self.denials = DenialCache(denial_cache, clock=getattr(self.backend, "clock", None))
        self.hooks = Hooks(hooks)
        self.background = (
            BackgroundCounter(
                lambda plan: self.policy.decide(self.backend, plan), self.denials.remember
            )
            if background
            else None
        )
        self.decider = Decider(
            namespace,
            algorithm,
            self.backend,
            self.policy,
            self.denials,
            self.hooks,
            self.background,
        )
        self.registry = Registry()

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
        background: bool = False,
        use_scripts: bool = True,
        auto_pipeline: bool = True,
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
        engine = engine_options(
            use_scripts,
            auto_pipeline,
            disable_locks,
            lock_ttl,
            lock_polling_interval,
            lock_timeout,
            timeout,
        )
        hooks = tuple(hooks)
        _check(namespace, algorithm, denial_cache, hooks, background, clock)
        FailurePolicy(on_error)  # checked before a client is opened
        backend = backend_from_url(url, clock=clock, engine=engine, **options)
        return cls(
            backend,
            namespace,
            algorithm=algorithm,
            sync_rate=sync_rate,
            on_error=on_error,
            denial_cache=denial_cache,
            hooks=hooks,
            background=background,
        )

    async def aclose(self) -> None:
        """Release the storage this limiter opened (after counting what is queued, with
        ``background``, and a last sync, with ``sync_rate``). Using the limiter afterwards
        raises ``LimiterClosedError``; closing it again does nothing."""
        if self.decider.closed:
            return
        self.decider.closed = True
        if self.background is not None:
            await self.background.aclose()
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
        return Limit(self.decider, self.registry, rules, key, selector, selectors, cost, wait)

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
        return await self.decider.update_counter(
            counter_update(self.namespace, key, window_size, value, weight)
        )

    async def sliding_window(
        self, key: str, window_size: float, weight: float | None = None
    ) -> float:
        """Kong's ``sliding_window``: the rate :meth:`increment` would return, adding nothing."""
        return await self.decider.update_counter(
            counter_update(self.namespace, key, window_size, 0, weight)
        )
