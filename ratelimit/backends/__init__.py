"""Storage backends: the in-process memory backend and the Redis script engine."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ratelimit.backends.base import Backend, Clock
from ratelimit.backends.memory import MemoryBackend
from ratelimit.backends.redis_script import RedisScriptBackend, is_redis_client

REDIS_SCHEMES = ("redis", "rediss", "unix")


def backend_for(storage: object, *, clock: Clock | None = None) -> Backend:
    """The backend for what ``RateLimit`` was given: a redis-py asyncio client or a backend."""
    if is_redis_client(storage):
        return RedisScriptBackend(storage, clock=clock)  # type: ignore[arg-type]
    if isinstance(storage, Backend):
        if clock is not None:
            raise TypeError("clock= goes to the backend's own constructor when passing a backend")
        return storage
    raise TypeError(
        "RateLimit needs a redis.asyncio.Redis, a redis.asyncio.RedisCluster or a backend "
        f"(an object with async decide() and aclose()), not {type(storage).__name__}; "
        "a synchronous redis.Redis will not do"
    )


def backend_from_url(url: str, *, clock: Clock | None = None, **options: Any) -> Backend:
    """Open a backend from a URL: ``memory://``, ``redis://``, ``rediss://`` or ``unix://``."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        if options:
            raise TypeError(f"memory:// takes no options, got {', '.join(options)}")
        return MemoryBackend(clock=clock)
    if scheme in REDIS_SCHEMES:
        import redis.asyncio as aioredis

        client = aioredis.from_url(url, **options)
        return RedisScriptBackend(client, clock=clock, owns_client=True)
    raise ValueError(
        f"unsupported storage URL {url!r}: use memory://, redis://, rediss:// or unix://"
    )


__all__ = [
    "Backend",
    "Clock",
    "MemoryBackend",
    "RedisScriptBackend",
    "backend_for",
    "backend_from_url",
]
