"""Storage backends, and the one chosen for what ``RateLimit`` was given: the in-process
memory backend (``memory://``), the Redis engines, script and commands (``redis://``,
``rediss://``, ``unix://``, ``redis+sentinel://``), the synced counters of ``sync_rate``,
and, with the ``postgres`` extra, window counters in PostgreSQL (``postgresql://``, also
``postgres://``). Each store declares its schemes once (``MemoryBackend.schemes``,
``redis.client.SCHEMES``, ``postgres.url.SCHEMES``); :mod:`ratelimit.backends.urls`
checks URLs by them, and :func:`backend_from_url` opens by them. A store's client library
(redis-py, asyncpg) is imported when a backend of it is made, never by ``import
ratelimit``."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ratelimit.backends.base import Backend, Clock
from ratelimit.backends.memory.backend import MemoryBackend
from ratelimit.backends.postgres.url import SCHEMES as POSTGRES_SCHEMES
from ratelimit.backends.redis.schemes import SCHEMES as REDIS_SCHEMES
from ratelimit.backends.synced import SyncedBackend
from ratelimit.backends.urls import USE, check_storage_url
from ratelimit.core.checks import SYNC_RATE_NEEDS_SCRIPTS
from ratelimit.core.lazy import lazily
from ratelimit.core.settings import ENGINE_SETTINGS, Settings, unknown_keyword
from ratelimit.errors import ConfigurationError

if TYPE_CHECKING:
    from ratelimit.backends.redis import RedisClient, RedisCommandBackend, RedisScriptBackend

POSTGRES_OPTIONS = ("max_size", "setup_timeout")
"""What ``RateLimit.from_url`` passes on to :class:`PostgresBackend` for ``postgresql://``."""


def backend_for(storage: object, settings: Settings) -> Backend:
    """The backend for what ``RateLimit`` was given: a redis-py (or valkey-py) asyncio
    client, which gets the engine ``settings`` choose, or a backend, used as it is."""
    if _is_redis_client(storage):
        return _redis_backend(storage, settings)  # type: ignore[arg-type]
    if isinstance(storage, Backend):
        if settings.clock is not None:
            raise TypeError("clock= goes to the backend's own constructor when passing a backend")
        _check_no_engine_settings(settings, "a backend object")
        return storage
    raise TypeError(
        "RateLimit needs a redis.asyncio.Redis, a redis.asyncio.RedisCluster or a backend "
        f"(an object with async decide() and aclose()), not {type(storage).__name__}; "
        "a synchronous redis.Redis will not do"
    )


def _is_redis_client(storage: object) -> bool:
    """Whether ``storage`` is a client of redis-py or valkey-py, asked without importing
    either (a client of one was made with it imported)."""
    if "redis" not in sys.modules and "valkey" not in sys.modules:
        return False
    from ratelimit.backends.redis import is_redis_client

    return is_redis_client(storage)


__getattr__ = lazily(  # the Redis engines, with redis-py, when first named
    __name__,
    {
        "RedisCommandBackend": "ratelimit.backends.redis.command.engine",
        "RedisScriptBackend": "ratelimit.backends.redis.script.engine",
    },
)


def backend_from_url(url: str, settings: Settings, **options: Any) -> Backend:
    """Open a backend from a URL of one of :data:`~ratelimit.backends.urls.SCHEMES`,
    checked first (:func:`check_storage_url`: a malformed one is a ``ConfigurationError``
    naming it), by the scheme each store declares.

    ``options`` go to the store's client: ``redis.asyncio.from_url`` (for
    ``redis+sentinel://``, ``Sentinel.master_for``) or :class:`PostgresBackend`
    (``max_size``); ``memory://`` takes none. With ``sync_rate < 0`` (local only) no client
    is opened."""
    check_storage_url(url)
    scheme = urlsplit(url).scheme
    if scheme in MemoryBackend.schemes:
        if options:
            raise TypeError(f"memory:// takes no options, not {', '.join(sorted(options))}")
        _check_no_engine_settings(settings, "memory://")
        return MemoryBackend(clock=settings.clock)
    if scheme in REDIS_SCHEMES:  # the engines' schemes: redis.schemes's
        from ratelimit.backends.redis import client_from_url, client_options

        known = client_options(scheme, options.get("connection_class"))
        _check_options(options, known, f"the {scheme}:// client (redis-py)")
        if settings.sync_rate < 0:
            return MemoryBackend(clock=settings.clock)
        return _redis_backend(client_from_url(url, **options), settings, owns_client=True)
    if scheme in POSTGRES_SCHEMES:
        return _postgres_backend(url, settings, **options)
    raise ConfigurationError(f"unsupported storage URL {url!r}: {USE}")


