"""Storage backends: the in-process memory backend and the Redis engines (script, commands)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ratelimit.backends.base import Backend, Clock
from ratelimit.backends.memory import MemoryBackend
from ratelimit.backends.redis import (
    RedisClient,
    RedisCommandBackend,
    RedisScriptBackend,
    client_from_url,
    is_redis_client,
)

REDIS_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How a Redis client is driven: ``RateLimit``'s engine and lock settings."""

    use_scripts: bool = True
    disable_locks: bool = False
    lock_ttl: float = 10.0
    lock_polling_interval: float = 0.1
    lock_timeout: float = 10.0
    timeout: float | None = 0.25
    auto_pipeline: bool = True

    def backend(
        self, client: RedisClient, clock: Clock | None, *, owns_client: bool = False
    ) -> Backend:
        """The script engine (``disable_locks`` changes nothing: scripts are atomic), or
        the command engine with these lock settings."""
        if self.use_scripts:
            return RedisScriptBackend(
                client,
                clock=clock,
                owns_client=owns_client,
                timeout=self.timeout,
                auto_pipeline=self.auto_pipeline,
            )
        return RedisCommandBackend(
            client,
            clock=clock,
            disable_locks=self.disable_locks,
            lock_ttl=self.lock_ttl,
            lock_polling_interval=self.lock_polling_interval,
            lock_timeout=self.lock_timeout,
            owns_client=owns_client,
            timeout=self.timeout,
        )


def backend_for(
    storage: object, *, clock: Clock | None = None, engine: EngineOptions = EngineOptions()
) -> Backend:
    """The backend for what ``RateLimit`` was given: a redis-py asyncio client or a backend."""
    if is_redis_client(storage):
        return engine.backend(storage, clock)  # type: ignore[arg-type]
    if isinstance(storage, Backend):
        if clock is not None:
            raise TypeError("clock= goes to the backend's own constructor when passing a backend")
        if engine != EngineOptions():
            raise TypeError(
                "use_scripts, auto_pipeline, disable_locks and lock_* apply to a Redis client; "
                "configure a backend object through its own constructor"
            )
        return storage
    raise TypeError(
        "RateLimit needs a redis.asyncio.Redis, a redis.asyncio.RedisCluster or a backend "
        f"(an object with async decide() and aclose()), not {type(storage).__name__}; "
        "a synchronous redis.Redis will not do"
    )


def backend_from_url(
    url: str,
    *,
    clock: Clock | None = None,
    engine: EngineOptions = EngineOptions(),
    **options: Any,
) -> Backend:
    """Open a backend from a URL: ``memory://``, ``redis://``, ``rediss://`` or ``unix://``.

    ``options`` go to ``redis.asyncio.from_url``."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        if options or engine != EngineOptions():
            raise TypeError(
                "memory:// takes no options and no engine settings "
                "(use_scripts, auto_pipeline, disable_locks, lock_*)"
            )
        return MemoryBackend(clock=clock)
    if scheme in REDIS_SCHEMES:
        return engine.backend(client_from_url(url, **options), clock, owns_client=True)
    raise ValueError(
        f"unsupported storage URL {url!r}: use memory://, redis://, rediss:// or unix://"
    )


__all__ = [
    "Backend",
    "Clock",
    "EngineOptions",
    "MemoryBackend",
    "RedisCommandBackend",
    "RedisScriptBackend",
    "backend_for",
    "backend_from_url",
]
