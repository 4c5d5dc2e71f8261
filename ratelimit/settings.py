"""Checks of ``RateLimit`` and ``limit()`` settings, and the backend ``sync_rate`` selects."""

from __future__ import annotations

import math

from ratelimit.algorithms import SLIDING_LOG
from ratelimit.backends import Backend, EngineOptions, MemoryBackend, RedisScriptBackend
from ratelimit.backends.synced import SyncedBackend
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


def check_cost(compiled: CompiledTree, cost: float) -> None:
    for rule in compiled.rules:
        if cost > rule.count:
            raise ConfigurationError(
                f"cost {cost} is above the count of rule '{rule}': such a call could never "
                "be admitted"
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


def engine_options(
    use_scripts: bool,
    auto_pipeline: bool,
    disable_locks: bool,
    lock_ttl: float,
    lock_polling_interval: float,
    lock_timeout: float,
    timeout: float | None,
) -> EngineOptions:
    """``RateLimit``'s engine settings, checked (the lock settings by the command engine)."""
    check_timeout(timeout)
    check_flag("auto_pipeline", auto_pipeline)
    return EngineOptions(
        use_scripts=use_scripts,
        disable_locks=disable_locks,
        lock_ttl=lock_ttl,
        lock_polling_interval=lock_polling_interval,
        lock_timeout=lock_timeout,
        timeout=timeout,
        auto_pipeline=auto_pipeline,
    )
