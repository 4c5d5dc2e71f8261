"""Storage URLs: which schemes there are, checking one before anything is opened, and
showing one without its password.

Each store declares its schemes and checks its own URLs: ``MemoryBackend.schemes``, the
Redis engines' :data:`~ratelimit.backends.redis.client.SCHEMES` (with
:func:`~ratelimit.backends.redis.client.check_redis_url`) and Postgres's
:data:`~ratelimit.backends.postgres.url.SCHEMES` (with
:func:`~ratelimit.backends.postgres.url.check_postgres_url`). :data:`SCHEMES`, the messages
here and the dispatch of ``RateLimit.from_url`` (``backends.backend_from_url``) are built
from those declarations.

A malformed URL (``redis://h:notaport/0``) is a ``ConfigurationError`` when the limiter is
made (``RateLimit.from_url``), naming the URL and what is wrong, never a traceback from a
client library at the first call; the command line and the service check the URL the same
way and name the option or variable that gave it.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from ratelimit.backends.memory.backend import MemoryBackend
from ratelimit.backends.postgres.url import NAMED as POSTGRES_NAMED
from ratelimit.backends.postgres.url import SCHEMES as POSTGRES_SCHEMES
from ratelimit.backends.postgres.url import check_postgres_url
from ratelimit.backends.redis.schemes import SCHEMES as REDIS_SCHEMES
from ratelimit.errors import ConfigurationError

MEMORY_SCHEMES = MemoryBackend.schemes
SCHEMES = (*MEMORY_SCHEMES, *REDIS_SCHEMES, *POSTGRES_SCHEMES)
"""Every scheme ``RateLimit.from_url`` opens, as the stores declare them."""
_SHOWN = [f"{scheme}://" for scheme in (*MEMORY_SCHEMES, *REDIS_SCHEMES, *POSTGRES_NAMED)]


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
            from ratelimit.backends.redis.client import check_redis_url  # redis-py: when used

            check_redis_url(url)
        elif scheme in POSTGRES_SCHEMES:
            check_postgres_url(url)
    except (ValueError, ConfigurationError) as exc:  # ValueError: "Invalid IPv6 URL" too
        return str(exc)
    return None
