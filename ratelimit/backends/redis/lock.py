"""A Redis lock with no Lua, for the command engine (redis-py's ``Lock`` releases by script).

Taken with ``SET name token NX PX ttl`` (a failed ``SET`` reads the holder's token: a
``SET`` that redis-py resent after a dropped connection finds the lock its first send
took), retried every ``polling_interval`` seconds with
±50 % jitter so waiters do not retry in lockstep, given up after ``timeout`` seconds with
:class:`~ratelimit.errors.LockTimeoutError`. Released by compare-and-delete under
``WATCH``: ``GET`` the token, and ``DEL`` in ``MULTI`` only if it is still ours, so a lock
that expired and was taken by someone else is never deleted. A holder that dies blocks
others for at most ``ttl``.
"""

from __future__ import annotations

import asyncio
import functools
import random
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from ratelimit.backends.redis.client import RedisClient
from ratelimit.backends.redis.compat import ConnectionError, ServerOrTimeout, WatchError
from ratelimit.backends.redis.connections import ConnectionGate
from ratelimit.errors import LockTimeoutError


class RedisLock:
    """One lock key. ``async with lock.held():`` takes it and always gives it back.

    Example::

        lock = RedisLock(client, "rl:{shop:search}:lock", ttl=10, polling_interval=0.1,
                         timeout=10)
        async with lock.held():
            ...
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        ttl: float,
        polling_interval: float,
        timeout: float,
        round_trip_timeout: float | None = None,
        jitter: Callable[[], float] = random.random,
        gate: ConnectionGate | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.ttl_ms = max(1, round(ttl * 1000))
        self.polling_interval = polling_interval
        self.timeout = timeout
        self.round_trip_timeout = round_trip_timeout  # each SET or release, if Redis hangs
        self._jitter = jitter
        self._gate = gate or ConnectionGate(None)

    def next_delay(self, remaining: float) -> float:
        """Seconds to wait before the next try: the interval ±50 %, never past the timeout."""
        return max(0.0, min(remaining, self.polling_interval * (0.5 + self._jitter())))

    async def acquire(self) -> str:
        """Take the lock and return its token, or raise ``LockTimeoutError``."""
        token = secrets.token_hex(16)
        clock = asyncio.get_running_loop().time  # the loop's clock, which its sleeps follow
        started = clock()
        while True:
            async with self._gate.slot():
                taken = await self._take(token)
            if taken:
                return token
            waited = clock() - started
            if waited >= self.timeout:
                raise LockTimeoutError(self.name, waited)
            await asyncio.sleep(self.next_delay(self.timeout - waited))

    async def _take(self, token: str) -> bool:
        """One try: ``SET NX``, within ``round_trip_timeout``.

        A try that its caller leaves (its deadline passed, or it was cancelled) goes on in
        the background: if Redis takes the lock for it later (it was paused, or slow), the
        lock is given back as soon as Redis answers, instead of blocking everyone for
        ``lock_ttl``. A ``SET`` that redis-py sent again after a dropped connection fails
        on the lock its first send took: the holder's token says whose it is."""
        attempt = asyncio.ensure_future(self._set(token))
        try:
            async with asyncio.timeout(self.round_trip_timeout):
                return await asyncio.shield(attempt)
        except BaseException:
            attempt.add_done_callback(functools.partial(self._give_back_late, token))
            raise

    async def _set(self, token: str) -> bool:
        try:
            taken = await self.client.set(self.name, token, nx=True, px=self.ttl_ms)
        except ConnectionError:  # a dropped connection (a restart): once more, same token
            taken = await self.client.set(self.name, token, nx=True, px=self.ttl_ms)
        if taken:
            return True
        holder = await self.client.get(self.name)
        return holder in (token, token.encode())

    def _give_back_late(self, token: str, attempt: asyncio.Future[bool]) -> None:
        if attempt.cancelled() or attempt.exception() is not None or not attempt.result():
            return  # not taken, or unknown: at worst it expires after its ttl
        release = asyncio.ensure_future(self.release(token))
        _LATE.add(release)
        release.add_done_callback(_LATE.discard)
        release.add_done_callback(_consume)

    async def release(self, token: str) -> bool:
        """Delete the lock if it still holds ``token``; say whether it did."""
        pipe: Any  # a Pipeline or, on a cluster, a ClusterPipeline (typed only in part)
        async with self._gate.slot(), self.client.pipeline(transaction=True) as pipe:
            await pipe.watch(self.name)
            current = await pipe.get(self.name)
            if current not in (token, token.encode()):
                await pipe.unwatch()
                return False
            pipe.multi()
            pipe.delete(self.name)
            try:
                await pipe.execute()
            except WatchError:  # it changed after GET: expired and taken by another holder
                return False
        return True

    @asynccontextmanager
    async def held(self) -> AsyncIterator[str]:
        """Hold the lock for the block; release it even if the block fails or is cancelled."""
        token = await self.acquire()
        try:
            yield token
        finally:
            release = asyncio.ensure_future(
                asyncio.wait_for(self.release(token), self.round_trip_timeout)
            )
            try:
                await asyncio.shield(release)  # a cancelled caller still gives the lock back
            except ServerOrTimeout:
                pass  # the lock expires after its ttl; the block's own outcome stands
            except asyncio.CancelledError:
                release.add_done_callback(_consume)
                raise


_LATE: set[asyncio.Future[bool]] = set()
"""Releases of locks taken after their caller left: kept referenced until they finish."""


def _consume(task: asyncio.Future[bool]) -> None:
    """Retrieve a background release's outcome so that asyncio does not report it."""
    if not task.cancelled():
        task.exception()
