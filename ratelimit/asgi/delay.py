"""Delay instead of refuse: a :class:`~ratelimit.asgi.Route`'s ``delay=`` and ``waiting=``.

A request its route's rules refuse, whose ``retry_after`` is within the route's ``delay``
(the most seconds a request may be held, from its arrival), waits its turn in this process
instead of being answered 429 at once, and asks the store again when its refusal runs out;
it is admitted when the rules admit it, else (its refusal outlasts what it may still wait,
or its time is up) it gets the usual 429. Every admission is still the store's decision:
the delay only changes *when* a refused request asks again, so waiting never admits past
the rules, across any number of processes.

Per route and process: at most ``waiting`` requests wait at once (a request that finds
the room full is answered as without ``delay=``, or, when requests of its identifier wait,
with their last refusal: it never goes before them); requests of one identifier (the route's
selector values, e.g. one ``ip``) wait in line, first come first served: only the first of
them asks the store, and a later request of that identifier never asks before an earlier
one has been admitted or has given up. Across processes the store decides who goes first.

Under the route's ``penalty=``, a request counts once at most: refusals it meets while it
waits are not noted, and only its last, when it is refused in the end, is
(:mod:`ratelimit.pipeline.waiting`); a request that waits and is admitted, or whose client
leaves, counts none.

A refusal the storage failed to decide (``Decision.degraded``) never waits, nor does a
shadow refusal (it is let through), nor a WebSocket handshake. While it waits, a request
listens for its client leaving (ASGI's ``http.disconnect``): it stops waiting and the
application never sees it. Listening reads at most the request's first body message, which
is handed on to the application untouched; a request whose body comes in several messages
cannot be heard leaving once its first one is read (reading on would buffer the body), so
it waits out its turn. Listening assumes the server's ``receive`` may be cancelled while it
waits for a message (uvicorn's, hypercorn's and httpx's ``ASGITransport`` may).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, MutableMapping
from dataclasses import replace
from typing import Any

from ratelimit.asgi.limits import HTTPLimit
from ratelimit.asgi.request import HTTPRequest
from ratelimit.asgi.sources import resolve
from ratelimit.core.decision import Decision, NeverAdmitted
from ratelimit.errors import ConfigurationError
from ratelimit.front.limiter import RateLimit
from ratelimit.pipeline.waiting import JITTER, MIN_PAUSE, Waiting

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

MAX_DELAY = 60.0
"""The longest ``delay=``: a held request holds its connection, and proxies in front
commonly give up on an upstream after a minute."""
WAITING = 100
"""``waiting=`` by default: requests of one route waiting at once in one process."""


def delay_seconds(delay: object, where: str) -> float:
    """``delay=`` checked: seconds from 0 (no delay) to :data:`MAX_DELAY`."""
    if (
        type(delay) not in (int, float)
        or not math.isfinite(delay)  # type: ignore[arg-type]
        or not 0 <= delay <= MAX_DELAY  # type: ignore[operator]
    ):
        raise ConfigurationError(
            f"{where}: delay must be seconds from 0 to {MAX_DELAY:g} (the most a refused "
            f"request may wait for its turn), not {delay!r}"
        )
    return float(delay)  # type: ignore[arg-type]


class Line:
    """The requests of one identifier waiting in one room, first come first served, and the
    last refusal the first of them got (what a later one is answered with if it gives up
    before its turn), with when it got it."""

    __slots__ = ("refusal", "refused_at", "turns")

    def __init__(self, refusal: Decision, now: float) -> None:
        self.turns: deque[asyncio.Future[None]] = deque()
        self.refusal = refusal
        self.refused_at = now

    def refusal_at(self, now: float) -> Decision:
        """The line's last refusal as it stands at ``now``: its ``retry_after`` less the
        time since."""
        left = max(0.0, self.refusal.retry_after - (now - self.refused_at))
        return replace(self.refusal, retry_after=left)


class WaitingRoom:
    """Where one route's refused requests wait their turn in this process (see the module's
    documentation). ``delay``: seconds (checked by :func:`delay_seconds`); ``waiting``: the
    most requests waiting at once, a positive whole number."""

    __slots__ = ("count", "delay", "lines", "waiting")

    def __init__(self, delay: float, waiting: int, where: str) -> None:
        if type(waiting) is not int or waiting < 1:
            raise ConfigurationError(
                f"{where}: waiting must be a whole number of requests, 1 or more (how many "
                f"may wait at once in one process), not {waiting!r}"
            )
        self.delay = delay
        self.waiting = waiting
        self.count = 0
        self.lines: dict[Hashable, Line] = {}

    async def decided(
        self,
        limiter: RateLimit,
        limit: HTTPLimit,
        key: str,
        request: HTTPRequest,
        receive: Receive,
    ) -> tuple[Decision | None, Receive]:
        """The request's decision, after waiting its turn where it may, and the ``receive``
        the application is to read the request from; ``None`` when the client left while
        it waited."""

        arrived = asyncio.get_running_loop().time()
        if limit.penalty is not None:  # only the last refusal of a request counts
            with Waiting() as waiting:
                decision, receive = await self._decided(
                    limit, limiter, key, request, receive, arrived
                )
                return (None if decision is None else await waiting.final(decision)), receive
        return await self._decided(limit, limiter, key, request, receive, arrived)

    async def _decided(
        self,
        limit: HTTPLimit,
        limiter: RateLimit,
        key: str,
        request: HTTPRequest,
        receive: Receive,
        arrived: float,
    ) -> tuple[Decision | None, Receive]:
        if not self.count:  # nobody waits: the usual decision, and only a refusal waits
            decision = await limit.decide(limiter, request, key)
            if decision.allowed:
                return decision, receive
            return await self._refused(limiter, limit, key, request, receive, decision, arrived)
        return await self._refused(limiter, limit, key, request, receive, None, arrived)

    async def _refused(
        self,
        limiter: RateLimit,
        limit: HTTPLimit,
        key: str,
        request: HTTPRequest,
        receive: Receive,
        decision: Decision | None,
        arrived: float,
    ) -> tuple[Decision | None, Receive]:
        """:meth:`decided` for a request refused (``decision``) or yet to decide while
        others wait (``None``), which came at ``arrived`` (the loop's clock)."""

        def ask() -> Awaitable[Decision]:
            return limit.decide(limiter, request, key)

        if request.scope["type"] != "http":
            return decision or await ask(), receive
        clock = asyncio.get_running_loop().time
        deadline = arrived + self.delay
        identity: Hashable = None
        if decision is None:  # one of its identifier's may be waiting: never ask before them
            identity = await self._identity(limit, key, request)
            line = self.lines.get(identity)
            if line is not None:  # behind them, without asking first
                refusal = line.refusal_at(clock())
                if refusal.retry_after > self.delay or self.count >= self.waiting:
                    return refusal, receive
                return await self._wait(ask, None, identity, receive, deadline)
            decision = await ask()
        if (
            decision.allowed
            or decision.shadow
            or decision.degraded
            or decision.retry_after > self.delay
            or self.count >= self.waiting
            or decision.__class__ is NeverAdmitted  # its cost: no wait helps
        ):
            return decision, receive
        if identity is None:
            identity = await self._identity(limit, key, request)
        return await self._wait(ask, decision, identity, receive, deadline)

    async def held(
        self, limiter: RateLimit, limit: HTTPLimit, key: str, request: HTTPRequest
    ) -> Decision:
        """:meth:`decided` for a limit inside the application (a ``RouteLimit``), which
        cannot listen for the client leaving: the application owns ``receive``."""
        decision, _ = await self.decided(limiter, limit, key, request, _unheard)
        assert decision is not None  # nobody heard the client leave
        return decision

    @staticmethod
    async def _identity(limit: HTTPLimit, key: str, request: HTTPRequest) -> Hashable:
        """What one line holds: the key and the limit's selector values of the request."""
        selectors = limit.compiled.selectors
        values = await resolve(selectors, limit.sources, request) if selectors else ()
        return (key, *values)

    async def _wait(
        self,
        ask: Callable[[], Awaitable[Decision]],
        first: Decision | None,
        identity: Hashable,
        receive: Receive,
        deadline: float,
    ) -> tuple[Decision | None, Receive]:
        """Wait in ``identity``'s line until first, then ask until admitted, refused for
        longer than is left before ``deadline``, or the client leaves."""
        loop = asyncio.get_running_loop()
        clock = loop.time
        line = self.lines.get(identity)
        if self.count >= self.waiting:  # filled while this request looked for its line
            if first is None:
                assert line is not None  # it came to join this line
                first = line.refusal_at(clock())
            return first, receive
        if line is None:
            assert first is not None  # a line starts with a refused request
            line = self.lines[identity] = Line(first, clock())
        turn: asyncio.Future[None] = loop.create_future()
        line.turns.append(turn)
        if len(line.turns) == 1:
            turn.set_result(None)
        self.count += 1
        client = Listener(receive)
        try:
            if not turn.done():
                await client.wait(turn, deadline - clock())
                if client.gone:
                    return None, receive
                if not turn.done():  # time up before its turn
                    return line.refusal_at(clock()), client.receive()
                first = None  # its refusal is stale: ask again
            decision = first if first is not None else await ask()
            while not (decision.allowed or decision.shadow or decision.degraded):
                line.refusal, line.refused_at = decision, clock()
                left = deadline - clock()
                if decision.retry_after > left:
                    break
                pause = decision.retry_after * (1 + JITTER * random.random())
                await client.wait(None, max(MIN_PAUSE, min(pause, left)))
                if client.gone:
                    return None, receive
                decision = await ask()
            return decision, client.receive()
        finally:
            client.receive()  # stops listening, whatever ended the wait
            self.count -= 1
            head = line.turns[0] is turn
            line.turns.remove(turn)
            if not line.turns:
                del self.lines[identity]
            elif head:
                line.turns[0].set_result(None)


async def _unheard() -> Message:
    """A ``receive`` that never answers: nothing to listen to."""
    await asyncio.get_running_loop().create_future()
    raise AssertionError("unreachable")  # pragma: no cover


class Listener:
    """Listens for a waiting request's client leaving (``http.disconnect``), holding what it
    read before (at most the first body message) for the application."""

    __slots__ = ("_next", "_receive", "gone", "held")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.held: list[Message] = []
        self.gone = False
        self._next: asyncio.Future[Message] | None = asyncio.ensure_future(receive())

    def _take(self) -> None:
        """Note the message just received; listen on unless it may be part of a body."""
        assert self._next is not None
        done, self._next = self._next, None
        if done.cancelled() or done.exception() is not None:
            return  # the server's receive failed: stop listening, the application will see
        message = done.result()
        if message["type"] == "http.disconnect":
            self.gone = True
            return
        self.held.append(message)
        if message["type"] == "http.request" and not message.get("more_body", False):
            self._next = asyncio.ensure_future(self._receive())  # the body is all read

    async def wait(self, turn: asyncio.Future[None] | None, seconds: float) -> None:
        """Wait until ``turn`` is done (``None``: for ``seconds``), ``seconds`` pass, or the
        client leaves (``gone``)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while not self.gone and (turn is None or not turn.done()):
            left = until - loop.time()
            if left <= 0:
                return
            waits: set[asyncio.Future[Any]] = set()
            if turn is not None:
                waits.add(turn)
            if self._next is not None:
                waits.add(self._next)
            if not waits:
                await asyncio.sleep(left)
                return
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if self._next is not None and self._next.done():
                self._take()

    def receive(self) -> Receive:
        """Stop listening; the ``receive`` the application reads: what was held, then the
        server's."""
        if self._next is not None:
            if self._next.done():
                self._take()
            if self._next is not None:
                self._next.cancel()
                self._next = None
        held, receive = self.held, self._receive
        if not held:
            return receive

        async def replay() -> Message:
            return held.pop(0) if held else await receive()

        return replay
