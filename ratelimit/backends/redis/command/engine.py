"""The Redis backend's command engine (``use_scripts=False``): plain commands, no Lua at all.

For Redis-compatible servers and proxies that refuse scripts. Per decision, under a lock per
(namespace, key) (see :mod:`ratelimit.backends.redis.command.lock`) unless ``disable_locks``; where
the keys spread (``spread``: :mod:`~ratelimit.backends.redis.keys`), a lock per
identifier's value instead, beside its keys, so that two values of one limit never wait on
each other (a call whose identifiers lie under several tags takes each one's lock, sorted):

1. one pipeline reads ``TIME``, the newest entries of every log (up to 64, ``LRANGE``), their
   ``PTTL``, the largest count kept on each (its ``:n`` companion), and ``LINDEX count-1``
   for rules whose count is beyond what was read (on a cluster, ``TIME`` goes separately to
   the node that owns the slot);
2. the tree is evaluated in Python by the same code as every other backend; a second read
   (``LRANGE``) is needed only when a rule of count > 64 has more than 64 hits in its window
   without being limited;
3. if allowed, one ``MULTI`` does ``LPUSH`` / ``LTRIM`` / ``PEXPIRE`` on every identifier (a
   log is trimmed to the largest count any limit on it asked to keep, which its companion
   remembers);
4. the lock is released.

Decisions equal the script engine's, ``retry_after`` and ``remaining`` included. Without the
lock, concurrent decisions on one key can read the same state and all be admitted: a bounded
overshoot of at most the number of decisions in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ratelimit.algorithms import not_before, window_index
from ratelimit.backends import windows
from ratelimit.backends.base import Clock, clock_us
from ratelimit.backends.layout import counter_update_rate
from ratelimit.backends.loops import LoopBinding
from ratelimit.backends.redis.client import (
    SCHEMES,
    RedisClient,
    check_transactions,
    close_client,
    spreads_on,
)
from ratelimit.backends.redis.command import decisions as command_decisions
from ratelimit.backends.redis.command import resets as command_resets
from ratelimit.backends.redis.command import settles as command_settles
from ratelimit.backends.redis.command import slots as command_slots
from ratelimit.backends.redis.command.lock import RedisLock
from ratelimit.backends.redis.command.lock_tasks import SETTLE_TIMEOUT, Blocking, settle
from ratelimit.backends.redis.command.writes import Writes
from ratelimit.backends.redis.compat import CLUSTERS, ConnectionError, OutOfMemoryError
from ratelimit.backends.redis.connections import (
    ConnectionGate,
    close_idle,
    forget_other_loops_of,
)
from ratelimit.backends.redis.errors import replied
from ratelimit.backends.redis.keys import (
    counter_key,
    lock_key,
    plan_keys,
    prefix_of,
    slot_fields,
    window_fields,
)
from ratelimit.backends.redis.old_layout import LayoutCheck
from ratelimit.backends.redis.overrides import RedisOverrides
from ratelimit.backends.redis.penalties import RedisPenalties
from ratelimit.core.checks import check_clock, check_flag, check_lock_settings, check_timeout
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import evaluate
from ratelimit.core.plan import CounterUpdate, Plan
from ratelimit.core.settling import Settlement
from ratelimit.core.slots import SlotClaim
from ratelimit.errors import LimiterClosedError

T = TypeVar("T")


class RedisCommandBackend(RedisOverrides, RedisPenalties):
    """Decides plans with plain Redis commands, under a Redis lock unless ``disable_locks``.

    ``lock_ttl`` bounds how long a crashed holder blocks others; waiters are woken by the
    holder's release (see :mod:`~ratelimit.backends.redis.command.lock`), and poll every
    ``lock_polling_interval`` (±50 % jitter) only where they cannot block; ``lock_timeout``
    is how long a decision waits for the lock before
    :class:`~ratelimit.errors.LockTimeoutError`, which the failure policy answers with a
    refusal (or raises, under ``on_error="raise"``). Waiting never admits, and is not part
    of the ``timeout`` of the decision's round trips. ``spread``: the setting of
    :class:`~ratelimit.Settings` (``None``: on a cluster client).

    Example::

        rl = RateLimit(redis.asyncio.Redis(), use_scripts=False)   # builds this backend
    """

    prunes_with_scripts = False
    """Expired overrides are pruned in a transaction: servers it serves may refuse Lua."""

    def __init__(
        self,
        client: RedisClient,
        *,
        clock: Clock | None = None,
        disable_locks: bool = False,
        lock_ttl: float = 10.0,
        lock_polling_interval: float = 0.1,
        lock_timeout: float = 10.0,
        owns_client: bool = False,
        timeout: float | None = None,
        spread: bool | None = None,
    ) -> None:
        # the checks Settings makes of the same settings: a backend made by hand meets them
        check_flag("disable_locks", disable_locks)
        check_lock_settings(
            lock_ttl, lock_polling_interval, lock_timeout, None if disable_locks else timeout
        )
        check_timeout(timeout)
        check_clock(clock)
        check_transactions(client)
        self.client = client
        self.clock = clock
        self._owns_client = owns_client
        self.disable_locks = disable_locks
        self.lock_ttl = lock_ttl
        self.lock_polling_interval = lock_polling_interval
        self.lock_timeout = lock_timeout
        self.timeout = timeout
        self.spread = spreads_on(client, spread)
        """Whether identifiers with a selector get hash tags of their own
        (:mod:`~ratelimit.backends.redis.keys`), whatever tree counts on them."""
        self._layout = LayoutCheck(client) if self.spread else None  # warns of old counters
        self._closed = False
        self._loop = LoopBinding()
        self._gate = ConnectionGate(client)  # never more commands at once than connections
        self._blocking = Blocking(self._gate)
        self._locks: weakref.WeakValueDictionary[str, RedisLock] = weakref.WeakValueDictionary()
        self._lock_tasks: set[asyncio.Future[Any]] = set()  # what the locks run apart

    def lock(self, prefix: str) -> RedisLock:
        """The lock guarding the keys under ``prefix`` (:func:`~.keys.prefix_of`: every
        identifier of one (namespace, key), or of one value where the keys spread): one
        object per lock while this process uses it, so that its callers queue in the
        process."""
        name = lock_key(prefix)
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = RedisLock(
                self.client,
                name,
                ttl=self.lock_ttl,
                polling_interval=self.lock_polling_interval,
                timeout=self.lock_timeout,
                round_trip_timeout=self.timeout,
                gate=self._gate,
                blocking=self._blocking,
                tasks=self._lock_tasks,
            )
        return lock

    async def decide(self, plan: Plan) -> Decision:
        if not plan.identifiers:
            return evaluate(plan, 0, [(0, 0)] * len(plan.compiled.rules))
        if self._layout is not None:
            self._layout.saw(plan)
        return await self._guarded(
            self._prefixes(plan),
            lambda: self._decide(plan),
            f"decide key {plan.key!r}",
            refuse_only=lambda: self._decide(plan, may_write=False),
        )

    async def settle(self, settlement: Settlement) -> None:
        plan = settlement.plan
        if not plan.identifiers or settlement.empty:
            if self._closed:
                raise LimiterClosedError("this Redis backend")
            return
        await self._guarded(
            self._prefixes(plan),
            lambda: command_settles.BY_ALGORITHM[plan.algorithm.name](self, settlement),
            f"settle key {plan.key!r}",
        )

    def _prefixes(self, plan: Plan) -> tuple[str, ...]:
        """The hash tags of ``plan``'s keys, whose locks are taken in this order (sorted:
        two calls taking the same two never wait on each other): one, unless the engine
        spreads and the call's identifiers lie under several (:func:`~.keys.prefix_of`)."""
        if not (self.spread and not plan.compiled.pinned):
            return (prefix_of(plan.namespace, plan.key, plan.identifiers),)
        if plan.compiled.spreads:
            return (prefix_of(plan.namespace, plan.key, plan.identifiers, True),)
        tags = {prefix_of(plan.namespace, plan.key, (i,), True) for i in plan.identifiers}
        return tuple(sorted(tags))

    def _writes(self) -> Any:
        """The writes of one step: a transaction (``MULTI``), or on a cluster one per
        hash tag its keys name (:class:`~.writes.Writes`), all under the step's locks."""
        if isinstance(self.client, CLUSTERS):
            return Writes(self.client)
        return self.client.pipeline(transaction=True)

    def _claim_prefix(self, claim: SlotClaim) -> tuple[str, ...]:
        """The hash tags of ``claim``'s keys, whose locks are taken in this order (sorted):
        one, unless the engine spreads and its identifiers lie under several."""
        if not (self.spread and claim.spreads):
            return (prefix_of(claim.namespace, claim.key, claim.identifiers),)
        names = {prefix_of(claim.namespace, claim.key, (i,), True) for i in claim.identifiers}
        return tuple(sorted(names)) or (prefix_of(claim.namespace, claim.key, ()),)

    async def _guarded(
        self,
        prefix: str | tuple[str, ...],
        work: Callable[[], Awaitable[T]],
        what: str,
        refuse_only: Callable[[], Awaitable[T]] | None = None,
        always_lock: bool = False,
    ) -> T:
        """Run ``work`` under the lock of the keys under ``prefix`` (:meth:`lock`) unless
        ``disable_locks`` (and not ``always_lock``: concurrency slots are a hard cap, never
        overshot), with Redis errors raised as ``BackendError``.

        Each step is sent once; redis-py's own retry (the client's ``retry=``) may resend a
        command after a dropped connection, so a hit can then count twice (refusing sooner,
        never admitting more). When Redis refuses writes (``maxmemory`` with
        ``noeviction``: the lock's ``SET`` fails too), ``refuse_only`` decides without the
        lock: a refusal needs no write, and an admission it cannot record fails."""
        if self._closed:
            raise LimiterClosedError("this Redis backend")
        if self._loop.loop is not asyncio.get_running_loop():
            self._bind()
        # A LockTimeoutError is contention, not an outage: replied() lets it through.
        async with replied(self._close_idle, f"to {what}", self.timeout):
            try:
                return await self._once(prefix, work, always_lock)
            except OutOfMemoryError:
                if refuse_only is None:
                    raise
                async with self._gate.slot(), asyncio.timeout(self.timeout):
                    return await refuse_only()

    async def _close_idle(self) -> None:
        await close_idle(self.client)

    async def _once(
        self, prefix: str | tuple[str, ...], work: Callable[[], Awaitable[T]], locked: bool = False
    ) -> T:
        if self.disable_locks and not locked:
            async with self._gate.slot():  # waiting for a connection is not an outage
                async with asyncio.timeout(self.timeout):
                    return await work()
        if isinstance(prefix, tuple) and len(prefix) > 1:  # a call spanning tags: each lock
            async with contextlib.AsyncExitStack() as held:
                for name in prefix:  # sorted (_prefixes): never a cycle of waits
                    await held.enter_async_context(self.lock(name).held())
                async with self._gate.slot(), asyncio.timeout(self.timeout):
                    return await work()
        name = prefix[0] if isinstance(prefix, tuple) else prefix
        async with self.lock(name).held(), self._gate.slot():
            async with asyncio.timeout(self.timeout):  # the lock's wait is not an outage
                return await work()

    async def acquire_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        return await self._guarded(
            self._claim_prefix(claim),
            lambda: command_slots.acquire(self, claim),
            "take a slot",
            always_lock=True,
        )

    async def renew_slots(self, claim: SlotClaim) -> bool:
        return await self._guarded(
            self._claim_prefix(claim),
            lambda: command_slots.renew(self, claim),
            "renew a slot",
            always_lock=True,
        )

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        await self._guarded(
            self._claim_prefix(claim),
            lambda: command_slots.release(self, claim, revoke),
            "give a slot back",
            always_lock=True,
        )

    async def reset(self, plan: Plan) -> None:
        keys = plan_keys(plan, self.spread and not plan.compiled.pinned)
        if keys:
            await self._guarded(
                self._prefixes(plan), lambda: command_resets.reset(self, plan, keys), "reset"
            )

    async def update_counter(self, update: CounterUpdate) -> float:
        identifier = update.identifier
        # a counter of no selector: pinned whatever ``spread`` says (one lock per key)
        return await self._guarded(
            prefix_of(identifier.namespace, identifier.key, (identifier,)),
            lambda: self._update_counter(update),
            f"update counter {identifier.key!r}",
        )

    async def _update_counter(self, update: CounterUpdate) -> float:
        key = counter_key(update.identifier)
        size = update.size_us

        def fill(read: Any) -> None:
            read.hmget(key, window_fields(size))
            read.pttl(key)

        replies = await self._read(fill)
        now = await self._now(replies, key)
        fields, ttl = replies
        now = not_before(now, windows.newest(fields), size)  # the clock stepped back
        index = window_index(now, size)
        current, previous = windows.counted(fields, index)
        rate = counter_update_rate(update, current, previous, now)
        if update.value:
            write = self.client.pipeline(transaction=True)
            count, held = slot_fields(size, index)
            write.hset(key, mapping={count: repr(current + update.value), held: index})
            if int(ttl) < math.ceil(2 * size / 1000):
                write.pexpire(key, math.ceil(2 * size / 1000))
            await write.execute()
        return rate

    async def _now(self, replies: list[Any], key: str) -> int:
        """The decision's time: the injected clock, else Redis TIME (first in ``replies``,
        or, on a cluster, asked of the node that owns ``key``)."""
        if self.clock is not None:
            return clock_us(self.clock)
        if isinstance(self.client, CLUSTERS):  # a cluster pipeline cannot route TIME
            node = self.client.get_node_from_key(key)
            seconds, micros = await self.client.execute_command("TIME", target_nodes=node)
        else:
            seconds, micros = replies.pop(0)
        return int(seconds) * 1_000_000 + int(micros)

    async def _read(self, fill: Callable[[Any], None]) -> list[Any]:
        """Run the reads ``fill`` adds to a pipeline, after ``TIME`` (unless a clock is
        injected, or on a cluster). Sent again once after a dropped connection (a Redis
        restart): reads change nothing. Writes are never sent again."""

        def reads() -> Any:
            read = self.client.pipeline(transaction=False)
            if self.clock is None and not isinstance(self.client, CLUSTERS):
                read.time()
            fill(read)
            return read

        try:
            replies: list[Any] = await reads().execute()
        except ConnectionError:
            replies = await reads().execute()
        return replies

    async def _decide(self, plan: Plan, may_write: bool = True) -> Decision:
        return await command_decisions.BY_ALGORITHM[plan.algorithm.name](self, plan, may_write)

    algorithms = frozenset(command_decisions.BY_ALGORITHM)
    """The algorithms this backend decides (:data:`command_decisions.BY_ALGORITHM`)."""
    holds_slots = True
    """It holds concurrency slots (:mod:`~ratelimit.backends.redis.command.slots`)."""
    schemes = SCHEMES
    """The storage URLs that open a client it drives (:data:`.client.SCHEMES`)."""

    def _bind(self) -> None:
        """Work in the running loop: connections an ended loop opened are opened anew."""
        if self._loop.moved():
            forget_other_loops_of(self.client)
            self._gate = ConnectionGate(self.client)  # its futures served the old loop
            self._blocking = Blocking(self._gate)
            self._locks = weakref.WeakValueDictionary()
            self._lock_tasks = set()  # the old loop's ended with it

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._layout is not None:
            await self._layout.aclose()  # before the client closes under a look
        if self._loop.loop is not None and self._loop.loop is not asyncio.get_running_loop():
            self._bind()
        # give-backs of locks whose callers left finish first; nothing is left pending
        await settle(self._lock_tasks, self._blocking, self.timeout or SETTLE_TIMEOUT)
        if self._owns_client:
            await close_client(self.client)
