"""Background counting (the edge limiters' recommended mode): admit at once, count off the path.

With ``RateLimit(..., background=True)`` a call that the denial cache does not refuse is
admitted at once, and its decision is made by a task in the running loop, which drains the
queue in batches (the decisions of one batch go to the storage together). A call that the
storage refuses fills the denial cache, so the calls after it are refused in-process until
the refusal lifts. The price is an overshoot: every call admitted between the first refused
hit and the moment its refusal reaches the cache, about one round trip's worth of calls.

The queue is plain data, not tied to an event loop: when the loop that counted ends (an
``asyncio.run()`` returns) with hits still queued, or in a batch it did not finish, the next
loop to use the limiter counts them. A batch cut short may have been counted in part, so a
hit can then count twice (refusing sooner), never not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from ratelimit.backends.loops import LoopBinding
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from ratelimit.pipeline.denials import Call

logger = logging.getLogger("ratelimit")

BATCH = 256

Decide = Callable[[Plan], Awaitable[Decision]]
Refused = Callable[[Call, Decision], None]
_Queued = tuple[Call, Plan]


class BackgroundCounter:
    """Queue of plans decided off the request path; refusals go to ``refused``."""

    def __init__(self, decide: Decide, refused: Refused) -> None:
        self._decide = decide
        self._refused = refused
        self._queue: deque[_Queued] = deque()
        self._counting: list[_Queued] = []  # the batch being counted
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._drained: list[asyncio.Future[None]] = []
        self._loop = LoopBinding()

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, call: Call, plan: Plan) -> None:
        """Count ``plan`` in the background; ``call`` names it for the denial cache."""
        if self._loop.loop is not asyncio.get_running_loop():
            self._bind()
        self._queue.append((call, plan))
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _bind(self) -> None:
        """Count in the running loop: what the last one left queued or half counted is
        counted here."""
        if self._loop.moved():
            self._queue.extendleft(reversed(self._counting))
            self._counting = []
            self._wakeup = None
            self._drained = []
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                for waiter in self._drained:
                    if not waiter.done():
                        waiter.set_result(None)
                self._drained = []
                self._wakeup = loop.create_future()
                await self._wakeup
                continue
            batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
            self._counting = batch
            await self._count(batch)
            self._counting = []

    async def _count(self, batch: list[_Queued]) -> None:
        outcomes = await asyncio.gather(
            *(self._decide(plan) for _, plan in batch), return_exceptions=True
        )
        for (call, _), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, Decision):
                if not outcome.allowed and not outcome.degraded:
                    self._refused(call, outcome)
            elif isinstance(outcome, Exception):
                logger.warning("ratelimit: a background count failed: %s", outcome)

    async def flush(self) -> None:
        """Wait until every queued call has been counted."""
        if not self._queue and not self._counting:
            return
        if self._loop.loop is not asyncio.get_running_loop():
            self._bind()
        waiter = asyncio.get_running_loop().create_future()
        self._drained.append(waiter)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
        await waiter

    async def aclose(self) -> None:
        """Count what is queued, then stop."""
        await self.flush()
        if self._task is not None and self._loop.loop is asyncio.get_running_loop():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
