"""``RateLimit``'s settings, in one validated, frozen object (their checks: :mod:`.checks`).

:class:`Settings` is the one place each setting of :class:`~ratelimit.RateLimit` is named,
defaulted, documented and checked. ``RateLimit(storage, **keywords)`` and
``RateLimit.from_url(url, **keywords)`` build one; ``RateLimit(storage, settings=...)``
takes one made beforehand (from a configuration file, say). A bad value fails here, when
the limiter is made, before any client is opened.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ratelimit.algorithms import SLIDING_LOG, named
from ratelimit.core.checks import (
    LEASE_WITH_SYNC_RATE,
    check_clock,
    check_denial_cache,
    check_flag,
    check_lease,
    check_local,
    check_lock_settings,
    check_on_error,
    check_override_refresh,
    check_spread,
    check_sync_rate,
    check_timeout,
)
from ratelimit.core.decision import Hook
from ratelimit.errors import ConfigurationError

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
      answers again: :mod:`ratelimit.pipeline.fallback`); such decisions say ``degraded=True``.
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
    - ``lease`` (seconds, default 0: every call asks the store): lets each process take a
      slice of a hot limit from the store at once and admit calls from it in-process,
      for at most this long; the store counts the slice before any call of it is
      admitted, so the limit is never exceeded, and what is left of it is given back
      (``limit(..., lease=)`` chooses per limit; :mod:`ratelimit.backends.leases`).
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
    lease: float = 0
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
        check_lease(self.lease)
        if self.lease and self.sync_rate:
            raise ConfigurationError(f"lease and sync_rate are {LEASE_WITH_SYNC_RATE}")

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
    lease: float
    clock: Callable[[], float] | None


_DEFAULT = Settings()
SETTING_NAMES = tuple(field.name for field in dataclasses.fields(Settings))
"""Every setting's name, in :class:`Settings`' order."""


def unknown_keyword(
    name: str, where: str, others: Sequence[str] = (), of: str = "", one: str = ""
) -> str:
    """What to say of a keyword ``name`` given to ``where`` that is neither a setting nor one
    of ``others`` (``of``: what those are, "the options of the redis:// client"; ``one``:
    what one of them is, "a client option"): the settings there are, and the nearest name
    a typo may have meant."""
    close = difflib.get_close_matches(name, [*SETTING_NAMES, *others], n=1)
    hint = ""
    if close:
        hint = f"; did you mean {close[0]}= ({'a setting' if close[0] in SETTING_NAMES else one})?"
    more = f", nor one of {of}" if of else ""
    return (
        f"{where} got an unknown keyword {name}=: not a setting ({', '.join(SETTING_NAMES)})"
        f"{more}{hint}"
    )


def settings_with(
    settings: Settings | None, namespace: str | None, keywords: dict[str, Any]
) -> Settings:
    """``settings`` (default: the defaults) with ``namespace`` and ``keywords`` applied:
    what ``RateLimit`` is made with."""
    if settings is not None and not isinstance(settings, Settings):
        raise TypeError(f"settings must be a ratelimit.Settings, not {type(settings).__name__}")
    unknown = [name for name in keywords if name not in SETTING_NAMES]
    if unknown:
        raise TypeError(unknown_keyword(unknown[0], "RateLimit()"))
    if namespace is not None:
        keywords["namespace"] = namespace
    if settings is None:
        return Settings(**keywords)
    return settings.replace(**keywords) if keywords else settings
