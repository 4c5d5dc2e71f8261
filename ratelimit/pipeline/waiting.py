"""Waiting for admission: ``limit(..., wait=5.0)``, ``wait=True``, or ``Limit.acquire()``,
and how a call that waits counts towards a ``penalty=``.

A refused call sleeps until its ``retry_after`` (plus up to 10 % jitter, so that waiters
refused together do not all come back at once), then asks again, until it is admitted or
its wait runs out. It never sleeps past its wait: a refusal that outlasts what is left
raises ``RateLimitExceeded`` at once. Nothing is recorded while waiting, so cancelling a
waiter leaves nothing behind. ``wait`` bounds how long a caller queues; ``timeout`` (on
``RateLimit``) bounds one decision's work on Redis. They are separate.

A call that waits its turn (``wait=``, :func:`admitted`; an HTTP route's ``delay=``)
counts towards a ``penalty=`` once at most (:class:`Waiting`): refusals it meets while
waiting are not noted; when it is admitted in the end, none is; when it is refused in the
end (its wait runs out, a refusal outlasts it), that last refusal is noted
(:meth:`Waiting.final`). A client that was only slowed down is not held back for it. Pure
bookkeeping in the caller's context: no import of the limiter's parts.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token

from ratelimit.core.decision import Decision, RateLimitExceeded
from ratelimit.errors import ConfigurationError

JITTER = 0.1
MIN_PAUSE = 0.001


Note = Callable[[Decision], Awaitable[Decision]]


class Waiting:
    """``with Waiting() as waiting:`` around a call's asks; a penalty's refusal seen
    within is kept in ``pending`` (its note, the last one) instead of being noted."""

    __slots__ = ("_token", "pending")

    def __init__(self) -> None:
        self.pending: Note | None = None
        self._token: Token[Waiting | None] | None = None

    def __enter__(self) -> Waiting:
        self._token = _WAITING.set(self)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._token is not None
        _WAITING.reset(self._token)

    async def final(self, decision: Decision) -> Decision:
        """``decision``, the call's last: a refusal of the rules is noted now (a hold it
        starts refuses it as held); anything else notes nothing."""
        note, self.pending = self.pending, None
        if note is None or decision.allowed or decision.degraded or decision.penalty is not None:
            return decision
        return await note(decision)


_WAITING: ContextVar[Waiting | None] = ContextVar("ratelimit_waiting", default=None)


def waiting_call() -> Waiting | None:
    """The :class:`Waiting` of the call being decided, if it waits its turn."""
    return _WAITING.get()


def wait_seconds(wait: float | bool) -> float:
    """``wait`` as seconds: ``False`` is 0, ``True`` is for ever (``math.inf``)."""
    if wait is True:
        return math.inf
    if wait is False:
        return 0.0
    if type(wait) not in (int, float) or math.isnan(wait) or wait < 0:
        raise ConfigurationError(
            f"wait must be seconds (0 or more), True (as long as it takes) or False, not {wait!r}"
        )
    return float(wait)


async def admitted(
    decide: Callable[[], Awaitable[Decision]],
    wait: float,
    jitter: Callable[[], float] = random.random,
    first: Decision | None = None,
    *,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> Decision:
    """The first admitting decision within ``wait`` seconds, or ``RateLimitExceeded``. A
    shadow refusal (``Decision.shadow``) is returned at once: the call goes through.

    ``first``: a decision the caller already has, so that it is not asked again at once.
    ``clock`` (seconds; default: the running event loop's clock) and ``sleep`` (default
    ``asyncio.sleep``, which follows that clock) are parameters, so that a test can run
    waits in a loop whose time is its own instead of sleeping."""
    with Waiting() as waiting:  # under a penalty, only its last refusal counts
        decision = first if first is not None else await decide()
        if decision.allowed or decision.shadow:  # shadow mode: let through, never wait
            return await waiting.final(decision)
        now = clock or asyncio.get_running_loop().time
        deadline = now() + wait
        while not decision.allowed:
            left = deadline - now()
            if decision.retry_after > left:
                raise RateLimitExceeded(await waiting.final(decision))
            pause = decision.retry_after * (1 + JITTER * jitter())
            await sleep(max(MIN_PAUSE, min(pause, left)))
            decision = await decide()
        return decision
