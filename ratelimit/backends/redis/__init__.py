"""The Redis backend: every module of this package that talks to redis-py lives here.

- ``client``: which redis-py clients qualify, and opening one by URL;
- ``keys``: the key layout (logs, their companions, window counters, locks);
- ``errors``: the one place redis-py's errors become :class:`~ratelimit.errors.BackendError`;
- ``script_engine`` (default): one atomic Lua script per decision, ``lua/`` holds them;
- ``pipeline``: automatic pipelining of those scripts through redis-py's public
  ``pipeline()``; ``fast_pipeline``: the same on borrowed connections, for the redis-py
  versions it was tested with;
- ``command_engine`` and ``lock``: plain commands under a Redis lock (``use_scripts=False``);
- ``synced``: ``sync_rate > 0``, local counters synced through the script engine;
- ``connections``: sharing the application's pool, and event loops that end.
"""

from ratelimit.backends.redis.client import RedisClient, client_from_url, is_redis_client
from ratelimit.backends.redis.command_engine import RedisCommandBackend
from ratelimit.backends.redis.script_engine import RedisScriptBackend

__all__ = [
    "RedisClient",
    "RedisCommandBackend",
    "RedisScriptBackend",
    "client_from_url",
    "is_redis_client",
]
