"""``RateLimit``'s settings, in one validated, frozen object, and the checks of ``limit()``.

:class:`Settings` is the one place each setting of :class:`~ratelimit.RateLimit` is named,
defaulted, documented and checked. ``RateLimit(storage, **keywords)`` and
``RateLimit.from_url(url, **keywords)`` build one; ``RateLimit(storage, settings=...)``
takes one made beforehand (from a configuration file, say). A bad value fails here, when
the limiter is made, before any client is opened.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ratelimit.algorithms import SLIDING_LOG, Algorithm, named
from ratelimit.errors import ConfigurationError
from ratelimit.fallback_settings import check_local
from ratelimit.hooks import Hook
from ratelimit.plan import CompiledTree, Cost, CounterUpdate, Identifier, compile_tree
from ratelimit.rules import MAX_SPAN_MS

ON_ERROR = ("allow", "deny", "raise", "local")
"""What a decision does when its storage fails: admit, refuse, raise ``BackendError``, or
decide in-process on this process's share of each limit (:mod:`ratelimit.fallback`)."""

SYNC_RATE_NEEDS_SCRIPTS = "sync_rate applies to a Redis client with use_scripts=True (the default)"

ENGINE_SETTINGS = (
    "use_scripts",
    "auto_pipeline",
    "disable_locks",
    "lock_ttl",
    "lock_polling_interval",
    "lock_timeout",
    "timeout",
    "spread",
)
"""The settings of the Redis engines: a backend object is configured by its own constructor."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How a :class:`~ratelimit.RateLimit` decides. Checked when made; never changes.

    - ``namespace``: keeps this application's counters apart from others on one Redis.
    - ``algorithm``: ``"sliding-log"`` (default; exact, memory O(N) per identifier),
      ``"sliding-window"`` (two counters per window size: O(1) memory, approximate),
      ``"fixed-window"``, or ``"gcra"`` (a token bucket: one arrival time per identifier
      and rule, exact; ``N/span`` sustains N per span with bursts of N, or of the rule's
      ``burst``).
    - ``sync_rate`` (Kong's three modes, window counters only): ``0`` (default) asks the
      store on every decision; ``> 0`` decides in-process on local counters synced with
      the store (Redis or Postgres) every ``sync_rate`` seconds in the background (each
      process may admit up to a limit per interval before it sees the others); ``< 0`` is
      local only, no store at all.
    - ``on_error``: what a decision does when Redis fails or misses its deadline:
      ``"allow"`` (default, fail-open), ``"deny"``, ``"raise"`` (``BackendError``) or
      ``"local"`` (decided in-process on ``local_share`` of each limit until the store
      answers again: :mod:`ratelimit.fallback`); such decisions say ``degraded=True``.
    - ``local_share`` (``on_error="local"`` only; default 1): the share of each rule's count
      (and burst) one process admits while the store fails, ``0 < share <= 1``; with N
      processes, ``1/N`` keeps their sum about the limit.
    - ``timeout`` (seconds, default 0.25; ``None`` for none): bounds each decision's work on
      Redis, so a hung Redis never hangs a caller. Waiting for the command engine's lock is
      not part of it and never fails open.
    - ``denial_cache``: how many refusals to remember in-process until they lift, answering
      the same call again without asking Redis (0 turns it off).
    - ``hooks``: callables given every ``Decision``, for metrics and logs; one that raises
      is logged and skipped.
    - ``background``: admit calls at once and count them off the request path; refusals
      reach the denial cache a round trip later (an overshoot of about that many calls).
    - ``use_scripts`` (default ``True``): decide with one atomic Lua script per decision;
      ``auto_pipeline`` (default ``True``) sends the scripts of decisions made in the same
      event-loop turn together, each still atomic with its own reply or error.
    - ``use_scripts=False``: plain commands under a Redis lock per (namespace, key), held
      at most ``lock_ttl`` seconds if its holder dies. Waiters are woken by each release
      (a blocking pop), and poll every ``lock_polling_interval`` seconds (with jitter) only
      where they cannot block. After ``lock_timeout`` seconds of waiting the call is
      refused (``degraded=True``) whatever ``on_error`` says, or ``LockTimeoutError`` is
      raised under ``on_error="raise"``; never admitted. ``disable_locks=True`` drops that
      lock (faster, with a bounded overshoot under concurrency).
    - ``spread`` (Redis Cluster): ``None`` (default) keeps each identifier of a limit
      whose rules name one selector (``user:5/m | user:100/h``) under a hash tag of its
      own on a ``RedisCluster`` client, so that one hot limit's identifiers spread over
      the cluster's slots and nodes; other trees, and every tree on any other client, keep
      one slot per (namespace, key). ``False`` keeps one slot per (namespace, key) on a
      cluster too (the layout before spreading existed); ``True`` spreads on any client.
    - ``shadow``: every limit of this limiter in shadow mode (``limit(shadow=...)``
      chooses per limit): calls are decided and counted as usual, but a refused call is
      let through, its decision marked ``shadow=True`` for hooks and logged on the
      ``ratelimit.shadow`` logger, so a new limit can be watched before it is enforced.
    - ``override_refresh`` (seconds, default 1): how often each process asks the store
      whether the overrides (``rl.overrides``) changed, which is how late a change made
      elsewhere may reach its decisions; ``0`` asks before every decision (one more
      round trip each).
    - ``clock`` (seconds): replaces the storage's clock, for tests that step time (and
      the time of day overrides expire by).

    Example::

        settings = Settings(namespace="shop", algorithm="sliding-window", on_error="deny")
        rl = RateLimit(redis.asyncio.Redis(), settings=settings)
    """

    namespace: str = ""
    algorithm: str = SLIDING_LOG
    sync_rate: float = 0
    on_error: str = "allow"
    local_share: float = 1.0
    timeout: float | None = 0.25
    denial_cache: int = 10_000
    hooks: Sequence[Hook] = ()
    background: bool = False
    use_scripts: bool = True
    auto_pipeline: bool = True
    disable_locks: bool = False
    lock_ttl: float = 10.0
    lock_polling_interval: float = 0.1
    lock_timeout: float = 10.0
    spread: bool | None = None
    shadow: bool = False
    override_refresh: float = 1.0
    clock: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hooks", tuple(self.hooks))  # a list given stays the caller's
        check_timeout(self.timeout)
        for name in ("use_scripts", "auto_pipeline", "disable_locks", "background", "shadow"):
            check_flag(name, getattr(self, name))
        check_spread(self.spread)
        locked = not self.use_scripts and not self.disable_locks  # the command engine's lock
        check_lock_settings(
            self.lock_ttl,
            self.lock_polling_interval,
            self.lock_timeout,
            self.timeout if locked else None,
        )
        if not isinstance(self.namespace, str):
            raise TypeError(f"namespace must be text, not {type(self.namespace).__name__}")
        named(self.algorithm)  # an unknown name fails here
        check_denial_cache(self.denial_cache)
        check_clock(self.clock)
        check_override_refresh(self.override_refresh)
        for hook in self.hooks:
            if not callable(hook):
                raise TypeError(f"a hook must be callable, not {type(hook).__name__}")
        check_on_error(self.on_error)
        check_local(self.on_error, self.local_share, self.background, self.sync_rate)
        check_sync_rate(self.sync_rate, self.algorithm, self.use_scripts)

    def replace(self, **changes: object) -> Settings:
        """These settings with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def engine_changed(self) -> list[str]:
        """The Redis engine settings that differ from their defaults, as ``name=value``."""
        return [
            f"{name}={getattr(self, name)!r}"
            for name in ENGINE_SETTINGS
            if getattr(self, name) != getattr(_DEFAULT, name)
        ]


class SettingsKeywords(TypedDict, total=False):
    """:class:`Settings` as keyword arguments (for ``RateLimit(storage, **keywords)``)."""

    algorithm: str
    sync_rate: float
    on_error: str
    local_share: float
    timeout: float | None
    denial_cache: int
    hooks: Sequence[Hook]
    background: bool
    use_scripts: bool
    auto_pipeline: bool
    disable_locks: bool
    lock_ttl: float
    lock_polling_interval: float
    lock_timeout: float
    spread: bool | None
    shadow: bool
    override_refresh: float
    clock: Callable[[], float] | None


MAX_OVERRIDE_REFRESH = 60.0


def check_override_refresh(seconds: object) -> None:
    """``override_refresh``: seconds from 0 to :data:`MAX_OVERRIDE_REFRESH`."""
    if not is_number(seconds) or not 0 <= seconds <= MAX_OVERRIDE_REFRESH:  # type: ignore[operator]
        raise ConfigurationError(
            f"override_refresh must be seconds from 0 to {MAX_OVERRIDE_REFRESH:g} (how late "
            f"a change of the overrides may reach this process), not {seconds!r}"
        )


def check_on_error(on_error: object) -> None:
    if on_error not in ON_ERROR:
        raise ConfigurationError(f"on_error must be one of {', '.join(ON_ERROR)}, not {on_error!r}")


def check_sync_rate(sync_rate: object, algorithm: Algorithm | str, use_scripts: bool) -> None:
    check_sync_seconds(sync_rate)
    if sync_rate and not use_scripts:
        raise ConfigurationError(SYNC_RATE_NEEDS_SCRIPTS)
    chosen = named(algorithm)
    if sync_rate > 0 and not chosen.syncable:  # type: ignore[operator]
        raise ConfigurationError(
            "sync_rate > 0 syncs window counters: use algorithm='sliding-window' or "
            f"'fixed-window' ({chosen.stores} cannot be merged from diffs)"
        )


def check_sync_seconds(sync_rate: object) -> None:
    """``sync_rate`` is a finite number of seconds (what its sign means is
    :func:`check_sync_rate`'s, and the synced backend's, to say)."""
    if not is_number(sync_rate):
        raise ConfigurationError(f"sync_rate must be a number of seconds, not {sync_rate!r}")


def check_clock(clock: object) -> None:
    """``clock`` is ``None`` (the store's own) or a callable returning seconds."""
    if clock is not None and not callable(clock):
        raise TypeError(f"clock must be a callable returning seconds, or None, not {clock!r}")


def check_denial_cache(denial_cache: object) -> None:
    if type(denial_cache) is not int:
        raise TypeError(
            f"denial_cache must be a whole number of refusals to remember, not {denial_cache!r}"
        )
    if denial_cache < 0:
        raise ConfigurationError(
            f"denial_cache must be 0 or more (0 turns it off), not {denial_cache}"
        )


def is_number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def check_cost_type(cost: object, algorithm: Algorithm | str) -> None:
    """A cost ``algorithm`` can count (:meth:`~ratelimit.algorithms.Algorithm.check_cost_type`)."""
    named(algorithm).check_cost_type(cost)


def check_cost(
    compiled: CompiledTree, cost: Cost, algorithm: Algorithm | str, bounded: bool = True
) -> None:
    """A call of ``cost`` can be admitted by every rule of ``compiled`` under ``algorithm``,
    within its bounds (:meth:`~ratelimit.algorithms.Algorithm.check_rule` and
    :meth:`~ratelimit.algorithms.Algorithm.check_cost`). ``cost``: one number, or one per
    rule (leaf) of ``compiled``, each checked against its own rule. ``bounded=False``: the
    rules are not asked to admit it at once (an override lowered below a call's cost,
    which then refuses it)."""
    chosen = named(algorithm)
    if isinstance(cost, tuple):
        if len(cost) != len(compiled.rules):
            raise ConfigurationError(
                f"costs {cost!r}: one cost per rule of '{compiled.tree}' "
                f"({len(compiled.rules)}), not {len(cost)}"
            )
        for leaf_cost, rule in zip(cost, compiled.rules, strict=True):
            chosen.check_cost_type(leaf_cost)
            check_cost(compile_tree(rule), leaf_cost, chosen, bounded)
        return
    for rule in compiled.rules:
        chosen.check_rule(rule, cost if bounded else 0)
    chosen.check_cost(cost)


def check_timeout(timeout: object) -> None:
    """A decision's deadline: seconds above 0 (:func:`check_seconds`), or ``None``."""
    if timeout is not None:
        check_seconds("timeout", timeout, or_none=True)


def check_seconds(name: str, seconds: object, *, or_none: bool = False) -> None:
    """``seconds`` is a finite number above 0, or ``ConfigurationError`` naming ``name``
    (and saying ``None`` would do too, where ``or_none``)."""
    if not is_number(seconds) or not seconds > 0:  # type: ignore[operator]
        also = ", or None" if or_none else ""
        raise ConfigurationError(
            f"{name} must be a number of seconds above 0{also}, not {seconds!r}"
        )


def counter_update(
    namespace: str, key: str, window_size: float, value: float, weight: float | None
) -> CounterUpdate:
    """The checked arguments of ``increment`` / ``sliding_window``."""
    if not isinstance(key, str):
        raise TypeError(f"key must be text, not {type(key).__name__}")
    if not is_number(window_size) or not 0 < window_size <= MAX_SPAN_MS / 1000:
        raise ConfigurationError(
            f"window_size must be seconds above 0 and at most 3650 days, not {window_size!r}"
        )
    size_us = round(window_size * 1_000_000)
    if size_us < 1:
        raise ConfigurationError(f"window_size {window_size!r} is under a microsecond")
    if not is_number(value):
        raise ConfigurationError(f"value must be a finite number, not {value!r}")
    if weight is not None and (not is_number(weight) or not 0 <= weight <= 1):
        raise ConfigurationError(f"weight must be from 0 to 1, or None, not {weight!r}")
    return CounterUpdate(Identifier(namespace, key, None, None), size_us, float(value), weight)


def check_flag(name: str, value: object) -> None:
    """A setting that must be ``True`` or ``False`` (not merely truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")


def check_spread(spread: object) -> None:
    """``spread``: ``None`` (on a cluster client), ``True`` or ``False``."""
    if spread is not None and not isinstance(spread, bool):
        raise TypeError(
            f"spread must be None (spread on a Redis Cluster client), True or False, not {spread!r}"
        )


MIN_LOCK_TTL = 0.1
MAX_SECONDS = 86_400.0


def check_lock_settings(
    lock_ttl: object, lock_polling_interval: object, lock_timeout: object, timeout: object
) -> None:
    """The command engine's lock settings: finite seconds in a range that can work.
    ``timeout`` is the decision deadline where that lock is taken (``lock_ttl`` must
    outlive it), else ``None``: the script engine takes no lock, and Postgres's locks are
    transaction-scoped (released when the statement ends or its connection closes), so
    neither bounds ``timeout``."""
    if not is_number(lock_ttl) or not MIN_LOCK_TTL <= lock_ttl <= MAX_SECONDS:  # type: ignore[operator]
        raise ConfigurationError(
            f"lock_ttl must be seconds from {MIN_LOCK_TTL} to {MAX_SECONDS:.0f}, not "
            f"{lock_ttl!r} (how long a crashed holder may block others)"
        )
    if timeout is not None and lock_ttl <= timeout:  # type: ignore[operator]
        raise ConfigurationError(
            f"lock_ttl ({lock_ttl!r} s) must be longer than timeout ({timeout!r} s): the lock "
            "must outlive the work it guards"
        )
    if not is_number(lock_polling_interval) or not 0 < lock_polling_interval <= 60:  # type: ignore[operator]
        raise ConfigurationError(
            "lock_polling_interval must be seconds above 0 and at most 60, not "
            f"{lock_polling_interval!r}"
        )
    if type(lock_timeout) not in (int, float) or not lock_timeout >= 0:  # type: ignore[operator]
        raise ConfigurationError(
            f"lock_timeout must be 0 or more seconds (inf: wait as long as it takes), not "
            f"{lock_timeout!r}"
        )


_DEFAULT = Settings()


def settings_with(
    settings: Settings | None, namespace: str | None, keywords: dict[str, Any]
) -> Settings:
    """``settings`` (default: the defaults) with ``namespace`` and ``keywords`` applied:
    what ``RateLimit`` is made with."""
    if settings is not None and not isinstance(settings, Settings):
        raise TypeError(f"settings must be a ratelimit.Settings, not {type(settings).__name__}")
    if namespace is not None:
        keywords["namespace"] = namespace
    if settings is None:
        return Settings(**keywords)
    return settings.replace(**keywords) if keywords else settings
