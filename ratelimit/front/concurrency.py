"""``rl.concurrency("user:5")``: at most N bodies at once per identifier, across processes.

A call takes a slot on entry and gives it back when its body ends: on return, on an
exception and on cancellation. A call cancelled while taking its slot lets the take run
until the store answers it, and then gives back what it took (never before: a give-back
sent on another connection could overtake the take); a take that failed is given back
with ``revoke``, so that it takes nothing if it reaches the store later.
``RateLimit.aclose()`` waits for these give-backs. Each slot is leased: while the body
runs, a task renews the lease every third of it, so a process that dies (or hangs) loses
its slots after at most ``lease`` seconds, and the others get them back without anyone
cleaning up. A call that finds no free slot raises :class:`ConcurrencyLimitExceeded` (a
``RateLimitExceeded``), or with ``wait=`` queues: it asks again when a body of this
process ends, and at least every :data:`MAX_POLL` seconds for bodies of other processes.

Example::

    @rl.concurrency("user:5", user=lambda: current_user())
    @rl.limit("user:100/m", user=lambda: current_user())
    async def export() -> bytes: ...
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any, NoReturn, ParamSpec, TypeVar

from ratelimit.core.decision import Decision, RateLimitExceeded, make_decision
from ratelimit.core.selectors import CallSite, Parameters, SelectorSources, resolve
from ratelimit.core.slots import SlotClaim, SlotLimit, claim_for, parse_slots
from ratelimit.errors import (
    BackendError,
    ConfigurationError,
    LimiterClosedError,
    LockTimeoutError,
)
from ratelimit.front.keywords import CONCURRENCY_OWN, check_selector_keywords
from ratelimit.front.reserve import DEFAULT_BY, kept_for
from ratelimit.front.wrapping import call_site, coroutine_only, findable, function_name, wrappable
from ratelimit.pipeline.decider import Decider
from ratelimit.pipeline.waiting import wait_seconds

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("ratelimit")

DEFAULT_LEASE = 30.0
MIN_LEASE = 0.1
MIN_POLL = 0.005
MAX_POLL = 0.25
"""A waiting call asks again at least this often (seconds): how soon it sees a slot that
another process gave back."""


class ConcurrencyLimitExceeded(RateLimitExceeded):
    """A call found no free slot (``limit`` names the full one) and did not run.

    ``retry_after`` is a hint (how long a waiting call would pause before asking again):
    when a slot frees depends on how long the other bodies run."""

    def __init__(self, decision: Decision, limit: SlotLimit | None) -> None:
        super().__init__(decision)
        self.limit = limit
        if decision.degraded:
            return  # the storage failed: RateLimitExceeded's message says so
        full = f" by '{limit}' ({limit.count} running)" if limit is not None else ""
        self.args = (f"concurrency limit reached for key {decision.key!r}{full}",)


class Held:
    """One call's slots while its body runs: the claim and the task renewing its lease."""

    __slots__ = ("claim", "renewal")

    def __init__(self, claim: SlotClaim | None, renewal: asyncio.Task[None] | None) -> None:
        self.claim = claim
        self.renewal = renewal


