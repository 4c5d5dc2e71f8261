"""The Redis store: every module that talks to redis-py lives under this folder.

- ``client``: which redis-py clients qualify and opening one by URL; ``schemes``: the URL
  schemes (:data:`~ratelimit.backends.redis.schemes.SCHEMES`, named without redis-py);
  ``sentinel``: ``redis+sentinel://``;
  ``compat``: valkey-py's classes beside redis-py's; ``connections``: sharing the
  application's pool, and event loops that end;
- ``keys``: the key layout (logs, their companions, window counters, locks); ``old_layout``:
  the warning of counters kept before spreading; ``resp``: commands packed once;
- ``errors``: where redis-py's errors become :class:`~ratelimit.errors.BackendError`;
- ``script/`` (the default engine): one atomic script call per decision (``lua/`` holds the
  scripts and the fragments they are joined from), pipelined automatically;
- ``command/`` (``use_scripts=False``): plain commands under a Redis lock;
- ``overrides`` and ``penalties``: what both engines keep for those features.

The synced counters of ``sync_rate`` (:mod:`ratelimit.backends.synced`) sync through the
script engine but live beside the stores, since they serve Postgres too.

Its names are imported when first used (``from ratelimit.backends.redis import
RedisScriptBackend``), so that importing the package, or its :mod:`.schemes`, does not
import redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratelimit.core.lazy import lazily

if TYPE_CHECKING:
    from ratelimit.backends.redis.client import (
        RedisClient,
        client_from_url,
        client_options,
        is_redis_client,
    )
    from ratelimit.backends.redis.command.engine import RedisCommandBackend
    from ratelimit.backends.redis.script.engine import RedisScriptBackend

__getattr__ = lazily(
    __name__,
    {
        "RedisClient": "ratelimit.backends.redis.client",
        "client_from_url": "ratelimit.backends.redis.client",
        "client_options": "ratelimit.backends.redis.client",
        "is_redis_client": "ratelimit.backends.redis.client",
        "RedisCommandBackend": "ratelimit.backends.redis.command.engine",
        "RedisScriptBackend": "ratelimit.backends.redis.script.engine",
    },
)


__all__ = [
    "RedisClient",
    "RedisCommandBackend",
    "RedisScriptBackend",
    "client_from_url",
    "client_options",
    "is_redis_client",
]
