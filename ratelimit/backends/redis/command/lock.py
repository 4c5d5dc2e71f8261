"""A Redis lock with no Lua, for the command engine (redis-py's ``Lock`` releases by script).

**Taking it**: ``SET name token NX PX ttl`` (a failed ``SET`` reads the holder's token: a
``SET`` that redis-py resent after a dropped connection finds the lock its first send took).

**Waiting without polling**: every release pushes a wake-up onto a list beside the lock
(``<name>:wake``: same hash tag, same cluster slot; at most one wake-up, expiring with the
lock) in the ``MULTI`` of its ``DEL``. A caller that finds the lock held blocks on it
(``BLPOP``) until woken, until the holder's ttl ends (a dead holder pushes nothing), or for
:data:`MAX_BLOCK`, then tries again. Redis wakes blocked clients first come, first served.

**One contender per process**: the callers of one lock in one process queue in order (an
``asyncio.Lock``); only the first talks to Redis: at most one ``SET`` and one ``BLPOP`` in
flight per lock and process, and at most ``Blocking.most`` ``BLPOP`` s (each holds a
connection) per engine. A process that gives the lock back while more of its callers
queue lets the next one wait for a wake-up first, so other processes get their turn. A
``SET`` or ``BLPOP`` whose caller left goes on for the next in line; with nobody left, a
lock it took is given back and a wake-up it popped is pushed back. Where blocking is not
possible (no ``BLPOP`` on the server or proxy, too many locks waited on), the first caller
polls every ``polling_interval`` ±50 %.

**Giving it back**: compare-and-delete under ``WATCH`` (``GET`` the token, ``DEL`` in
``MULTI`` only if still ours: a lock that expired and was taken by another is never
deleted), ahead of takes waiting for a connection (``ConnectionGate``).

Waiting counts against ``timeout`` (then :class:`~ratelimit.errors.LockTimeoutError`), each
round trip against ``round_trip_timeout``. A dead holder blocks others for at most ``ttl``.
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from ratelimit.backends.redis.client import RedisClient
from ratelimit.backends.redis.command.lock_tasks import LATE, Blocking, consume
from ratelimit.backends.redis.compat import (
    ConnectionError,
    ResponseError,
    ServerOrTimeout,
    WatchError,
)
from ratelimit.backends.redis.connections import ConnectionGate, read_timeout
from ratelimit.errors import LockTimeoutError

MAX_BLOCK = 1.0
"""Longest one ``BLPOP`` blocks (seconds): a wake-up lost (its releaser's connection
dropped) costs a waiter at most this long."""
MIN_BLOCK = 0.01
"""Shorter waits than this are not worth a blocked connection: the caller tries again."""

T = TypeVar("T")
Setting = tuple[str, bool, int]
"""One ``SET NX`` try: its token, whether the lock is ours, and the holder's ttl left (ms,
``-1`` none, ``-2`` gone)."""


class RedisLock:
    """One lock key, shared by the callers of one process that use this object (the
    command engine keeps one per key). ``async with lock.held():`` takes it and always
    gives it back.

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
        blocking: Blocking | None = None,
        tasks: set[asyncio.Future[Any]] | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.wake_name = f"{name}:wake"
        self.ttl_ms = max(1, round(ttl * 1000))
        self.polling_interval = polling_interval
        self.timeout = timeout
        self.round_trip_timeout = round_trip_timeout  # each SET or release, if Redis hangs
        self._jitter = jitter
        self._gate = gate or ConnectionGate(None)
        self._blocking = blocking or Blocking(self._gate)
        self._tasks = LATE if tasks is None else tasks  # what runs apart: see settle()
        self._most_block = min(MAX_BLOCK, read_timeout(client) / 2)
        self._line = asyncio.Lock()  # this process's callers, first come first served
        self._queued = 0  # callers of this process waiting behind the first
        self._owner: str | None = None  # the token of this process's holder
        self._yield = False  # this process just gave it back: let other processes in
        self._setting: asyncio.Task[Setting] | None = None
        self._unanswered = 0  # tries a caller gave up on, Redis not answering in time
        self._given_up: asyncio.Task[Setting] | None = None  # the last of them
        self._waking: asyncio.Task[bool] | None = None
        self._heeding: asyncio.Future[Any] | None = None  # what the first caller awaits
        self._seen: tuple[int, float] | None = None  # (holder's ttl left in ms, when seen)

    def next_delay(self, remaining: float) -> float:
        """Seconds to wait before the next poll: the interval ±50 %, never past the timeout."""
        return max(0.0, min(remaining, self.polling_interval * (0.5 + self._jitter())))

    def held(self) -> _Held:
        """Hold the lock for the block; release it even if the block fails or is cancelled."""
        return _Held(self)

    async def acquire(self) -> str:
        """Take the lock and return its token, or raise ``LockTimeoutError``; give it back
        with :meth:`release`."""
        clock = asyncio.get_running_loop().time  # the loop's clock, which its timers follow
        started = clock()
        deadline = started + self.timeout if math.isfinite(self.timeout) else None
        unanswered = self._unanswered
        self._queued += 1
        try:
            async with asyncio.timeout_at(deadline):
                await self._line.acquire()
        except TimeoutError:
            raise LockTimeoutError(self.name, clock() - started, self._holder_left()) from None
        finally:
            self._queued -= 1
        try:
            token = await self._contend(started, deadline, unanswered)
        except BaseException:
            self._line.release()
            raise
        self._owner = token
        return token

    async def release(self, token: str) -> bool:
        """Delete the lock if it still holds ``token``; say whether it did. The next
        caller of this process in line goes on either way."""
        try:
            return await self._delete(token)
        finally:
            if self._owner == token:
                self._owner = None
                self._seen = None
                self._yield = self._queued > 0
                self._line.release()

    # --- waiting for the lock: the first caller of this process in line ---

    async def _contend(self, started: float, deadline: float | None, unanswered: int) -> str:
        clock = asyncio.get_running_loop().time
        wait_first, self._yield = self._yield, False
        while True:
            if not wait_first:
                token, taken = await self._try_set(unanswered)
                if taken:
                    return token
            wait_first = False
            left = math.inf if deadline is None else deadline - clock()
            if left <= 0:
                raise LockTimeoutError(self.name, clock() - started, self._holder_left())
            await self._wait_for_turn(left)

    async def _try_set(self, unanswered: int) -> tuple[str, bool]:
        """One ``SET NX`` within ``round_trip_timeout``: the try in flight if a caller
        that left started one, else a new one.

        A caller that gave up on this very try while this one waited in line saw Redis
        not answer it: this one fails at once too (``TimeoutError``, an outage the
        failure policy answers) rather than wait a deadline of its own behind it, so that
        the callers of one key behind a paused Redis are all answered within theirs."""
        attempt = self._setting
        if attempt is None:
            attempt = self._spawn(self._set(secrets.token_hex(16)))
            self._setting = attempt
            attempt.add_done_callback(self._set_done)
        elif attempt is self._given_up and self._unanswered != unanswered:
            raise TimeoutError
        try:
            token, taken, ttl_left = await self._heed(attempt, self.round_trip_timeout)
        except TimeoutError:
            if not attempt.done():
                self._unanswered += 1
                self._given_up = attempt
            raise
        self._seen = (ttl_left, asyncio.get_running_loop().time())
        return token, taken

    async def _wait_for_turn(self, left: float) -> None:
        """Wait (at most ``left`` seconds) for a wake-up, for the holder's ttl to end, or
        for :data:`MAX_BLOCK`; poll where blocking is not possible."""
        holder_left = self._holder_left()
        if holder_left is not None and holder_left < MIN_BLOCK:
            await asyncio.sleep(0)  # the holder's ttl is (about) over: try again
            return
        until_free = math.inf if holder_left is None else holder_left + MIN_BLOCK
        block = min(left, self._most_block, until_free)
        waking = self._waking
        if waking is None:
            if block < MIN_BLOCK or not self._blocking.take():
                await asyncio.sleep(self.next_delay(left))  # poll
                return
            waking = self._spawn(self._blpop(round(block, 3)))
            self._blocking.waits.add(waking)
            self._waking = waking
            waking.add_done_callback(self._wake_done)
        try:
            await self._heed(waking, left)
        except TimeoutError:
            if waking.done() and not waking.cancelled() and waking.exception() is not None:
                raise  # the BLPOP's own round trip: Redis did not answer
            return  # out of time: the caller says so; the BLPOP goes on for the next in line
        except ResponseError:
            self._blocking.supported = False  # a server or proxy without BLPOP: poll

    async def _heed(self, work: asyncio.Task[Any], seconds: float | None) -> Any:
        """Await ``work`` (a try or a wait that outlives its caller) for at most
        ``seconds``. What it leaves when this caller goes is handled by its done callback,
        or here if it ended just then."""
        self._heeding = work
        try:
            async with asyncio.timeout(None if seconds == math.inf else seconds):
                return await asyncio.shield(work)
        except BaseException:
            if work.done():
                self._left_behind(work)
            raise
        finally:
            self._heeding = None

    def _set_done(self, attempt: asyncio.Task[Setting]) -> None:
        if self._setting is attempt:
            self._setting = None
        if self._given_up is attempt:
            self._given_up = None
        if self._heeding is not attempt:
            self._left_behind(attempt)

    def _wake_done(self, waking: asyncio.Task[bool]) -> None:
        if self._waking is waking:
            self._waking = None
        self._blocking.give()
        self._blocking.waits.discard(waking)
        if self._heeding is not waking:
            self._left_behind(waking)

    def _left_behind(self, work: asyncio.Task[Any]) -> None:
        """A try or wait ended with nobody to take its outcome: give back a lock it took,
        push back a wake-up it popped."""
        if work.cancelled() or work.exception() is not None:
            return
        outcome = work.result()
        if isinstance(outcome, bool):  # a BLPOP's
            if outcome:
                self._spawn(self._pass_on())
        elif outcome[1]:
            self._spawn(self._delete(outcome[0]))

    async def _set(self, token: str) -> Setting:
        async with self._gate.slot():
            try:
                taken = await self.client.set(self.name, token, nx=True, px=self.ttl_ms)
            except ConnectionError:  # a dropped connection (a restart): once more, same token
                taken = await self.client.set(self.name, token, nx=True, px=self.ttl_ms)
            if taken:
                return token, True, self.ttl_ms
            read: Any = self.client.pipeline(transaction=False)
            read.get(self.name)
            read.pttl(self.name)
            holder, ttl_left = await read.execute()
        return token, holder in (token, token.encode()), int(ttl_left)

    async def _blpop(self, block: float) -> bool:
        """Block until a wake-up (``True``) or for ``block`` seconds (``False``)."""
        limit = None if self.round_trip_timeout is None else block + self.round_trip_timeout
        async with self._gate.slot(), asyncio.timeout(limit):
            popped = await self.client.blpop([self.wake_name], timeout=block)
        return popped is not None

    def _spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` apart from its caller, kept until done (and awaited by
        :func:`~.lock_tasks.settle`)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(consume)
        return task

    def _holder_left(self) -> float | None:
        """Seconds until the holder seen last loses the lock by its ttl (``None``: not
        known, or no ttl)."""
        if self._seen is None or self._seen[0] == -1:
            return None
        ttl_ms, seen_at = self._seen
        return max(0.0, ttl_ms / 1000 - (asyncio.get_running_loop().time() - seen_at))

    # --- giving it back ---

    async def _delete(self, token: str) -> bool:
        """Compare-and-delete, and wake a waiter, in one transaction."""
        pipe: Any  # a Pipeline or, on a cluster, a ClusterPipeline (typed only in part)
        async with self._gate.slot(first=True), self.client.pipeline(transaction=True) as pipe:
            await pipe.watch(self.name)
            current = await pipe.get(self.name)
            if current not in (token, token.encode()):
                await pipe.unwatch()
                return False
            pipe.multi()
            pipe.delete(self.name)
            self._wake(pipe)
            try:
                await pipe.execute()
            except WatchError:  # it changed after GET: expired and taken by another holder
                return False
        return True

    async def _pass_on(self) -> None:
        """Push back a wake-up that its caller left before using."""
        pipe: Any
        async with self._gate.slot(first=True):
            pipe = self.client.pipeline(transaction=True)
            self._wake(pipe)
            await pipe.execute()

    def _wake(self, pipe: Any) -> None:
        pipe.lpush(self.wake_name, 1)
        pipe.ltrim(self.wake_name, 0, 0)
        pipe.pexpire(self.wake_name, self.ttl_ms)


class _Held:
    """``async with lock.held() as token:``: taken on entry, given back on exit (a
    cancelled caller still gives it back, in the background)."""

    __slots__ = ("_lock", "_token")

    def __init__(self, lock: RedisLock) -> None:
        self._lock = lock
        self._token: str | None = None

    async def __aenter__(self) -> str:
        self._token = await self._lock.acquire()
        return self._token

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lock, token = self._lock, self._token
        assert token is not None
        giving_back = asyncio.wait_for(lock.release(token), lock.round_trip_timeout)
        release = lock._spawn(giving_back)
        try:
            await asyncio.shield(release)  # a cancelled caller still gives the lock back
        except ServerOrTimeout:
            pass  # the lock expires after its ttl; the block's own outcome stands
        except asyncio.CancelledError:
            raise  # it goes on in the background
