"""A ``ratelimit.sync.RateLimit`` no longer referenced, never closed, gives back its loop's
thread and its store's connections (memory, Redis with both engines, PostgreSQL)."""

from __future__ import annotations

import gc
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ratelimit.sync import RateLimit

pytestmark = pytest.mark.timeout(60)

STORES = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-commands", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=STORES)
def make(request: pytest.FixtureRequest) -> Callable[..., RateLimit]:
    """``make(**settings)``: a sync limiter on the parametrized store, never closed here."""

    def factory(namespace: str | None = None, **settings: Any) -> RateLimit:
        namespace = namespace or f"dropped-{uuid.uuid4().hex[:12]}"
        kind: str = request.param
        if kind == "memory":
            url = "memory://"
        elif kind == "postgres":
            url = request.getfixturevalue("postgres_url")
            settings.setdefault("algorithm", "sliding-window")
        else:
            url = request.getfixturevalue("redis_url")
            if kind == "redis-commands":
                settings["use_scripts"] = False
        return RateLimit.from_url(url, namespace, **settings)

    return factory


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_dropped_limiters_give_back_their_threads_and_connections(
    make: Callable[..., RateLimit],
) -> None:
    make().limit("5/m", key="warm").decide()  # the store's first connection, kept by others
    gc.collect()
    before = descriptors()
    made = [make() for _ in range(5)]
    for rl in made:
        rl.limit("5/m", key="k").decide()
        rl.overrides.list()
    threads = [rl.portal._thread for rl in made]
    assert all(thread is not None and thread.is_alive() for thread in threads)
    assert descriptors() > before
    del made, rl
    gc.collect()
    for thread in threads:
        assert thread is not None
        thread.join(10)
    assert [thread.is_alive() for thread in threads if thread is not None] == [False] * 5
    assert descriptors() <= before


def test_a_limiter_in_use_is_not_collected() -> None:
    rl = RateLimit.from_url("memory://")
    limit = rl.limit("5/m", key="k")
    del rl
    gc.collect()
    assert limit.decide().allowed  # the limit holds its limiter
    thread = limit._owner.portal._thread
    assert thread is not None
    assert thread.is_alive()
    del limit
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    assert all(t is not thread for t in threading.enumerate())


def test_a_dropped_limiter_counts_what_background_queued(
    make: Callable[..., RateLimit], request: pytest.FixtureRequest
) -> None:
    if "memory" in request.node.name:
        pytest.skip("a memory:// limiter's store goes with it")
    namespace = f"dropped-{uuid.uuid4().hex[:12]}"
    rl = make(namespace, background=True)
    limit = rl.limit("5/h", key="k")
    assert [limit.decide().allowed for _ in range(3)] == [True] * 3  # queued, not yet sent
    thread = rl.portal._thread
    assert thread is not None
    del rl, limit
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    with make(namespace) as reader:
        assert reader.limit("5/h", key="k").peek().remaining == 5 - 3 - 1
