"""Background counting (the edge limiters' recommended mode): admit at once, count off the path.

With ``RateLimit(..., background=True)`` a call that the denial cache does not refuse is
admitted at once, and its decision is made by a task in the running loop, which drains the
queue in batches (the decisions of one batch go to the storage together). A call that the
storage refuses fills the denial cache, so the calls after it are refused in-process until
the refusal lifts. The price is an overshoot: every call admitted between the first refused
hit and the moment its refusal reaches the cache, about one round trip's worth of calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ratelimit.decision import Decision
from ratelimit.plan import Plan

logger = logging.getLogger("ratelimit")

BATCH = 256

Decide = Callable[[Plan], Awaitable[Decision]]
Refused = Callable[[object, Decision], None]


class BackgroundCounter:
    """Queue of plans decided off the request path; refusals go to ``refused``."""

    def __init__(self, decide: Decide, refused: Refused) -> None:
        self._decide = decide
        self._refused = refused
        self._queue: asyncio.Queue[tuple[object, Plan]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return self._queue.qsize()

    def submit(self, call: object, plan: Plan) -> None:
        """Count ``plan`` in the background; ``call`` names it for the denial cache."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._queue.put_nowait((call, plan))

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty() and len(batch) < BATCH:
                batch.append(self._queue.get_nowait())
            await self._count(batch)

    async def _count(self, batch: list[tuple[object, Plan]]) -> None:
        outcomes = await asyncio.gather(
            *(self._decide(plan) for _, plan in batch), return_exceptions=True
        )
        for (call, _), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, Decision):
                if not outcome.allowed and not outcome.degraded:
                    self._refused(call, outcome)
            elif isinstance(outcome, Exception):
                logger.warning("ratelimit: a background count failed: %s", outcome)
        for _ in batch:
            self._queue.task_done()

    async def flush(self) -> None:
        """Wait until every queued call has been counted."""
        if self._task is not None:
            await self._queue.join()

    async def aclose(self) -> None:
        """Count what is queued, then stop."""
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
