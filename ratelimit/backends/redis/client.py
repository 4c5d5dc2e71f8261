"""The redis-py clients the Redis engines drive: which objects qualify, and opening one by URL."""

from __future__ import annotations

from typing import Any, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"


def client_from_url(url: str, **options: Any) -> aioredis.Redis:
    """A redis-py asyncio client for ``url``; ``options`` go to ``redis.asyncio.from_url``."""
    client: aioredis.Redis = aioredis.from_url(url, **options)
    return client


def is_redis_client(obj: object) -> bool:
    """Whether ``obj`` is a redis-py asyncio client the Redis engines can drive."""
    return isinstance(obj, aioredis.Redis | RedisCluster)
