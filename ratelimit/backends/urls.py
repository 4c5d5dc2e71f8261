"""Storage URLs: which schemes there are, checking one before anything is opened, and
showing one without its password.

A malformed URL (``redis://h:notaport/0``) is a ``ConfigurationError`` when the limiter is
made (``RateLimit.from_url``), naming the URL and what is wrong, never a traceback from a
client library at the first call; the command line and the service check the URL the same
way and name the option or variable that gave it.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from ratelimit.errors import ConfigurationError

MEMORY_SCHEMES = ("memory",)
"""The in-process :class:`~ratelimit.MemoryBackend`."""
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")
"""The Redis engines, over a redis-py client (``redis+sentinel``: found through Sentinel)."""
POSTGRES_SCHEMES = ("postgresql", "postgres")
"""Window counters in PostgreSQL (``postgres`` as libpq also takes it)."""
SCHEMES = (*MEMORY_SCHEMES, *REDIS_SCHEMES, *POSTGRES_SCHEMES)
"""Every scheme ``RateLimit.from_url`` opens: the one list, which messages are built from."""
_SHOWN = [f"{scheme}://" for scheme in SCHEMES if scheme != "postgres"]


def redacted(url: str) -> str:
    """``url`` with its password, if it has one, shown as ``****``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:  # too malformed to find its password: show its scheme only
        return f"{url.partition(':')[0]}://..."
    user, _, hosts = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:****@{hosts}"))


USE = f"use {', '.join(_SHOWN[:-1])} or {_SHOWN[-1]}"
UNSUPPORTED = f"unsupported storage: {USE}"


def check_storage_url(url: object) -> None:
    """Raise ``ConfigurationError`` naming ``url`` (its password hidden) and what is wrong
    with it (:func:`storage_url_problem`). Opens nothing."""
    if not isinstance(url, str):
        raise TypeError(f"a storage URL is text, not {type(url).__name__}")
    problem = storage_url_problem(url)
    if problem == UNSUPPORTED:
        raise ConfigurationError(f"unsupported storage URL {redacted(url)!r}: {USE}")
    if problem is not None:
        raise ConfigurationError(f"storage URL {redacted(url)!r}: {problem}")


def storage_url_problem(url: str) -> str | None:
    """What keeps ``url`` from being a storage URL that ``RateLimit.from_url`` can open (an
    unknown scheme, a port that is not a number from 0 to 65535, a ``redis+sentinel://``
    URL without its service, options redis-py refuses), or ``None``. Opens nothing."""
    try:
        scheme = urlsplit(url).scheme
        if scheme not in SCHEMES:
            return UNSUPPORTED
        if scheme in REDIS_SCHEMES:
            from ratelimit.backends.redis.client import check_redis_url

            check_redis_url(url)
        elif scheme in POSTGRES_SCHEMES:
            _check_hosts(urlsplit(url).netloc)
    except (ValueError, ConfigurationError) as exc:  # ValueError: "Invalid IPv6 URL" too
        return str(exc)
    return None


def _check_hosts(netloc: str) -> None:
    """Each ``host[:port]`` of a (possibly multi-host) ``postgresql://`` URL."""
    hosts = netloc.rpartition("@")[2]
    if not hosts:
        return  # the default host, or ?host= in the query
    for host in hosts.split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        _, colon, digits = port.rpartition(":") if ":" in port else ("", "", "")
        if not host or (colon and not (digits.isdigit() and int(digits) <= 65535)):
            raise ValueError(f"hosts are host[:port] with a port from 0 to 65535, not {host!r}")
