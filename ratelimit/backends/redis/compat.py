"""redis-py and valkey-py (its fork, ``valkey.asyncio.Valkey``) side by side: the client
classes the Redis engines drive and the errors they catch, each a tuple that holds
valkey-py's class too when valkey-py is installed. The engines catch and test these, never
one library's class alone."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster


def _valkey() -> tuple[Any, Any, Any] | None:
    """valkey-py's (asyncio module, exceptions module, ValkeyCluster), if installed: a
    client passed in may be one."""
    try:
        import valkey.asyncio as aiovalkey
        from valkey import exceptions
        from valkey.asyncio.cluster import ValkeyCluster
    except ImportError:  # pragma: no cover - valkey-py is a test dependency
        return None
    return aiovalkey, exceptions, ValkeyCluster


_VALKEY = _valkey()
valkey_errors: Any = None if _VALKEY is None else _VALKEY[1]


def _both(name: str, valkey_name: str | None = None) -> tuple[type[BaseException], ...]:
    ours: type[BaseException] = getattr(redis_errors, name)
    if valkey_errors is None:
        return (ours,)
    theirs = getattr(valkey_errors, valkey_name or name, None)
    return (ours,) if theirs is None else (ours, theirs)


CLIENTS: tuple[type[Any], ...] = (aioredis.Redis, RedisCluster)
CLUSTERS: tuple[type[Any], ...] = (RedisCluster,)
if _VALKEY is not None:
    CLIENTS += (_VALKEY[0].Valkey, _VALKEY[2])
    CLUSTERS += (_VALKEY[2],)

ServerError = (
    *_both("RedisError", "ValkeyError"),
    *_both("RedisClusterException", "ValkeyClusterException"),
)
"""Anything the client raises for the server or the way to it (a cluster none of whose
nodes answers raises ``RedisClusterException``, which is not a ``RedisError``)."""
ServerOrTimeout: tuple[type[BaseException], ...] = (*ServerError, TimeoutError)
ConnectionError = _both("ConnectionError")
NoScriptError = _both("NoScriptError")
ResponseError = _both("ResponseError")
OutOfMemoryError = _both("OutOfMemoryError")
WatchError = _both("WatchError")
MaxConnectionsError = _both("MaxConnectionsError")
