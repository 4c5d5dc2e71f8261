"""A ``ratelimit.sync.RateLimit`` no longer referenced, never closed, gives back its loop's
thread and its store's connections (memory, Redis with both engines, PostgreSQL)."""

from __future__ import annotations

import atexit
import gc
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ratelimit.sync import RateLimit
from ratelimit.sync import limiter as sync_limiter
from ratelimit.sync import portal as sync_portal
from tests.test_sync_limiter import STORES, sync_limiter_on

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=STORES)
def make(request: pytest.FixtureRequest) -> Callable[..., RateLimit]:
    """``make(**settings)``: a sync limiter on the parametrized store, never closed here."""

    def factory(namespace: str | None = None, **settings: Any) -> RateLimit:
        namespace = namespace or f"dropped-{uuid.uuid4().hex[:12]}"
        # these tests count exactly: a loaded machine must not make a decision degraded
        if "memory" not in request.node.name:
            settings.setdefault("timeout", 5.0)
        return sync_limiter_on(request, namespace, **settings)

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


CHILD = """
import sys
from ratelimit.sync import RateLimit
url, namespace, kind = sys.argv[1:4]
settings = {"use_scripts": False} if kind == "redis-commands" else {}
if kind == "postgres":
    settings["algorithm"] = "sliding-window"
rl = RateLimit.from_url(url, namespace, background=True, **settings)
limit = rl.limit("50/h", key="k")
for _ in range(5):
    limit.decide()
del rl, limit  # collected here; the process exits at once
"""


@pytest.mark.long
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-commands", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def test_a_limiter_dropped_just_before_exit_counts_what_background_queued(
    kind: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("postgres_url" if kind == "postgres" else "redis_url")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _ in range(3):  # the loss was a race with the exit: give it several chances
        namespace = f"exit-{uuid.uuid4().hex[:12]}"
        subprocess.run(
            [sys.executable, "-c", CHILD, url, namespace, kind], check=True, cwd=root, timeout=30
        )
        settings: dict[str, Any] = {"algorithm": "sliding-window"} if kind == "postgres" else {}
        with RateLimit.from_url(url, namespace, **settings) as reader:
            assert reader.limit("50/h", key="k").peek().remaining == 50 - 5 - 1


def registered_at_exit() -> int:
    return atexit._ncallbacks()  # CPython's


def test_made_and_dropped_limiters_leave_no_registrations_behind() -> None:
    def once() -> None:
        RateLimit.from_url("memory://").limit("5/m", key="k").decide()

    once()
    gc.collect()
    before = registered_at_exit()
    limiters, portals = len(sync_limiter._live), len(sync_portal._live)  # others' tests'
    for _ in range(50):
        once()
    gc.collect()
    assert registered_at_exit() == before
    assert len(sync_limiter._live) <= limiters
    for thread in list(sync_portal._abandoned):  # their loops end; each leaves the set
        thread.join(10)
    assert not sync_portal._abandoned
    gc.collect()  # a portal is held by its loop until that ends
    assert len(sync_portal._live) <= portals
