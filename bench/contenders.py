"""What ``bench/suite.py`` measures: ours in each configuration, the peers, and two floors.

Every contender is an async factory taking the Redis URL and the rule (``limit`` calls per
minute per user) and returning a :class:`Contender`: ``decide(user)`` makes one decision for
``user`` and says whether it was admitted. Each builds on redis-py against the same server,
keeps its state under a fresh prefix, and is closed after its run.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from ratelimit import RateLimit
from ratelimit.backends import RedisScriptBackend
from ratelimit.backends.redis.keys import identifier_key, kept_key
from ratelimit.backends.redis.script.scripts import SLIDING_LOG_ONE, tree_wire
from ratelimit.core.plan import Identifier, compile_tree
from ratelimit.rules.tree import Rule

Decide = Callable[[str], Awaitable[bool]]
DecideMany = Callable[[list[str]], Awaitable[list[bool]]]


@dataclass
class Contender:
    decide: Decide
    close: Callable[[], Awaitable[None]]
    many: DecideMany | None = None
    """If set, the harness sends ``concurrency`` decisions at a time through it instead."""
    prefix: str = ""
    """Text in every Redis key it writes (for memory per identifier), or ``""`` for none."""
    batched: tuple[float, float] | None = None
    """Set by the harness: decisions per script call, and the median decision's batch."""
    sizes: Counter[int] | None = None
    """Ours on the script engine: how many script calls carried how many decisions (the
    backend's ``calls_per_script``, counting on)."""


def _sizes(rl: RateLimit) -> Counter[int] | None:
    storage = rl.storage
    return storage.calls_per_script if isinstance(storage, RedisScriptBackend) else None


Factory = Callable[[str, int], Awaitable[Contender]]

ENGINE_OPTIONS = frozenset({"auto_pipeline"})
"""Options of :func:`ours` that go to the script engine when it is built here."""


def _prefix() -> str:
    return f"bench-{uuid.uuid4().hex[:8]}"


def _client(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, max_connections=256)


def ours(
    storage: str | None = None,
    *,
    fast_path: bool | None = None,
    batch_scripts: bool = True,
    **options: Any,
) -> Factory:
    """``@rl.limit(f"user:{limit}/m")`` on a ``RateLimit`` built with ``options``, on a
    redis-py client, or on ``storage`` (a URL such as ``memory://``) when given.
    ``fast_path=False``: the script engine on redis-py's public API only;
    ``batch_scripts=False``: one script call per decision."""

    async def factory(url: str, limit: int) -> Contender:
        prefix = _prefix()
        if storage is not None:
            rl = RateLimit.from_url(storage, prefix, **options)
            close: Callable[[], Awaitable[None]] = rl.aclose
        else:
            client = _client(url)
            if fast_path is None and batch_scripts:
                rl = RateLimit(client, prefix, **options)
            else:
                engine_options = {k: v for k, v in options.items() if k in ENGINE_OPTIONS}
                limiter_options = {k: v for k, v in options.items() if k not in ENGINE_OPTIONS}
                engine = RedisScriptBackend(
                    client,
                    timeout=0.25,
                    fast_path=fast_path,
                    batch_scripts=batch_scripts,
                    **engine_options,
                )
                rl = RateLimit(engine, prefix, **limiter_options)

            async def close() -> None:
                await rl.aclose()
                await client.aclose()

        @rl.limit(f"user:{limit}/m", key="work")  # a short key, as the peers name theirs
        async def work(user: str) -> bool:
            return True

        prefix = "" if storage is not None else prefix
        return Contender(work, close, prefix=prefix, sizes=_sizes(rl))

    return factory


def ours_settled(**options: Any) -> Factory:
    """:func:`ours` where each call reserves 2 (a cost from the call) and settles 1 once
    its body returned: a decision and a settle per call, the same quota used as ``ours``."""

    async def factory(url: str, limit: int) -> Contender:
        prefix = _prefix()
        client = _client(url)
        rl = RateLimit(client, prefix, **options)

        @rl.limit(f"user:{limit}/m", key="work", cost=lambda user: 2, settle=lambda done: 1)
        async def work(user: str) -> bool:
            return True

        async def close() -> None:
            await rl.aclose()
            await client.aclose()

        return Contender(work, close, prefix=prefix, sizes=_sizes(rl))

    return factory


def ours_overridden(overrides: int, **options: Any) -> Factory:
    """:func:`ours` with ``overrides`` overrides stored (none for the users measured): half
    on the measured key for other users, half on other keys. The lookup is on the path."""

    async def factory(url: str, limit: int) -> Contender:
        prefix = _prefix()
        client = _client(url)
        rl = RateLimit(client, prefix, **options)
        setup = RateLimit(client, prefix, timeout=10.0)  # a loaded machine: setup must not fail
        for n in range(overrides):  # one at a time: writes of one namespace take turns
            if n % 2:
                await setup.overrides.set("work", f"user:{limit * 2}/m", user=f"vip-{n}")
            else:
                await setup.overrides.set(f"other-{n}", f"user:{limit}/h", user="u")
        await setup.aclose()

        @rl.limit(f"user:{limit}/m", key="work")
        async def work(user: str) -> bool:
            return True

        async def close() -> None:
            await rl.aclose()
            await client.aclose()

        return Contender(work, close, prefix=prefix)

    return factory


def ours_postgres(postgres_url: str, **options: Any) -> Factory:
    """``@rl.limit(f"user:{limit}/m")`` on Postgres (the Redis URL is not used)."""

    async def factory(url: str, limit: int) -> Contender:
        # no deadline: a decision past 0.25 s (the pool opening) would be admitted degraded
        rl = RateLimit.from_url(postgres_url, _prefix(), max_size=64, timeout=None, **options)

        @rl.limit(f"user:{limit}/m", key="work")
        async def work(user: str) -> bool:
            return True

        return Contender(work, rl.aclose)

    return factory


