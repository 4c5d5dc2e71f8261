"""What the command engine's locks run apart from their callers, and how many ``BLPOP`` s
they may block at once (:mod:`.lock`): give-backs and tries whose caller left are kept in a
set and awaited by :func:`settle` when the engine closes."""

from __future__ import annotations

import asyncio
from typing import Any

from ratelimit.backends.redis.connections import ConnectionGate

MAX_BLOCKING = 16
"""Most ``BLPOP`` s one engine has blocked at once when its pool has no limit."""
SETTLE_TIMEOUT = 1.0
"""How long closing the engine waits for lock give-backs when it has no ``timeout``."""


class Blocking:
    """How many ``BLPOP`` s one engine may have blocked at once (each holds a connection of
    the pool), and whether the server takes ``BLPOP`` at all."""

    def __init__(self, gate: ConnectionGate | None = None) -> None:
        size = None if gate is None else gate.size
        self.most = MAX_BLOCKING if size is None else max(1, size // 4)
        self.blocked = 0
        self.supported = True
        self.waits: set[asyncio.Future[Any]] = set()  # the BLPOPs under way

    def take(self) -> bool:
        if not self.supported or self.blocked >= self.most:
            return False
        self.blocked += 1
        return True

    def give(self) -> None:
        self.blocked -= 1


LATE: set[asyncio.Future[Any]] = set()
"""What locks made without a ``tasks`` set run apart from their callers."""


async def settle(tasks: set[asyncio.Future[Any]], blocking: Blocking, seconds: float) -> None:
    """Let what locks run apart from their callers (``tasks``: give-backs, tries whose
    caller left) finish for up to ``seconds``, cancelling the ``BLPOP`` s at once and the
    rest after, so that nothing is left pending when the event loop closes."""
    for wait in list(blocking.waits):
        wait.cancel()
    if tasks:
        await asyncio.wait(list(tasks), timeout=seconds)
    left = list(tasks)
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


def consume(task: asyncio.Future[Any]) -> None:
    """Retrieve a background task's outcome so that asyncio does not report it."""
    if not task.cancelled():
        task.exception()
