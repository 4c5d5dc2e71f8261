"""The Redis backend: every module of this package that talks to redis-py lives here.

- ``client``: which redis-py clients qualify, opening one by URL, and the URL schemes
  (:data:`~ratelimit.backends.redis.client.SCHEMES`); ``sentinel``: ``redis+sentinel://``;
  ``compat``: valkey-py's classes beside redis-py's;
- ``keys``: the key layout (logs, their companions, window counters, locks);
- ``errors``: the one place redis-py's errors become :class:`~ratelimit.errors.BackendError`;
- ``script_engine`` (default): one atomic Lua script per decision; ``scripts`` says what
  each algorithm sends its script, and ``lua/`` holds them;
- ``pipeline``: automatic pipelining of those scripts through redis-py's public
  ``pipeline()``; ``fast_pipeline`` (with ``resp``): the same on borrowed connections, for
  the redis-py versions it was tested with;
- ``command_engine`` and ``lock``: plain commands under a Redis lock (``use_scripts=False``),
  deciding each algorithm in ``command_decisions`` and holding slots in ``command_slots``;
- ``connections``: sharing the application's pool, and event loops that end.

The synced counters of ``sync_rate`` (:mod:`ratelimit.backends.synced`) sync through the
script engine but live beside the backends, since they serve Postgres too.
"""

from ratelimit.backends.redis.client import RedisClient, client_from_url, is_redis_client
from ratelimit.backends.redis.command.engine import RedisCommandBackend
from ratelimit.backends.redis.script.engine import RedisScriptBackend

__all__ = [
    "RedisClient",
    "RedisCommandBackend",
    "RedisScriptBackend",
    "client_from_url",
    "is_redis_client",
]