async def limits_moving_window(url: str, limit: int) -> Contender:
    from limits import RateLimitItemPerMinute
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import MovingWindowRateLimiter

    return _limits(url, limit, MovingWindowRateLimiter, RateLimitItemPerMinute, RedisStorage)


async def limits_sliding_window(url: str, limit: int) -> Contender:
    from limits import RateLimitItemPerMinute
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import SlidingWindowCounterRateLimiter

    return _limits(
        url, limit, SlidingWindowCounterRateLimiter, RateLimitItemPerMinute, RedisStorage
    )


def _limits(url: str, limit: int, strategy: Any, item_type: Any, storage_type: Any) -> Contender:
    prefix = _prefix()
    storage = storage_type(
        url.replace("redis://", "async+redis://"),
        implementation="redispy",
        key_prefix=prefix,
        max_connections=256,
    )
    limiter = strategy(storage)
    item = item_type(limit)

    async def decide(user: str) -> bool:
        allowed: bool = await limiter.hit(item, "work", user)
        return allowed

    async def close() -> None:
        await storage.reset()

    return Contender(decide, close, prefix=prefix)


def throttled_py(using: str = "sliding_window") -> Factory:
    """throttled-py with one of its algorithms: ``sliding_window``, ``gcra``,
    ``token_bucket``."""

    async def factory(url: str, limit: int) -> Contender:
        from throttled.asyncio import RedisStore, Throttled, per_min

        pool = {"CONNECTION_POOL_KWARGS": {"max_connections": 256}}
        store = RedisStore(server=url, options=pool)
        throttle = Throttled(using=using, quota=per_min(limit), store=store)
        prefix = _prefix()

        async def decide(user: str) -> bool:
            result = await throttle.limit(f"{prefix}:{user}")
            return not result.limited

        async def close() -> None:
            return None

        return Contender(decide, close, prefix=prefix)

    return factory


async def pyrate_limiter(url: str, limit: int) -> Contender:
    """pyrate-limiter's ``RedisBucket`` (a sorted set per bucket), one bucket per user
    routed by a ``BucketFactory``, as its documentation shows for per-key limits."""
    from pyrate_limiter import BucketFactory, Duration, Limiter, Rate, RateItem, RedisBucket

    client = _client(url)
    rates = [Rate(limit, Duration.MINUTE)]
    prefix = _prefix()
    buckets: dict[str, Any] = {}

    class PerUser(BucketFactory):
        def wrap_item(self, name: str, weight: int = 1) -> RateItem:
            return RateItem(name, time.time_ns() // 1_000_000, weight=weight)

        def get(self, item: RateItem) -> Any:
            return buckets[item.name]

    limiter = Limiter(PerUser())

    async def decide(user: str) -> bool:
        if user not in buckets:
            buckets[user] = await RedisBucket.init(rates, client, f"{prefix}:{user}")
        allowed: bool = await limiter.try_acquire_async(user, blocking=False)
        return allowed

    return Contender(decide, client.aclose, prefix=prefix)


def _bare_args(limit: int) -> tuple[bytes, bytes]:
    return tree_wire(compile_tree(Rule(limit, 60_000, "user"))), b"1"


async def _bare(url: str, limit: int) -> Contender:
    client = _client(url)
    sha = await client.script_load(SLIDING_LOG_ONE.source)
    wire, slots = _bare_args(limit)
    prefix = _prefix()

    def keys(user: str) -> tuple[str, str]:  # the log and its companion
        identifier = Identifier(prefix, "work", "user", user)
        return identifier_key(identifier), kept_key(identifier)

    async def decide(user: str) -> bool:
        reply = await client.evalsha(sha, 2, *keys(user), b"", wire, slots, b"1", b"1")
        return bool(reply[0])

    async def many(users: list[str]) -> list[bool]:
        pipe = client.pipeline(transaction=False)
        for user in users:
            pipe.evalsha(sha, 2, *keys(user), b"", wire, slots, b"1", b"1")
        return [bool(reply[0]) for reply in await pipe.execute()]

    return Contender(decide, client.aclose, many, prefix)


async def bare_evalsha(url: str, limit: int) -> Contender:
    """The floor: our sliding-log script through redis-py's ``evalsha``, one call per
    decision, with arguments built in advance and no limiter around it."""
    contender = await _bare(url, limit)
    return Contender(contender.decide, contender.close, prefix=contender.prefix)


async def bare_pipelined(url: str, limit: int) -> Contender:
    """The ceiling: the same calls, ``concurrency`` at a time in one redis-py pipeline
    without a transaction."""
    return await _bare(url, limit)


async def bare_incrby(url: str, limit: int) -> Contender:
    """The anchor throttled-py measures itself against: one ``INCRBY`` per decision (a fixed
    window's count, with no expiry nor check), through redis-py; the pipelined variant
    sends ``concurrency`` of them at a time."""
    client = _client(url)
    prefix = _prefix()

    async def decide(user: str) -> bool:
        return bool(await client.incrby(f"{prefix}:{user}", 1) <= 1 << 62)

    async def many(users: list[str]) -> list[bool]:
        pipe = client.pipeline(transaction=False)
        for user in users:
            pipe.incrby(f"{prefix}:{user}", 1)
        return [bool(n) for n in await pipe.execute()]

    return Contender(decide, client.aclose, many, prefix)


async def bare_incrby_alone(url: str, limit: int) -> Contender:
    contender = await bare_incrby(url, limit)
    return Contender(contender.decide, contender.close, prefix=contender.prefix)