class Concurrency:
    """Slot limits bound to a :class:`~ratelimit.RateLimit`: a decorator or an
    ``async with`` block (see the module). Made by ``rl.concurrency(...)``."""

    def __init__(
        self,
        decider: Decider,
        limits: str,
        key: str | None,
        selector: object | None,
        selectors: dict[str, object],
        lease: float = DEFAULT_LEASE,
        wait: float | bool = False,
        site: str = "",
        reserve: object = None,
        reserve_by: object = DEFAULT_BY,
    ) -> None:
        self._site = site  # the key of a block without key=: where it was made
        self.limits = parse_slots(limits)
        decider.slot_store()  # a storage without slots fails here, when made
        if type(lease) not in (int, float) or not MIN_LEASE <= lease <= 86_400:
            raise ConfigurationError(
                f"lease must be seconds from {MIN_LEASE} to 86400, not {lease!r} (how long a "
                "dead holder keeps its slot)"
            )
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be text, not {type(key).__name__}")
        named = {limit.selector for limit in self.limits} - {None}
        self._reserve = kept_for(reserve, reserve_by, self.limits, f"concurrency({limits!r})")
        self._decider = decider
        self._key = key
        self._names = tuple(sorted(n for n in named if n is not None))
        if self._reserve is not None:  # the priority comes last (:meth:`_claim`)
            self._names += (self._reserve.by,)
        where = f"concurrency({limits!r})"
        check_selector_keywords(self._names, selectors, where, CONCURRENCY_OWN)
        self._sources = SelectorSources(selectors, selector)
        self.lease = float(lease)
        self._wait = wait_seconds(wait)
        self._held: dict[asyncio.Task[Any] | None, list[Held]] = {}
        self._released: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    # --- async with ---

    def __enter__(self) -> NoReturn:
        """``with rl.concurrency(...)``: an async limit is entered with ``async with``."""
        raise TypeError(
            "rl.concurrency(...) is entered with 'async with' (it decides without blocking the "
            "event loop); in threaded code, use ratelimit.sync.RateLimit, whose limits are "
            "entered with 'with'"
        )

    def __exit__(self, *exc_info: object) -> None:  # never reached: __enter__ raises
        return None

    async def __aenter__(self) -> Decision:
        held, decision = await self._enter(self.block_key(), None)
        self._held.setdefault(asyncio.current_task(), []).append(held)
        return decision

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        stack = self._held[task]
        held = stack.pop()
        if not stack:
            del self._held[task]
        await self._exit(held)

    def block_key(self) -> str:
        """The key of these slots as a block: ``key=``, else where they were made."""
        return self._site if self._key is None else self._key

    # --- decorator ---

    def _bind(self, func: Callable[..., Any]) -> tuple[str, Parameters]:
        """The key and parameters of a function these slots guard."""
        parameters = wrappable(
            func,
            "concurrency",
            "the slot would be given back before the iteration runs; hold it in the code that "
            "consumes it",
        )
        key = self._key if self._key is not None else function_name(func)
        findable(self.limits, self._sources, parameters, func, key, "concurrency")
        if self._reserve is not None:
            function = f"{function_name(func)}{parameters.signature}"
            self._reserve.findable(self._sources, parameters, function, key)
        return key, parameters

    def __call__(self, func: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[object, None, R]]:
        coroutine_only(func, "concurrency")
        key, parameters = self._bind(func)

        @functools.wraps(func)
        async def limited(*args: P.args, **kwargs: P.kwargs) -> R:
            site = call_site(func, parameters, args, kwargs)  # a call that cannot bind: free
            held, _ = await self._enter(key, site)
            try:
                return await func(*args, **kwargs)
            finally:
                await self._exit(held)

        return limited

    # --- taking and giving back ---

    async def _claim(
        self, key: str, call: CallSite | None, given: Mapping[str, str | None] | None = None
    ) -> SlotClaim:
        decider = self._decider
        decider.check_open()
        if given is not None:  # known already (an HTTP route read them from its request)
            values: tuple[str | None, ...] = tuple(given.get(name) for name in self._names)
        else:
            values = await resolve(self._names, self._sources, key, call) if self._names else ()
        limits = self.limits if self._reserve is None else self._reserve.limits_for(values[-1])
        return claim_for(
            limits,
            decider.namespace,
            key,
            dict(zip(self._names, values, strict=True)),
            os.urandom(12).hex(),
            round(self.lease * 1_000_000),
        )

    @contextlib.asynccontextmanager
    async def held_for(self, key: str, values: Mapping[str, str | None]) -> AsyncIterator[Decision]:
        """Hold the slots of ``key`` for one piece of work whose selector values (and
        priority) are known, such as an HTTP request's (:mod:`ratelimit.asgi.slot_routes`):
        as ``async with``, raising :class:`ConcurrencyLimitExceeded` when none is free."""
        held, decision = await self._enter(key, None, values)
        try:
            yield decision
        finally:
            await self._exit(held)

    async def _enter(
        self, key: str, call: CallSite | None, given: Mapping[str, str | None] | None = None
    ) -> tuple[Held, Decision]:
        """Take the slots of one call (waiting up to ``wait``), and start renewing them."""
        claim = await self._claim(key, call, given)
        if not claim.identifiers:  # no selector resolved: nothing limits the call
            return Held(None, None), make_decision(True, 0.0, None, None, key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait
        pause = MIN_POLL
        while True:
            decision, full = await self._try(claim)
            if decision.allowed:
                break
            left = deadline - loop.time()
            if left <= 0 or decision.degraded:
                raise ConcurrencyLimitExceeded(decision, full)
            await self._until_released(min(pause * (1 + random.random()), left))
            pause = min(pause * 2, MAX_POLL)
        if decision.degraded and decision.remaining is None:
            # fail-open: the body runs holding nothing (on_error="local"'s take, with what
            # is left, holds a slot of its local store: given back there)
            return Held(None, None), decision
        renewal = loop.create_task(self._renew(claim), name=f"ratelimit renewal of {key!r}")
        return Held(claim, renewal), decision

    async def _try(self, claim: SlotClaim) -> tuple[Decision, SlotLimit | None]:
        """One attempt, through the pipeline (:meth:`Decider.take_slots`: the failure policy
        and hooks); when refused, the limit that was full."""
        decision, fullest = await self._decider.take_slots(claim, self._give_back_later)
        return decision, None if fullest is None else self._limit_of(claim, fullest)

    def _give_back_later(self, claim: SlotClaim, revoke: bool = False) -> None:
        self._decider.finish_later(self._release(claim, revoke))

    def _limit_of(self, claim: SlotClaim, index: int) -> SlotLimit:
        identifier, count = claim.identifiers[index], claim.counts[index]
        return SlotLimit(count, identifier.selector)

    async def _until_released(self, seconds: float) -> None:
        """Pause up to ``seconds``, or until a body of this process gives its slots back."""
        loop = asyncio.get_running_loop()
        if self._released is None or self._released[0] is not loop:
            self._released = (loop, asyncio.Event())
        event = self._released[1]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)

    async def _renew(self, claim: SlotClaim) -> None:
        """Renew the lease every third of it while the body runs."""
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                kept = await self._decider.renew_slots(claim)
            except LimiterClosedError:
                return  # closed under a running body: nothing left to renew on
            except (BackendError, LockTimeoutError) as exc:
                logger.warning(
                    "ratelimit: a concurrency slot of key %r was not renewed (tried again in "
                    "%.1f s; it is lost if the lease of %.1f s runs out): %s",
                    claim.key,
                    self.lease / 3,
                    self.lease,
                    exc,
                )
                continue
            if not kept:
                logger.warning(
                    "ratelimit: a concurrency slot of key %r was lost: its lease of %.1f s ran "
                    "out before it was renewed (a stalled event loop?); the body runs on",
                    claim.key,
                    self.lease,
                )
                return

    async def _exit(self, held: Held) -> None:
        """Give the slots back, whatever ended the body; a cancellation arriving meanwhile
        does not stop it (the lease would otherwise keep the slot until it ends), and
        closing the limiter waits for it."""
        if held.renewal is not None:
            held.renewal.cancel()
        if held.claim is None:
            return
        release = self._decider.finish_later(self._release(held.claim))
        try:
            await asyncio.shield(release)
        finally:
            released, self._released = self._released, None
            if released is not None:
                _wake(*released)

    async def _release(self, claim: SlotClaim, revoke: bool = False) -> None:
        try:
            await self._decider.release_slots(claim, revoke)
        except LimiterClosedError:
            return  # closed under a running body: its slots end with their lease
        except (BackendError, LockTimeoutError) as exc:
            logger.warning(
                "ratelimit: a concurrency slot of key %r was not given back; it frees when its "
                "lease of %.1f s runs out: %s",
                claim.key,
                self.lease,
                exc,
            )


def _wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set ``event`` of ``loop``, from its thread or another's (two threads' event loops
    sharing one limiter: an event is set on its own loop)."""
    try:
        if loop is asyncio.get_running_loop():
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)
    except RuntimeError:  # its loop closed: no one is left waiting
        pass
