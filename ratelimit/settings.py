"""Checks of ``RateLimit`` and ``limit()`` settings, and the backend ``sync_rate`` selects."""

from __future__ import annotations

import math

from ratelimit.algorithms import SLIDING_LOG
from ratelimit.backends import Backend, EngineOptions, MemoryBackend, RedisScriptBackend
from ratelimit.backends.redis import SyncedBackend
from ratelimit.errors import ConfigurationError
from ratelimit.plan import CompiledTree, CounterUpdate, Identifier
from ratelimit.rules import MAX_SPAN_MS


def synced_backend(
    backend: Backend, sync_rate: float, algorithm: str
) -> tuple[Backend, Backend | None]:
    """The backend for ``sync_rate != 0``, and the one it replaces (to close), if any."""
    if not is_number(sync_rate):
        raise ConfigurationError(f"sync_rate must be a number of seconds, not {sync_rate!r}")
    if not isinstance(backend, RedisScriptBackend):
        raise ConfigurationError(
            "sync_rate applies to a Redis client with use_scripts=True (the default)"
        )
    if sync_rate < 0:
        return MemoryBackend(clock=backend.clock), backend  # local only: no Redis at all
    if algorithm == SLIDING_LOG:
        raise ConfigurationError(
            "sync_rate > 0 syncs window counters: use algorithm='sliding-window' or "
            "'fixed-window' (a sliding log cannot be merged from diffs)"
        )
    return SyncedBackend(backend, sync_rate, clock=backend.clock), None


def is_number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def check_cost_type(cost: object, algorithm: str) -> None:
    if algorithm == SLIDING_LOG:
        if type(cost) is not int or cost < 1:
            raise ConfigurationError(
                f"cost must be a whole number of hits, 1 or more, not {cost!r} "
                "(fractions need algorithm='sliding-window' or 'fixed-window')"
            )
    elif type(cost) not in (int, float) or not 0 < cost < math.inf:  # type: ignore[operator]
        raise ConfigurationError(f"cost must be a number of hits above 0, not {cost!r}")


MAX_LOG_COUNT = 100_000
"""Most hits a sliding-log rule may count: its list holds one timestamp per hit."""
MAX_LOG_COST = 1_000
"""Most hits one call may record on a sliding log: each is a timestamp written to Redis.
Both bounds keep one decision under about a millisecond of Redis time."""


def check_cost(compiled: CompiledTree, cost: float, algorithm: str) -> None:
    """A call of ``cost`` can be admitted by every rule, within the sliding log's bounds."""
    for rule in compiled.rules:
        if cost > rule.count:
            raise ConfigurationError(
                f"cost {cost} is above the count of rule '{rule}': such a call could never "
                "be admitted"
            )
        if algorithm == SLIDING_LOG and rule.count > MAX_LOG_COUNT:
            raise ConfigurationError(
                f"rule '{rule}' counts {rule.count} hits: the sliding log keeps a timestamp per "
                f"hit and takes rules of at most {MAX_LOG_COUNT} (so that no decision holds "
                "Redis up for more than about a millisecond); use algorithm='sliding-window' "
                "or 'fixed-window' for larger counts"
            )
    if algorithm == SLIDING_LOG and cost > MAX_LOG_COST:
        raise ConfigurationError(
            f"cost {cost} is too large for the sliding log, which writes a timestamp per hit: "
            f"it takes a cost of at most {MAX_LOG_COST} per call (so that no decision holds "
            "Redis up for more than about a millisecond); use algorithm='sliding-window' or "
            "'fixed-window' for larger costs"
        )


def check_timeout(timeout: object) -> None:
    if timeout is not None and (not is_number(timeout) or not timeout > 0):  # type: ignore[operator]
        raise ConfigurationError(
            f"timeout must be a number of seconds above 0, or None, not {timeout!r}"
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


MIN_LOCK_TTL = 0.1
MAX_SECONDS = 86_400.0


def check_lock_settings(
    lock_ttl: object, lock_polling_interval: object, lock_timeout: object, timeout: object
) -> None:
    """The command engine's lock settings: finite seconds in a range that can work."""
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


def check_limiter(denial_cache: object, background: object, clock: object) -> None:
    """``RateLimit``'s own settings (the engine's are checked by :func:`engine_options`)."""
    if type(denial_cache) is not int:
        raise TypeError(
            f"denial_cache must be a whole number of refusals to remember, not {denial_cache!r}"
        )
    if denial_cache < 0:
        raise ConfigurationError(
            f"denial_cache must be 0 or more (0 turns it off), not {denial_cache}"
        )
    check_flag("background", background)
    if clock is not None and not callable(clock):
        raise TypeError(f"clock must be a callable returning seconds, or None, not {clock!r}")


def engine_options(
    use_scripts: bool,
    auto_pipeline: bool,
    disable_locks: bool,
    lock_ttl: float,
    lock_polling_interval: float,
    lock_timeout: float,
    timeout: float | None,
) -> EngineOptions:
    """``RateLimit``'s engine settings, checked."""
    check_timeout(timeout)
    for name, flag in (
        ("use_scripts", use_scripts),
        ("auto_pipeline", auto_pipeline),
        ("disable_locks", disable_locks),
    ):
        check_flag(name, flag)
    check_lock_settings(lock_ttl, lock_polling_interval, lock_timeout, timeout)
    return EngineOptions(
        use_scripts=use_scripts,
        disable_locks=disable_locks,
        lock_ttl=lock_ttl,
        lock_polling_interval=lock_polling_interval,
        lock_timeout=lock_timeout,
        timeout=timeout,
        auto_pipeline=auto_pipeline,
    )