def _check_options(options: dict[str, Any], known: Iterable[str], client: str) -> None:
    """Refuse an option ``client`` does not take, naming the settings and the nearest name:
    handed on, it would fail every decision (which ``on_error`` may then admit)."""
    for name in options:
        if name not in known:
            where = "RateLimit.from_url()"
            raise TypeError(
                unknown_keyword(
                    name, where, sorted(known), f"the options of {client}", "a client option"
                )
            )


def _postgres_backend(url: str, settings: Settings, **options: Any) -> Backend:
    """Window counters in PostgreSQL; ``options`` go to :class:`PostgresBackend`
    (``max_size``, the pool's size)."""
    from ratelimit.backends.postgres import PostgresBackend, check_algorithm

    _check_options(options, POSTGRES_OPTIONS, "the postgresql:// pool (max_size, setup_timeout)")

    check_algorithm(settings.algorithm)
    if settings.sync_rate < 0:
        return MemoryBackend(clock=settings.clock)
    changed = [c for c in settings.engine_changed() if not c.startswith("timeout=")]
    if changed:
        raise TypeError(
            f"{', '.join(changed)} apply to a Redis client; postgresql:// takes timeout= only"
        )
    backend = PostgresBackend(url, clock=settings.clock, timeout=settings.timeout, **options)
    if settings.sync_rate > 0:  # Kong's mode: diffs pushed and totals read in one round trip
        return SyncedBackend(backend, settings.sync_rate, clock=settings.clock)
    return backend


def _check_no_engine_settings(settings: Settings, what: str) -> None:
    if settings.sync_rate:
        raise ConfigurationError(SYNC_RATE_NEEDS_SCRIPTS)
    changed = settings.engine_changed()
    if changed:
        raise TypeError(
            f"{', '.join(changed)} apply to a Redis client, and {what} takes no engine settings "
            f"({', '.join(ENGINE_SETTINGS)}): configure a backend through its own constructor"
        )


def _redis_backend(
    client: RedisClient, settings: Settings, *, owns_client: bool = False
) -> Backend:
    """The engine ``settings`` choose for ``client``: the script engine (``disable_locks``
    changes nothing: scripts are atomic), the command engine, or, with ``sync_rate``,
    local counters (synced through the script engine when above 0)."""
    from ratelimit.backends.redis import RedisCommandBackend, RedisScriptBackend

    clock = settings.clock
    if settings.sync_rate < 0:
        return MemoryBackend(clock=clock)  # local only: the client is not used
    if not settings.use_scripts:
        return RedisCommandBackend(
            client,
            clock=clock,
            disable_locks=settings.disable_locks,
            lock_ttl=settings.lock_ttl,
            lock_polling_interval=settings.lock_polling_interval,
            lock_timeout=settings.lock_timeout,
            owns_client=owns_client,
            timeout=settings.timeout,
            spread=settings.spread,
        )
    script = RedisScriptBackend(
        client,
        clock=clock,
        owns_client=owns_client,
        timeout=settings.timeout,
        auto_pipeline=settings.auto_pipeline,
        spread=settings.spread,
    )
    if settings.sync_rate > 0:
        return SyncedBackend(script, settings.sync_rate, clock=clock)
    return script


__all__ = [
    "Backend",
    "Clock",
    "MemoryBackend",
    "RedisCommandBackend",
    "RedisScriptBackend",
    "backend_for",
    "backend_from_url",
]
