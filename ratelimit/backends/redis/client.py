"""The redis-py clients the Redis engines drive: which objects qualify, and opening one by URL."""

from __future__ import annotations

import inspect
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import parse_url

from ratelimit.backends.redis.compat import CLIENTS, CLUSTERS
from ratelimit.backends.redis.schemes import CLUSTER_SCHEMES as CLUSTER_SCHEMES
from ratelimit.backends.redis.schemes import SCHEMES as SCHEMES
from ratelimit.backends.redis.schemes import SENTINEL_SCHEME
from ratelimit.backends.redis.sentinel import (
    SentinelDiscovery,
    SentinelURL,
    sentinel_client,
)
from ratelimit.core.checks import check_spread
from ratelimit.errors import ConfigurationError

RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"


def client_from_url(url: str, **options: Any) -> RedisClient:
    """A redis-py asyncio client for ``url``; ``options`` go to ``redis.asyncio.from_url``,
    for ``redis+sentinel://`` to ``Sentinel.master_for`` (:func:`sentinel_client`), for
    ``redis+cluster://host:port`` (and ``rediss+cluster://``) to ``RedisCluster.from_url``
    (with the URL's plain scheme: the cluster's nodes are found from that one)."""
    scheme = urlsplit(url).scheme
    if scheme == SENTINEL_SCHEME:
        return sentinel_client(url, **options)
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(_plain(url), **options)
    client: aioredis.Redis = aioredis.from_url(url, **options)
    return client


def client_options(scheme: str, connection_class: object = None) -> frozenset[str]:
    """The keywords redis-py takes for a client of ``scheme`` (read from the signatures of
    what :func:`client_from_url` calls, so they follow the installed redis-py): what
    ``RateLimit.from_url`` passes on; any other keyword is refused there, before a client is
    opened, rather than failing every decision. ``connection_class``: the one given, whose
    own keywords are taken too."""
    connection = aioredis.connection
    if scheme == SENTINEL_SCHEME:
        makers: tuple[Any, ...] = (
            connection.ConnectionPool,
            aioredis.sentinel.SentinelConnectionPool,
            connection.SSLConnection,
        )
        extra = {"ssl", "sentinel_kwargs", "redis_class", "connection_pool_class"}
    elif scheme in CLUSTER_SCHEMES:
        node = aioredis.cluster.ClusterNode
        makers, extra = (RedisCluster, node, connection.Connection), set()
    else:
        last = {"rediss": connection.SSLConnection, "unix": connection.UnixDomainSocketConnection}
        makers = (aioredis.Redis.from_url, connection.ConnectionPool, last.get(scheme))
        makers += (connection.Connection,) if scheme != "unix" else ()
        extra = set()
    if isinstance(connection_class, type):  # its own keywords, as redis-py passes them on
        makers += (connection_class,)
    names = set(extra)
    for maker in makers:
        for cls in getattr(maker, "__mro__", (maker,)):
            init = getattr(cls, "__init__", None) if isinstance(cls, type) else cls
            if init is None or init is object.__init__:
                continue
            for parameter in inspect.signature(init).parameters.values():
                if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                    names.add(parameter.name)
    return frozenset(names - {"self", "url", "cls", "service_name", "sentinel_manager"})


def check_redis_url(url: str) -> None:
    """Parse ``url`` as :func:`client_from_url` would, opening nothing: ``ValueError`` (or
    ``ConfigurationError``) saying what is wrong."""
    scheme = urlsplit(url).scheme
    if scheme == SENTINEL_SCHEME:
        SentinelURL(url)
    elif scheme in CLUSTER_SCHEMES:
        parsed = parse_url(_plain(url))
        if not parsed.get("host"):
            raise ConfigurationError(f"{scheme}:// names one node of the cluster: host[:port]")
        if parsed.get("db"):
            raise ConfigurationError(
                f"a Redis Cluster has database 0 only, not {parsed['db']} ({scheme}://host:port)"
            )
    else:
        parse_url(url)


def _plain(url: str) -> str:
    """A cluster URL with the scheme of one server (``redis+cluster:`` -> ``redis:``)."""
    scheme, _, rest = url.partition(":")
    return f"{CLUSTER_SCHEMES[scheme]}:{rest}"


async def close_client(client: Any) -> None:
    """Close a client opened here, and the connections to its sentinels if it has some."""
    await client.aclose()
    sentinel = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    if isinstance(sentinel, SentinelDiscovery):  # made by sentinel_client, for this client
        await sentinel.aclose()


def is_redis_client(obj: object) -> bool:
    """Whether ``obj`` is an asyncio client the Redis engines can drive: redis-py's
    ``Redis`` or ``RedisCluster``, or valkey-py's ``Valkey`` or ``ValkeyCluster``."""
    return isinstance(obj, CLIENTS)


def spreads_on(client: object, spread: object) -> bool:
    """The ``spread`` setting for ``client`` (checked): ``None`` spreads on a cluster
    client (``RedisCluster``, ``ValkeyCluster``) only."""
    check_spread(spread)
    return isinstance(client, CLUSTERS) if spread is None else bool(spread)


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
