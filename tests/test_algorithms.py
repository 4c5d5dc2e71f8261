"""The algorithm objects (issue 22): chosen once by name, asked by every layer, and each
backend's table of the ones it decides."""

from __future__ import annotations

import fakeredis
import pytest

from ratelimit import MemoryBackend, RateLimit, RedisCommandBackend, RedisScriptBackend
from ratelimit.algorithms import ALGORITHMS, BY_NAME, Algorithm, named
from ratelimit.backends.postgres.backend import PostgresBackend
from ratelimit.backends.synced import SyncedBackend
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CounterUpdate, Plan
from ratelimit.errors import ConfigurationError


def test_each_name_gives_one_shared_object() -> None:
    for name in ALGORITHMS:
        algorithm = named(name)
        assert isinstance(algorithm, Algorithm)
        assert algorithm is BY_NAME[name]
        assert named(algorithm) is algorithm
        assert str(algorithm) == name
        assert name in repr(algorithm)
    with pytest.raises(ConfigurationError, match="unknown algorithm 'leaky'.*sliding-log"):
        named("leaky")
    with pytest.raises(ConfigurationError, match="unknown algorithm 3"):
        named(3)


def test_the_memory_and_redis_engines_decide_every_algorithm() -> None:
    client = fakeredis.FakeAsyncRedis()
    for backend in (MemoryBackend(), RedisScriptBackend(client), RedisCommandBackend(client)):
        assert backend.algorithms == frozenset(ALGORITHMS), type(backend).__name__


def test_window_counter_stores_decide_the_window_counters_only() -> None:
    counters = {name for name, a in BY_NAME.items() if a.windowed}
    assert PostgresBackend.algorithms == counters == SyncedBackend.algorithms
    assert counters == {"sliding-window", "fixed-window"}


class _CountersOnly:
    """A backend object of the user's that says it keeps window counters only."""

    algorithms = frozenset({"sliding-window"})

    async def decide(self, plan: Plan) -> Decision:
        raise AssertionError("never asked")

    async def reset(self, plan: Plan) -> None:
        raise AssertionError("never asked")

    async def update_counter(self, update: CounterUpdate) -> float:
        raise AssertionError("never asked")

    async def aclose(self) -> None:
        return None


def test_an_algorithm_the_storage_does_not_decide_fails_when_the_limiter_is_made() -> None:
    with pytest.raises(ConfigurationError, match="_CountersOnly.*'gcra'.*'sliding-window'"):
        RateLimit(_CountersOnly(), "ns", algorithm="gcra")
    RateLimit(_CountersOnly(), "ns", algorithm="sliding-window")  # what it keeps: fine
    with pytest.raises(ConfigurationError, match="Postgres keeps window counters"):
        RateLimit.from_url("postgresql://app@127.0.0.1:1/app", algorithm="gcra")
