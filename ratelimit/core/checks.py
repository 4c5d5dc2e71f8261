"""The checks of every setting and argument, each raising a ``ConfigurationError`` (or a
``TypeError``) that says what was wrong, when the object holding it is made.

:class:`~ratelimit.core.settings.Settings` runs them over ``RateLimit``'s settings; the
stores run the ones of their own constructors (clock, timeout, lock), ``limit()`` and the
service the ones of costs, and ``on_error="local"``'s share (:mod:`ratelimit.pipeline.fallback`)
is checked here too.
"""

from __future__ import annotations

import math

from ratelimit.algorithms import Algorithm, named
from ratelimit.core.plan import CompiledTree, Cost, CounterUpdate, Identifier, compile_tree
from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import MAX_SPAN_MS

SYNC_RATE_NEEDS_SCRIPTS = "sync_rate applies to a Redis client with use_scripts=True (the default)"


def check_local_share(share: object, where: str = "local_share") -> float:
    """``share``: a number with ``0 < share <= 1`` (``where`` names it in the message)."""
    if (
        type(share) not in (int, float)
        or not math.isfinite(share)  # type: ignore[arg-type]
        or not 0 < share <= 1  # type: ignore[operator]
    ):
        raise ConfigurationError(
            f"{where} must be a number with 0 < share <= 1 (the share of each limit one "
            f"process admits while the store fails, e.g. 0.25 for 4 processes), not {share!r}"
        )
    return float(share)  # type: ignore[arg-type]


def check_local(on_error: str, share: object, background: bool, sync_rate: object) -> None:
    """``local_share`` only with ``on_error="local"``, and ``on_error="local"`` neither with
    background counting nor with ``sync_rate`` (which decide in-process already)."""
    check_local_share(share)
    if on_error != "local":
        if share != 1:
            raise ConfigurationError(
                f"local_share={share!r} applies only to on_error='local' (here on_error="
                f"{on_error!r}, so it would do nothing): set on_error='local' or drop it"
            )
        return
    if background:
        raise ConfigurationError(
            "on_error='local' needs background=False: background counting admits a call "
            "before the store decides it, so a failed count has no call left to decide locally"
        )
    if sync_rate:
        raise ConfigurationError(
            f"on_error='local' needs sync_rate=0 (here {sync_rate!r}): with sync_rate a "
            "process decides in-process on its own counters already, whatever the store does"
        )


ON_ERROR = ("allow", "deny", "raise", "local")
"""What a decision does when its storage fails: admit, refuse, raise ``BackendError``, or
decide in-process on this process's share of each limit (:mod:`ratelimit.pipeline.fallback`)."""


MAX_OVERRIDE_REFRESH = 60.0
MAX_LEASE = 60.0
LEASE_WITH_SYNC_RATE = (
    "two ways of deciding in-process: choose one (a lease is never over the limit; "
    "sync_rate may be, by what each process admits between syncs)"
)
"""Why ``lease`` and ``sync_rate`` are refused together (the limiter's, a limit's)."""


def check_lease(seconds: float, where: str = "lease") -> float:
    """``lease``: seconds from 0 to :data:`MAX_LEASE` (0: every call asks the store);
    returns them."""
    if not is_number(seconds) or not 0 <= seconds <= MAX_LEASE:
        raise ConfigurationError(
            f"{where} must be seconds from 0 to {MAX_LEASE:g} (how long a process may hold a "
            f"slice of a limit it took from the store; 0: every call asks the store), not "
            f"{seconds!r}"
        )
    return seconds


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
    which then refuses it), nor bound by what the algorithm counts in one call."""
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
    if bounded:
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
