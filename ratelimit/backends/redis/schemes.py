"""The storage URLs of the Redis store, named without importing redis-py (which
``memory://`` and PostgreSQL users never need: ``import ratelimit`` stays light)."""

SENTINEL_SCHEME = "redis+sentinel"
"""``redis+sentinel://``: the primary of a Sentinel-watched service."""
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""Storage URLs of a Redis Cluster (any one node's address: the client finds the others),
and the scheme each is for one server (TLS: ``rediss+cluster``)."""
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME, *CLUSTER_SCHEMES)
"""The storage URLs that open a client for the Redis engines
(:func:`~ratelimit.backends.redis.client.client_from_url`; ``redis+sentinel``: the primary
found through Sentinel; ``redis+cluster``: a ``RedisCluster``). The engines declare these as
their ``schemes``."""
