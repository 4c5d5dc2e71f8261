"""redis-py's public API by default; the fast path only where it was tested; version limits."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ratelimit import ConfigurationError, RateLimit
from ratelimit.backends import RedisCommandBackend, RedisScriptBackend
from ratelimit.backends.redis import client as client_module
from ratelimit.backends.redis.script import fast_pipeline


async def test_the_fast_path_runs_only_where_it_was_tested(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = aioredis.Redis()
    assert RedisScriptBackend(client).fast_path
    public = RedisScriptBackend(client, fast_path=False)
    assert not public.fast_path
    # an untested redis-py release (newer or older) gets the public path
    for version in ((9, 0), (5, 2)):
        monkeypatch.setattr(fast_pipeline, "redis_py_version", lambda v=version: v)
        assert not RedisScriptBackend(client).fast_path
        with pytest.raises(ConfigurationError, match="fast_path=True needs"):
            RedisScriptBackend(client, fast_path=True)
    monkeypatch.undo()
    # so does a client it cannot drive: one of a single connection
    single = aioredis.Redis(single_connection_client=True)
    assert not RedisScriptBackend(single).fast_path
    await client.aclose()
    await single.aclose()


def test_the_command_engine_refuses_a_cluster_it_cannot_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = RedisCluster.__new__(RedisCluster)  # not connected: only its type is read
    monkeypatch.setattr(client_module, "redis_py_version", lambda: (6, 1))
    with pytest.raises(ConfigurationError, match="needs redis-py 6.2 or later"):
        RedisCommandBackend(cluster)
    with pytest.raises(ConfigurationError, match="use the script engine"):
        RateLimit(cluster, use_scripts=False)


async def test_a_script_engine_is_freed_without_the_garbage_collector() -> None:
    """No reference cycle through the backend: a cache of its own bound to it kept 8 192
    commands per dead backend alive until the collector's slowest pass, whose pauses cost
    a third of the decisions per second at concurrency 64 in bench/suite.py."""
    import gc
    import weakref

    client = aioredis.Redis()
    for fast_path in (None, False):
        backend = RedisScriptBackend(client, fast_path=fast_path)
        assert backend.fast_path == (fast_path is None)
        gone = weakref.ref(backend)
        gc.disable()
        try:
            del backend
            assert gone() is None
        finally:
            gc.enable()
    await client.aclose()
