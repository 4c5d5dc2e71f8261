"""The Redis backend's script engine: one EVALSHA per decision, atomic, on the server's clock.

The whole plan (every rule of the tree and every identifier) goes to ``sliding_log.lua`` in
one round trip; Redis runs it alone, so counting and recording cannot interleave with
another decision, and no lock is needed. The time comes from Redis ``TIME`` (microseconds),
so application servers need no clock agreement, unless a clock is injected (tests).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from ratelimit.algorithms import SLIDING_LOG, SLIDING_WINDOW
from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.keys import counter_key, identifier_key
from ratelimit.decision import Decision
from ratelimit.errors import BackendError
from ratelimit.plan import CounterUpdate, Plan, evaluate

RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"

_LUA = resources.files("ratelimit.backends").joinpath("lua")
SLIDING_LOG_LUA = _LUA.joinpath("sliding_log.lua").read_text()
WINDOW_COUNTERS_LUA = _LUA.joinpath("window_counters.lua").read_text()
COUNTER_UPDATE_LUA = _LUA.joinpath("counter_update.lua").read_text()


def client_from_url(url: str, **options: Any) -> aioredis.Redis:
    """A redis-py asyncio client for ``url``; ``options`` go to ``redis.asyncio.from_url``."""
    client: aioredis.Redis = aioredis.from_url(url, **options)
    return client


def is_redis_client(obj: object) -> bool:
    """Whether ``obj`` is a redis-py asyncio client this backend can drive."""
    return isinstance(obj, aioredis.Redis | RedisCluster)


class RedisScriptBackend:
    """Decides plans with one Lua script call against ``client`` (one script per family of
    algorithms: ``sliding_log.lua``, ``window_counters.lua``).

    ``clock`` (seconds) replaces the server's ``TIME``, for tests that step time;
    ``owns_client`` closes the client in :meth:`aclose` (``RateLimit.from_url`` sets it).

    Example::

        backend = RedisScriptBackend(redis.asyncio.Redis())
    """

    def __init__(
        self, client: RedisClient, *, clock: Clock | None = None, owns_client: bool = False
    ) -> None:
        self.client = client
        self._clock = clock
        self._owns_client = owns_client
        self._log_script: AsyncScript = client.register_script(SLIDING_LOG_LUA)
        self._counter_script: AsyncScript = client.register_script(WINDOW_COUNTERS_LUA)
        self._update_script: AsyncScript = client.register_script(COUNTER_UPDATE_LUA)

    async def decide(self, plan: Plan) -> Decision:
        if not plan.identifiers:
            return evaluate(plan, 0, [(0, 0)] * len(plan.compiled.rules))
        args: list[bytes | int | str] = [
            b"" if self._clock is None else clock_us(self._clock),
            plan.compiled.wire,
            _slots(plan.leaf_identifiers),
            repr(plan.cost),  # repr: the shortest text that reads back as the same float
        ]
        if plan.algorithm == SLIDING_LOG:
            script = self._log_script
            keys = [identifier_key(identifier) for identifier in plan.identifiers]
        else:
            script = self._counter_script
            keys = [counter_key(identifier) for identifier in plan.identifiers]
            args.append(b"1" if plan.algorithm == SLIDING_WINDOW else b"0")
        try:
            reply = await script(keys=keys, args=args)
        except RedisError as exc:
            raise BackendError(f"redis failed to decide key {plan.key!r}: {exc}") from exc
        allowed, now, *flat = reply
        numbers = [float(n) if plan.algorithm != SLIDING_LOG else int(n) for n in flat]
        decision = evaluate(plan, int(now), list(zip(numbers[0::2], numbers[1::2], strict=True)))
        if decision.allowed != bool(allowed):  # pragma: no cover - would be a bug in one of two
            raise BackendError(f"script and evaluator disagree on key {plan.key!r}")
        return decision

    async def update_counter(self, update: CounterUpdate) -> float:
        args = (
            b"" if self._clock is None else clock_us(self._clock),
            update.size_us,
            repr(update.value),
            b"" if update.weight is None else repr(update.weight),
        )
        try:
            rate = await self._update_script(keys=[counter_key(update.identifier)], args=args)
        except RedisError as exc:
            raise BackendError(
                f"redis failed to update counter {update.identifier.key!r}: {exc}"
            ) from exc
        return float(rate)

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()


@functools.lru_cache(maxsize=1024)
def _slots(leaf_identifiers: tuple[int, ...]) -> bytes:
    """ARGV[3] of the script: per leaf its 1-based key index, 0 for none."""
    return " ".join(str(i + 1) for i in leaf_identifiers).encode()
