"""The front end: ``RateLimit``, which hands out ``Limit`` objects (``limit.py``).

Example::

    rl = RateLimit.from_url("memory://", namespace="shop")

    @rl.limit("apikey:100/h & (10/s | 15/m)", apikey=get_api_key)
    async def search(q: str) -> list[str]: ...

    async with rl.limit("username:10/5m", username="vova", key="login"):
        ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack

from ratelimit.algorithms import named
from ratelimit.backends import Backend, backend_for, backend_from_url
from ratelimit.backends.base import (
    NOTHING_TO_SET_UP,
    SetUpStore,
    check_settles,
    check_supported,
    clock_of,
    override_store,
)
from ratelimit.backends.leases import LeasedBackend
from ratelimit.core.checks import check_cost, counter_update
from ratelimit.core.costs import CostValue, per_leaf
from ratelimit.core.decision import Decision, Hook
from ratelimit.core.plan import CompiledTree, Cost
from ratelimit.core.settings import SETTING_NAMES, Settings, SettingsKeywords, settings_with
from ratelimit.front.limiting import LimitMaker
from ratelimit.front.registry import Registry
from ratelimit.overrides.cache import OverrideCache
from ratelimit.overrides.handle import Overrides
from ratelimit.overrides.lowered import Overriding
from ratelimit.penalties.penalizer import Penalties, penalizer_cached
from ratelimit.pipeline.background import BackgroundCounter
from ratelimit.pipeline.decider import CallKey, Decider, new_call_key
from ratelimit.pipeline.denials import DenialCache
from ratelimit.pipeline.hooks import Hooks
from ratelimit.pipeline.policy import FailurePolicy

KEYWORD_SETTINGS = tuple(name for name in SETTING_NAMES if name != "namespace")
_UNSET: Any = object()
"""A setting :meth:`RateLimit.from_url` was not given (``None`` is a value of some)."""


class RateLimit(LimitMaker):
    """Rate limits shared by every process that points at the same storage.

    ``storage`` is a ``redis.asyncio.Redis``, a ``redis.asyncio.RedisCluster`` or a backend
    object (see :class:`~ratelimit.backends.Backend`). ``namespace`` keeps this application's
    counters apart from others on the same Redis.

    The keywords are :class:`~ratelimit.Settings` (documented there): ``algorithm``,
    ``sync_rate``, ``on_error``, ``local_share``, ``timeout``, ``denial_cache``, ``hooks``,
    ``background``, ``use_scripts``, ``auto_pipeline``, ``disable_locks``, ``lock_ttl``,
    ``lock_polling_interval``, ``lock_timeout``, ``spread``, ``shadow``,
    ``override_refresh``, ``lease`` and ``clock``; or ``settings=`` gives a ``Settings`` made
    beforehand (keywords given too replace its values). Every setting is checked here, so
    a bad one fails when the limiter is made.

    Example::

        rl = RateLimit(redis.asyncio.Redis(), namespace="shop", on_error="deny")

        @rl.limit("10/s")
        async def ping() -> str: ...
    """

    def __init__(
        self,
        storage: object,
        namespace: str | None = None,
        *,
        settings: Settings | None = None,
        **keywords: Unpack[SettingsKeywords],
    ) -> None:
        self.settings = settings_with(settings, namespace, dict(keywords))
        self._start(backend_for(storage, self.settings))

    def _start(self, backend: Backend) -> None:
        settings = self.settings
        self.namespace = settings.namespace
        self.algorithm = settings.algorithm
        algorithm = named(settings.algorithm)
        check_supported(backend, algorithm)
        if settings.lease:
            backend = LeasedBackend(backend, settings.lease)
        self._hooks = Hooks(settings.hooks)
        self._policy = FailurePolicy(settings.on_error, self._hooks, settings.local_share)
        self._denials = DenialCache(settings.denial_cache, clock=clock_of(backend))
        if settings.lease:  # room held in leases elsewhere comes back within a hold
            self._denials.longest = settings.lease
        self._background = (
            BackgroundCounter(
                lambda plan: self._policy.decide(backend, plan), self._denials.remember
            )
            if settings.background
            else None
        )
        store = override_store(backend)
        cache = (
            None
            if store is None
            else OverrideCache(
                store,
                settings.namespace,
                settings.override_refresh,
                clock_of(backend),
                lambda: self._policy.failing,
                lambda: self._decider.denials.clear(),  # the one in use (the sync API's swaps it)
            )
        )
        self.overrides = Overrides(cache, algorithm, type(backend).__name__)
        """This namespace's overrides: :class:`~ratelimit.overrides.handle.Overrides`."""
        self._decider = Decider(
            settings.namespace,
            algorithm,
            backend,
            self._policy,
            self._denials,
            self._hooks,
            self._background,
            cache,
        )
        self.penalties = Penalties(self._decider)
        """Holds of ``penalty=``: :class:`~ratelimit.penalties.penalizer.Penalties`."""
        self._registry = Registry()
        if self._policy.local is not None:  # on_error="local": its clock, probe and tasks
            decider = self._decider
            self._policy.local.attach(
                clock_of(backend), lambda: decider.ping(settings.timeout), decider.finish_later
            )

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
        """Open storage by URL: ``memory://``, ``redis://``, ``rediss://``, ``unix://``,
        ``redis+sentinel://`` or ``postgresql://`` (:data:`~ratelimit.backends.urls.SCHEMES`).

        The keywords named here are :class:`~ratelimit.Settings`, as for :class:`RateLimit`
        (typed, so a type checker catches ``denial_cache="10"``); the other ``options`` go
        to the store's client (``redis.asyncio.from_url``, asyncpg's pool). The settings are
        checked before a client is opened; the client opened here is closed by
        :meth:`aclose` (or by leaving ``async with``).
        """
        given = locals()
        chosen = {name: given[name] for name in KEYWORD_SETTINGS if given[name] is not _UNSET}
        limiter = cls.__new__(cls)
        limiter.settings = settings_with(settings, namespace, chosen)
        limiter._start(backend_from_url(url, limiter.settings, **options))
        return limiter

    @property
    def storage(self) -> Backend:
        """The backend this limiter decides with: the one given, or the one
        :meth:`from_url` opened (a :class:`~ratelimit.MemoryBackend`,
        :class:`~ratelimit.RedisScriptBackend`, ...), for its own inspectors."""
        return self._decider.backend

    @property
    def storage_failing(self) -> bool:
        """Whether the storage is failing now: a decision failed (and was answered by
        ``on_error``), and the storage has not answered since."""
        return self._policy.failing

    @property
    def cached_refusals(self) -> int:
        """How many refusals the denial cache remembers now (expired ones until read)."""
        return len(self._denials)

    @property
    def queued(self) -> int:
        """With ``background``: calls admitted and not counted yet (0 without)."""
        return 0 if self._background is None else len(self._background)

    async def flush(self) -> None:
        """With ``background``: count every queued call now (nothing to do without)."""
        if self._background is not None:
            await self._background.flush()

    def check(self, compiled: CompiledTree, cost: Cost | CostValue = 1) -> Cost:
        """Raise ``ConfigurationError`` unless every rule of ``compiled`` can admit a call of
        ``cost`` under this limiter's algorithm (one number, a mapping from units to
        amounts, or one number per rule: see :data:`~ratelimit.core.plan.Cost`), and return it
        as :meth:`decide` takes it. Front ends call it when a limit is made, so that a bad
        cost fails then, not at the first call.

        Example::

            rl.check(compile_tree(to_tree("user:5/s")), cost=2)
        """
        algorithm = self._decider.algorithm
        if isinstance(cost, tuple):
            check_cost(compiled, cost, algorithm)
            return cost
        return per_leaf(compiled, cost, algorithm, "cost")

    def check_settling(self) -> None:
        """Raise ``ConfigurationError`` unless calls this limiter admits can be settled (a
        store that settles, no ``background`` counting): what front ends that refund or
        settle from a response (``count_when=``, ``settle=``) check when made."""
        self._decider.check_settling(lambda actual: actual)

    async def decide(
        self,
        compiled: CompiledTree,
        key: str,
        values: tuple[str | None, ...] = (),
        *,
        cost: Cost | Mapping[str, float] = 1,
        shadow: bool | None = None,
        record: bool = True,
        within: float | None = None,
        override: Overriding = False,
        penalty: str | None = None,
        penalty_of: tuple[CompiledTree, tuple[str | None, ...]] | None = None,
    ) -> Decision:
        """Decide one call of ``key`` under ``compiled``: the one door into the decision
        pipeline (denial cache, background counting, failure policy, storage, hooks) for
        front ends of your own. ``values``: the selector values, in the order of
        ``compiled.selectors`` (``None`` or ``""``: that rule does not apply). ``cost``: as
        :meth:`check` returns it (check it first: this does not; a mapping from units to
        amounts is checked here, at each call). ``shadow``: ``None`` for
        the limiter's setting. ``record=False`` only says what would be decided.
        ``within``: seconds the whole decision may take; past them, the failure policy
        (``on_error``) answers, as for any storage failure, and hooks see that answer.
        ``override``: ``compiled`` is the rules of an override
        (:meth:`rl.overrides.find <ratelimit.overrides.handle.Overrides.find>`), which the
        decision then says (``Decision.override``); or the rule of them that can never
        admit ``cost`` (:func:`ratelimit.overrides.lowered.lowered`), which refuses the call.
        ``penalty``: as ``limit(penalty=...)`` (:mod:`ratelimit.penalties.penalizer`), checked once
        against ``compiled``'s selectors, or ``penalty_of``'s: the limit's own rules and their
        selector values, when ``compiled`` is an override's. What a penalty holds back is
        read from the limit's own rules, whatever rules decide the call; a call whose value of
        the penalty's selector is not found is not held, and its refusal counts nowhere.

        Example::

            tree = compile_tree(to_tree("user:5/s"))
            decision = await rl.decide(tree, "search", ("vova",))
        """
        algorithm = self._decider.algorithm
        if isinstance(cost, Mapping):
            cost = per_leaf(compiled, cost, algorithm, "cost")
        call = new_call_key(CallKey, (compiled, self.namespace, key, values, cost, algorithm))
        if shadow is None:
            shadow = self.settings.shadow
        if penalty is not None:
            own, own_values = (compiled, values) if penalty_of is None else penalty_of
            if len(own_values) != len(own.selectors):
                raise ValueError(
                    f"penalty_of: {len(own_values)} values for the {len(own.selectors)} "
                    f"selectors of {own.tree}"
                )
            penalizer = penalizer_cached(self._decider, penalty, own, key)
            value = penalizer.value_in(own, own_values)
            return await penalizer.decide(call, record, shadow, within, override, value)
        return await self._decider.decide(call, record, shadow, within, override)

    async def settle(self, decision: Decision, actual: CostValue) -> bool:
        """Settle a call :meth:`decide` admitted at its real cost ``actual`` (a number, or
        a mapping from units to amounts): the difference from what it reserved is recorded
        on every identifier it counted on, in one atomic step. What
        :meth:`Limit.settle <ratelimit.front.limit.Limit.settle>` does, for front ends of your
        own; see :mod:`ratelimit.core.settling`.

        Example::

            decision = await rl.decide(tree, "chat", ("key-1",), cost={"tokens": 4000})
            ...
            await rl.settle(decision, {"tokens": 1234})
        """
        return await self._decider.settle(decision, actual)

    async def record(
        self,
        compiled: CompiledTree,
        key: str,
        values: tuple[str | None, ...] = (),
        *,
        cost: Cost | Mapping[str, float] = 1,
    ) -> bool:
        """Count one call of ``key`` under ``compiled`` past the limit if need be, deciding
        nothing: for usage reported after the fact that must never be lost (Envoy's
        ``apply_on_stream_done``), as a settle's excess is counted. ``cost`` may exceed
        the rules' counts. ``True`` once counted; ``False`` when the storage failed
        (logged; raised under ``on_error="raise"``).

        Example::

            await rl.record(tree, "chat", ("key-1",), cost={"tokens": 5400})
        """
        algorithm = self._decider.algorithm
        cost = per_leaf(compiled, cost, algorithm, "the recorded cost", settled=True)
        check_settles(self._decider.backend)
        call = new_call_key(CallKey, (compiled, self.namespace, key, values, cost, algorithm))
        return await self._decider.record(call)

    async def ping(self, within: float | None = None) -> None:
        """Ask the storage one question that counts nothing, within ``within`` seconds,
        past the denial cache and the failure policy: ``BackendError`` when it does not
        answer. An answer ends an outage the failure policy saw (``storage_failing``
        turns false). What a health check calls.

        Example::

            try:
                await rl.ping(within=0.5)
            except BackendError:
                ...  # report the storage down
        """
        await self._decider.ping(within)

    async def setup(self) -> str:
        """Prepare the store now and return what was done, in words: on Postgres, open the
        pool and put the table and functions in place (nothing when they are there
        already), within the backend's ``setup_timeout``; stores that need nothing (Redis,
        memory) do nothing. Idempotent. Calls set the store up by themselves at first use;
        calling this at start fails early (``BackendError``) instead, and ``ratelimit
        migrate`` does the same from the command line.

        Example::

            async with RateLimit.from_url(url, algorithm="sliding-window") as rl:
                print(await rl.setup())
        """
        self._decider.check_open()
        backend = self._decider.backend
        if isinstance(backend, SetUpStore):
            return await backend.setup()
        return NOTHING_TO_SET_UP

    async def aclose(self) -> None:
        """Release the storage this limiter opened (after counting what is queued, with
        ``background``, a last sync, with ``sync_rate``, and giving back the concurrency
        slots of calls that left while taking them). Using the limiter afterwards raises
        ``LimiterClosedError``; closing it again does nothing."""
        if self._decider.closed:
            return
        self._decider.closed = True
        if self._decider.overrides is not None:
            await self._decider.overrides.aclose()
        if self._background is not None:
            await self._background.aclose()
        await self._decider.finish()
        await self._decider.backend.aclose()

    async def __aenter__(self) -> RateLimit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

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
        return await self._decider.update_counter(
            counter_update(self.namespace, key, window_size, value, weight)
        )

    async def sliding_window(
        self, key: str, window_size: float, weight: float | None = None
    ) -> float:
        """Kong's ``sliding_window``: the rate :meth:`increment` would return, adding nothing."""
        return await self._decider.update_counter(
            counter_update(self.namespace, key, window_size, 0, weight)
        )
