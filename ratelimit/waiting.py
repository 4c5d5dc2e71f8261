"""Waiting for admission: ``limit(..., wait=5.0)``, ``wait=True``, or ``Limit.acquire()``.

A refused call sleeps until its ``retry_after`` (plus up to 10 % jitter, so that waiters
refused together do not all come back at once), then asks again, until it is admitted or
its wait runs out. It never sleeps past its wait: a refusal that outlasts what is left
raises ``RateLimitExceeded`` at once. Under a ``penalty=`` only that last refusal counts
(:mod:`ratelimit.penalty_waits`). Nothing is recorded while waiting, so cancelling a
waiter leaves nothing behind. ``wait`` bounds how long a caller queues; ``timeout`` (on
``RateLimit``) bounds one decision's work on Redis. They are separate.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable

from ratelimit.decision import Decision, RateLimitExceeded
from ratelimit.errors import ConfigurationError
from ratelimit.penalty_waits import Waiting

JITTER = 0.1
MIN_PAUSE = 0.001


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
