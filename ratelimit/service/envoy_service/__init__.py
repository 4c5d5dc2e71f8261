"""``ratelimit serve --envoy``: envoyproxy/ratelimit's service, as a drop-in.

- :mod:`.settings`: its environment variables, with its defaults;
- :mod:`.counting`: its fixed windows, on its Redis keys (``INCRBY`` per descriptor);
- :mod:`.answers`: ``ShouldRateLimit`` answered as its service answers;
- :mod:`.stats`: its stat names, over statsd and Prometheus;
- :mod:`.server`: the gRPC service, ``/json`` and ``/healthcheck``, ``/rlconfig``, and the
  configuration directory reloaded when it changes.
"""
