"""``ratelimit.sync.RateLimit``: the same limits for plain functions and threads.

::

    from ratelimit.sync import RateLimit

    rl = RateLimit.from_url("redis://localhost:6379", namespace="shop")

    @rl.limit("user:3/m")
    def search(user: str, q: str) -> list[str]: ...      # still a def

    with rl.limit("10/s", key="export"):
        ...

It is :class:`ratelimit.RateLimit` run on an event loop in a thread of its own
(:mod:`ratelimit.sync.portal`): the same rules, selectors, algorithms, stores, settings,
costs, settle, overrides, hooks and failure policy, one implementation. Any number of
threads share one limiter. A plain decision of a decorated function is made in the calling
thread, without waking the loop, where the store allows (:mod:`ratelimit.sync.direct`).
Selector callables, ``cost=`` and ``settle=`` callables run on that loop's thread, with the
calling thread's context variables (Flask's ``request``, ``g``): keep them quick.

**Fork-safe.** A process forked after the limiter was used (a gunicorn worker, made from a
preloaded app) gets its own loop and connections at its first call: a limiter made by
:meth:`RateLimit.from_url` opens them anew (``memory://``: a new, empty store, as a new
process has); one made from a storage object raises ``ConfigurationError`` in the child,
as the parent's connections cannot be shared. Calling it from a running event loop raises
``EventLoopError``, pointing to the async API. A limiter no longer referenced (its limits
included) and never closed is closed when it is collected: its thread ends and its
connections are closed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack

from ratelimit.core.costs import CostLike, CostValue
from ratelimit.core.decision import Decision, Hook
from ratelimit.core.plan import CompiledTree, Cost
from ratelimit.core.settings import Settings, SettingsKeywords
from ratelimit.errors import ConfigurationError
from ratelimit.front.chosen import RulesLike
from ratelimit.front.concurrency import DEFAULT_LEASE
from ratelimit.front.limit import Limit as AsyncLimit
from ratelimit.front.limiter import _UNSET, KEYWORD_SETTINGS
from ratelimit.front.limiter import RateLimit as AsyncRateLimit
from ratelimit.front.wrapping import block_key
from ratelimit.sync.direct import DirectPath, direct_path
from ratelimit.sync.limits import Concurrency, Limit
from ratelimit.sync.overriding import Overrides
from ratelimit.sync.portal import Portal

T = TypeVar("T")
_limiters = 0
_count_lock = threading.Lock()


class RateLimit:
    """Synchronous rate limits shared by every process that points at the same storage.

    ``storage``: a backend object or a ``redis.asyncio`` client, as
    :class:`ratelimit.RateLimit` takes (a limiter made so cannot follow a ``fork()``; use
    :meth:`from_url` where processes fork). The keywords are :class:`~ratelimit.Settings`,
    checked here.

    Example::

        rl = RateLimit.from_url("redis://localhost:6379", namespace="shop")

        @rl.limit("user:3/m")
        def search(user: str, q: str) -> list[str]: ...   # still a def

        with rl.limit("10/s", key="export"):
            ...
    """

    def __init__(
        self,
        storage: object,
        namespace: str | None = None,
        *,
        settings: Settings | None = None,
        **keywords: Unpack[SettingsKeywords],
    ) -> None:
        def make() -> AsyncRateLimit:
            return AsyncRateLimit(storage, namespace, settings=settings, **keywords)

        self._open(make, reopens=False)

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str | None = None,
        *,
        settings: Settings | None = None,
        algorithm: str = _UNSET,
        sync_rate: float = _UNSET,
        on_error: str = _UNSET,
        local_share: float = _UNSET,
        timeout: float | None = _UNSET,
        denial_cache: int = _UNSET,
        hooks: Sequence[Hook] = _UNSET,
        background: bool = _UNSET,
        use_scripts: bool = _UNSET,
        auto_pipeline: bool = _UNSET,
        disable_locks: bool = _UNSET,
        lock_ttl: float = _UNSET,
        lock_polling_interval: float = _UNSET,
        lock_timeout: float = _UNSET,
        spread: bool | None = _UNSET,
        shadow: bool = _UNSET,
        override_refresh: float = _UNSET,
        lease: float = _UNSET,
        clock: Callable[[], float] | None = _UNSET,
        **options: Any,
    ) -> RateLimit:
        """Open storage by URL, as :meth:`ratelimit.RateLimit.from_url` (the same settings, typed,
        and client options); a forked child opens it again at its first call."""
        given = locals()
        chosen = {name: given[name] for name in KEYWORD_SETTINGS if given[name] is not _UNSET}

        def make() -> AsyncRateLimit:
            return AsyncRateLimit.from_url(url, namespace, settings=settings, **chosen, **options)

        limiter = cls.__new__(cls)
        limiter._open(make, reopens=True)
        return limiter

    def _open(self, make: Callable[[], AsyncRateLimit], reopens: bool) -> None:
        global _limiters
        with _count_lock:
            _limiters += 1
            number = _limiters
        self._make = make
        self._reopens = reopens
        self.twins: list[weakref.ref[Any]] = []
        """Its limits, oldest first: made again, in order, in a forked child."""
        self.portal = Portal(f"ratelimit.sync-{number}")
        self._rebuilding = threading.Lock()
        self.direct: DirectPath | None = None  # plain decisions in the calling thread
        try:
            self._limiter = self._built()  # settings checked here, in the caller's thread
        except BaseException:
            self.portal.close()  # no thread left behind by a bad setting
            raise
        self._pid = os.getpid()
        self.generation = 0
        """Counts the async limiters this one has had (a forked child makes another)."""
        _live.add(self)
        self._current = [self._limiter]  # what the finalizer closes, without self
        self._dropped = weakref.finalize(self, _abandon, self.portal, self._current)
        self._dropped.atexit = False  # at exit, _close_at_exit closes it, waiting

    def _built(self) -> AsyncRateLimit:
        async def build() -> AsyncRateLimit:  # made on its loop, which its client binds to
            return self._make()

        limiter = self.portal.run(build)
        self.direct = direct_path(limiter)  # before its first decision
        return limiter

    @property
    def limiter(self) -> AsyncRateLimit:
        """The :class:`ratelimit.RateLimit` this one runs (this process's own)."""
        if self._pid == os.getpid():
            return self._limiter
        with self._rebuilding:  # the threads of a forked child call at once: one builds
            if self._pid != os.getpid():
                if not self._reopens:
                    raise ConfigurationError(
                        "this ratelimit.sync.RateLimit was made from a storage object in the "
                        "parent process, whose connections a forked child cannot share: make "
                        "it with RateLimit.from_url (which opens them again after a fork), or "
                        "in each worker process"
                    )
                self._limiter = self._current[0] = self._built()
                self.generation += 1
                self._pid = os.getpid()
        return self._limiter

    def run(self, make: Callable[[AsyncRateLimit], Coroutine[Any, Any, T]]) -> T:
        """Run ``make(limiter)`` on the limiter's loop and wait for it: for your own calls
        of the async API."""
        limiter = self.limiter
        return self.portal.run(lambda: make(limiter))

    # --- what the limiter says about itself ---

    @property
    def settings(self) -> Settings:
        return self._limiter.settings

    @property
    def namespace(self) -> str:
        return self._limiter.namespace

    @property
    def algorithm(self) -> str:
        return self._limiter.algorithm

    @property
    def storage_failing(self) -> bool:
        return self.limiter.storage_failing

    @property
    def queued(self) -> int:
        return self.limiter.queued

    @property
    def overrides(self) -> Overrides:
        """This namespace's overrides (:class:`~ratelimit.overrides.handle.Overrides`), blocking."""
        return Overrides(self)

    # --- limits ---

    def limit(
        self,
        rules: RulesLike | None = None,
        key: str | None = None,
        selector: object | None = None,
        *,
        cost: CostLike = 1,
        settle: Callable[[Any], CostValue] | None = None,
        wait: float | bool = False,
        shadow: bool | None = None,
        penalty: str | None = None,
        count_when: Callable[[Any], bool] | None = None,
        lease: float | None = None,
        **selectors: object,
    ) -> Limit:
        """A limit as ``@decorator`` of a plain function or in ``with``: the arguments of
        :meth:`ratelimit.RateLimit.limit`; ``wait`` blocks a refused call's thread."""
        site = "" if key is not None else block_key(1)  # where its blocks count

        def make(limiter: AsyncRateLimit) -> AsyncLimit:
            return limiter._limit_at(
                site, rules, key, selector, cost, settle, wait, shadow, selectors, penalty,
                count_when, lease,
            )  # fmt: skip

        return Limit(self, make)

    def concurrency(
        self,
        limits: str,
        key: str | None = None,
        selector: object | None = None,
        *,
        lease: float = DEFAULT_LEASE,
        wait: float | bool = False,
        reserve: Mapping[str, int] | None = None,
        reserve_by: str = "priority",
        **selectors: object,
    ) -> Concurrency:
        """At most N bodies at once, as ``@decorator`` or in ``with``; the arguments of
        :meth:`ratelimit.RateLimit.concurrency`. The lease is renewed on the limiter's
        loop while the body runs in its thread."""
        site = "" if key is not None else block_key(1)  # where its blocks count
        made = (site, limits, key, selector, selectors, lease, wait, reserve, reserve_by)
        return Concurrency(self, lambda limiter: limiter._concurrency_at(*made))

    # --- the one door, for front ends (WSGI, Flask, Django) ---

    def check(self, compiled: CompiledTree, cost: Cost | CostValue = 1) -> Cost:
        """:meth:`ratelimit.RateLimit.check`: ``ConfigurationError`` unless every rule
        can admit ``cost``."""
        return self._limiter.check(compiled, cost)

    def decide(
        self,
        compiled: CompiledTree,
        key: str,
        values: tuple[str | None, ...] = (),
        *,
        cost: Cost | Mapping[str, float] = 1,
        shadow: bool | None = None,
        record: bool = True,
        within: float | None = None,
        override: bool = False,
    ) -> Decision:
        """:meth:`ratelimit.RateLimit.decide`, blocking (in the calling thread where it is a
        plain decision: :mod:`ratelimit.sync.direct`)."""
        self.limiter  # noqa: B018 - a forked child makes its own, and its direct path
        direct = self.direct
        if direct is not None and within is None and override is False and not self.portal.closed:
            self.portal.check_caller()
            decision = direct.decide(compiled, key, values, cost, shadow, record)
            if decision is not None:
                return decision
        return self.run(
            lambda limiter: limiter.decide(
                compiled, key, values, cost=cost, shadow=shadow, record=record, within=within,
                override=override,
            )
        )  # fmt: skip

    def settle(self, decision: Decision, actual: CostValue) -> bool:
        """:meth:`ratelimit.RateLimit.settle`, blocking: record what an admitted call
        really cost."""
        return self.run(lambda limiter: limiter.settle(decision, actual))

    def record(
        self,
        compiled: CompiledTree,
        key: str,
        values: tuple[str | None, ...] = (),
        *,
        cost: Cost | Mapping[str, float] = 1,
    ) -> bool:
        """:meth:`ratelimit.RateLimit.record`, blocking: count a call past the limit if
        need be, deciding nothing."""
        return self.run(lambda limiter: limiter.record(compiled, key, values, cost=cost))

    def ping(self, within: float | None = None) -> None:
        """:meth:`ratelimit.RateLimit.ping`, blocking: ``BackendError`` when the store
        does not answer within ``within`` seconds."""
        self.run(lambda limiter: limiter.ping(within))

    def setup(self) -> str:
        """:meth:`ratelimit.RateLimit.setup`, blocking: prepare the store now."""
        return self.run(lambda limiter: limiter.setup())

    def flush(self) -> None:
        """:meth:`ratelimit.RateLimit.flush`, blocking: count every queued call now."""
        self.run(lambda limiter: limiter.flush())

    def increment(
        self, key: str, window_size: float, value: float = 1, weight: float | None = None
    ) -> float:
        """:meth:`ratelimit.RateLimit.increment`, blocking."""
        return self.run(lambda limiter: limiter.increment(key, window_size, value, weight))

    def sliding_window(self, key: str, window_size: float, weight: float | None = None) -> float:
        """:meth:`ratelimit.RateLimit.sliding_window`, blocking."""
        return self.run(lambda limiter: limiter.sliding_window(key, window_size, weight))

    # --- closing ---

    def close(self) -> None:
        """Close the storage (after counting what is queued), fail the calls still waiting
        with ``LimiterClosedError``, and stop the loop's thread; using the limiter
        afterwards raises the same. Also done when the interpreter exits, so that counts
        queued by ``background=True`` are not lost. A client you passed in is yours to
        close: ``rl.run(lambda _: client.aclose())`` first."""
        if self._pid != os.getpid():
            return  # the parent's: nothing of this process to close
        limiter = self._limiter
        try:
            self.portal.close(limiter.aclose)
        finally:
            if self.direct is not None:
                self.direct.close()
        self._dropped.detach()

    def __enter__(self) -> RateLimit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_live: weakref.WeakSet[RateLimit] = weakref.WeakSet()
"""Every limiter not yet collected: what the at-exit and at-fork hooks go through (one
hook each for the module, none per limiter: dropped limiters leave nothing behind)."""


def _after_fork() -> None:
    for limiter in list(_live):
        limiter._rebuilding = threading.Lock()  # another thread may have held it


def _abandon(portal: Portal, current: list[AsyncRateLimit]) -> None:
    """A limiter collected without ``close()``: its loop closes the store and ends."""
    portal.abandon(current[0].aclose)


def _close_at_exit() -> None:
    """At exit: close every limiter still open, waiting (what ``background=True`` queued is
    counted); then :func:`join_abandoned` (registered before, so run after) waits for those
    collected without ``close()``."""
    for limiter in list(_live):
        if not limiter.portal.closed:
            with contextlib.suppress(Exception):
                limiter.close()


os.register_at_fork(after_in_child=_after_fork)
atexit.register(_close_at_exit)
