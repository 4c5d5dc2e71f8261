"""Redis connected as envoyproxy/ratelimit connects to it (``src/redis/driver_impl.go``):
``REDIS_SOCKET_TYPE`` (``unix`` or ``tcp``), ``REDIS_TYPE`` (``SINGLE``, ``CLUSTER`` or
``SENTINEL``), ``REDIS_URL`` (a socket's path, ``host:port``, a comma list of nodes, or
``master,sentinel1,...``; a whole ``redis://`` URL too), ``REDIS_AUTH`` (``password`` or
``user:password``), TLS, the pool's size and the timeout; the same for the per-second
Redis. The settings come from :mod:`ratelimit.service.envoy_service.settings`
(:class:`ConnectionSettings` is what is read of them).

Example::

    client = redis_client(EnvoySettings.from_env(os.environ).redis)
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import (
    BlockingConnectionPool,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.backoff import NoBackoff

from ratelimit.backends.redis.sentinel import SentinelDiscovery
from ratelimit.errors import ConfigurationError


class ConnectionSettings(Protocol):
    """What a connection is made of (``RedisSettings`` of the service's settings)."""

    @property
    def socket_type(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def pool_size(self) -> int: ...
    @property
    def auth(self) -> str: ...
    @property
    def tls(self) -> bool: ...
    @property
    def tls_client_cert(self) -> str: ...
    @property
    def tls_client_key(self) -> str: ...
    @property
    def tls_cacert(self) -> str: ...
    @property
    def tls_skip_hostname_verification(self) -> bool: ...
    @property
    def timeout(self) -> float: ...
    @property
    def sentinel_auth(self) -> str: ...
    @property
    def prefix(self) -> str:
        """The variables' prefix (``REDIS``, ``REDIS_PERSECOND``), for errors."""
        ...

    def check(self) -> None: ...


def scheme_of(url: str) -> str:
    """The scheme of a URL given whole (``redis``, ``rediss``, ``unix``), else ``""``."""
    scheme, found, _ = url.partition("://")
    return scheme.lower() if found else ""


def address_of(text: str, lowest: int = 1) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``) as Go's ``net.SplitHostPort`` splits it; ``None`` if not."""
    host, colon, port = text.strip().rpartition(":")
    if not colon or not re.fullmatch(r"[0-9]{1,5}", port) or not lowest <= int(port) <= 65535:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None
    return host, int(port)


def endpoints(settings: ConnectionSettings) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs ``settings.url`` names (for ``SENTINEL``, the sentinels'),
    none for a socket's path or a whole URL; ``ConfigurationError`` naming ``<prefix>_URL``
    when its form does not fit the type."""
    url, name, kind = settings.url, f"{settings.prefix}_URL", settings.type
    if kind == "SINGLE" and scheme_of(url):
        try:
            if scheme_of(url) not in ("redis", "rediss", "unix"):
                raise ValueError("a URL is redis://, rediss:// or unix://")
            parse_url(url)
        except ValueError as exc:
            raise ConfigurationError(f"{name}={url!r}: {exc}") from None
        return []
    if kind == "SINGLE" and settings.socket_type == "unix":
        return []
    items = url.split(",")
    if kind == "SENTINEL":
        if len(items) < 2 or not items[0].strip():
            raise ConfigurationError(
                f"{name}={url!r}: Expected master name and a list of urls for the sentinels, "
                "in the format: <redis master name>,<sentinel1>,...,<sentineln>"
            )
        items = items[1:]
    if kind == "SINGLE" and len(items) > 1:
        raise ConfigurationError(f"{name}={url!r}: one host:port (a list is for a cluster)")
    found = []
    for item in items:
        address = address_of(item)
        if address is None:
            raise ConfigurationError(f"{name}={url!r}: {item.strip()!r} is not host:port")
        found.append((address[0] or "localhost", address[1]))
    return found


class _WaitingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The master's pool of a ``SENTINEL`` connection, waiting for a free connection when all
    are in use (Go's ``WAIT``) rather than raising."""


def _credentials(auth: str) -> dict[str, Any]:
    """``username``/``password`` from ``password`` or ``user:password`` (Go's split)."""
    if not auth:
        return {}
    user, colon, password = auth.partition(":")
    return {"username": user or None, "password": password} if colon else {"password": auth}


def _tls_options(settings: ConnectionSettings) -> dict[str, Any]:
    """redis-py's TLS keywords: the client pair when both are given (as Go loads it), the CA,
    and the chain always verified, the host name unless skipped (as Go's ``VerifyPeer``)."""
    options: dict[str, Any] = {
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": not settings.tls_skip_hostname_verification,
    }
    if settings.tls_client_cert and settings.tls_client_key:
        options |= {"ssl_certfile": settings.tls_client_cert}
        options |= {"ssl_keyfile": settings.tls_client_key}
    if settings.tls_cacert:
        options["ssl_ca_certs"] = settings.tls_cacert
    return options


def redis_client(settings: ConnectionSettings) -> aioredis.Redis | RedisCluster:
    """A redis-py asyncio client connected as envoyproxy/ratelimit connects (nothing is
    opened until the first command).

    ``SINGLE``: a pool of ``pool_size`` connections to the socket, ``host:port`` or whole
    URL; ``CLUSTER``: a ``RedisCluster`` starting from every ``host:port`` given (at most
    ``pool_size`` connections per node; redis-py's cluster client raises
    ``MaxConnectionsError`` rather than waiting when a node's are all in use); ``SENTINEL``:
    the master of the sentinels (:class:`~ratelimit.backends.redis.sentinel.
    SentinelDiscovery`, with ``sentinel_auth``). A command is sent once (no retries), as Go's
    radix sends it, but on a cluster, where redis-py's retries carry its failover. Close it
    with :func:`~ratelimit.backends.redis.client.close_client` (a sentinel's connections too).
    """
    settings.check()
    timeout = settings.timeout if settings.timeout > 0 else None
    options: dict[str, Any] = {
        **_credentials(settings.auth),
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    tls = _tls_options(settings) if settings.tls or scheme_of(settings.url) == "rediss" else {}
    if settings.type == "CLUSTER":
        nodes = [ClusterNode(host, port) for host, port in endpoints(settings)]
        ssl = {"ssl": True, **tls} if tls else {}
        return RedisCluster(
            startup_nodes=nodes, max_connections=settings.pool_size, **options, **ssl
        )
    options["retry"] = Retry(NoBackoff(), 0)
    pool_options = {"max_connections": settings.pool_size, "timeout": None, **options}
    if settings.type == "SENTINEL":
        sentinel_options: dict[str, Any] = {**_credentials(settings.sentinel_auth)}
        if timeout is not None:
            sentinel_options |= {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if tls:
            sentinel_options |= {"ssl": True, **tls}
        sentinels = SentinelDiscovery(endpoints(settings), sentinel_kwargs=sentinel_options)
        master = settings.url.split(",")[0].strip()
        ssl = {"ssl": True, **tls} if tls else {}
        client: aioredis.Redis = sentinels.master_for(
            master, connection_pool_class=_WaitingSentinelPool, **pool_options, **ssl
        )
        return client
    if scheme_of(settings.url):
        if tls:
            pool_options |= {"connection_class": SSLConnection, **tls}
        pool = BlockingConnectionPool.from_url(settings.url, **pool_options)
    elif settings.socket_type == "unix":
        unix = UnixDomainSocketConnection
        pool = BlockingConnectionPool(connection_class=unix, path=settings.url, **pool_options)
    else:
        ((host, port),) = endpoints(settings)
        tcp = SSLConnection if tls else Connection
        pool = BlockingConnectionPool(
            connection_class=tcp, host=host, port=port, **pool_options, **tls
        )
    return aioredis.Redis.from_pool(pool)
