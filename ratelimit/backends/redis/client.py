"""The redis-py clients the Redis engines drive: which objects qualify, and opening one by URL."""

from __future__ import annotations

import weakref
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from ratelimit.backends.redis.compat import CLIENTS
from ratelimit.errors import ConfigurationError

RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"


def client_from_url(url: str, **options: Any) -> aioredis.Redis:
    """A redis-py asyncio client for ``url``; ``options`` go to ``redis.asyncio.from_url``,
    or for ``redis+sentinel://`` to ``Sentinel.master_for`` (:func:`sentinel_client`)."""
    if urlsplit(url).scheme == SENTINEL_SCHEME:
        return sentinel_client(url, **options)
    client: aioredis.Redis = aioredis.from_url(url, **options)
    return client


SENTINEL_SCHEME = "redis+sentinel"
_SENTINELS: weakref.WeakKeyDictionary[aioredis.Redis, Sentinel] = weakref.WeakKeyDictionary()


def sentinel_client(url: str, **options: Any) -> aioredis.Redis:
    """The primary of a Sentinel-watched service, found anew after a failover:
    ``redis+sentinel://[:password@]host:port[,host:port...]/service[/db]`` (the scheme
    ``limits`` uses; port 26379 when left out). The password is the primary's;
    ``sentinel_kwargs=`` (a dict) configures the connections to the sentinels; the other
    ``options`` go to ``Sentinel.master_for``."""
    parts = urlsplit(url)
    names = [name for name in parts.path.split("/") if name]
    hosts: list[tuple[str, int]] = []
    for host in parts.netloc.rpartition("@")[2].split(","):
        name, _, port = host.partition(":")
        if not name or (port and not port.isdigit()):
            raise ConfigurationError(f"{url!r}: sentinels are host:port, not {host!r}")
        hosts.append((name, int(port or 26379)))
    if not names or len(names) > 2 or (len(names) == 2 and not names[1].isdigit()):
        raise ConfigurationError(
            f"{url!r}: a redis+sentinel:// URL names the service, and may name a database: "
            "redis+sentinel://host:26379/mymaster/0"
        )
    sentinel = Sentinel(hosts, sentinel_kwargs=options.pop("sentinel_kwargs", None))  # type: ignore[no-untyped-call]
    db = int(names[1]) if len(names) == 2 else 0
    client: aioredis.Redis = sentinel.master_for(
        names[0], db=db, password=parts.password, **options
    )
    _SENTINELS[client] = sentinel
    return client


async def close_client(client: Any) -> None:
    """Close a client opened here, and the connections to its sentinels if it has some."""
    await client.aclose()
    sentinel = _SENTINELS.pop(client, None)
    if sentinel is not None:
        for connection in sentinel.sentinels:
            await connection.aclose()


def is_redis_client(obj: object) -> bool:
    """Whether ``obj`` is an asyncio client the Redis engines can drive: redis-py's
    ``Redis`` or ``RedisCluster``, or valkey-py's ``Valkey`` or ``ValkeyCluster``."""
    return isinstance(obj, CLIENTS)


CLUSTER_TRANSACTIONS = (6, 2)
"""The first redis-py whose asyncio ``RedisCluster`` runs ``MULTI``/``EXEC`` transactions."""


def redis_py_version() -> tuple[int, int]:
    """The installed redis-py's (major, minor)."""
    major, minor = (int(part) for part in redis.__version__.split(".")[:2])
    return major, minor


def check_transactions(client: object) -> None:
    """Refuse a ``RedisCluster`` whose redis-py cannot run transactions on it (the command
    engine's writes and its lock are transactions)."""
    if isinstance(client, RedisCluster) and redis_py_version() < CLUSTER_TRANSACTIONS:
        needed = ".".join(map(str, CLUSTER_TRANSACTIONS))
        raise ConfigurationError(
            f"use_scripts=False on a RedisCluster needs redis-py {needed} or later "
            f"(transactions on a cluster); this is redis-py {redis.__version__}: upgrade it, "
            "or use the script engine (use_scripts=True, the default)"
        )
