"""Which event loop a limiter's connections and tasks belong to, and moving them to another.

A limiter made at import time is often used by several loops in turn: two ``asyncio.run()``
calls, pytest-asyncio's loop per test, a test client that runs each request in a new loop.
Each part that holds something tied to a loop (a connection, a task, a future) keeps a
:class:`LoopBinding` and, when a call comes from another loop, leaves what the old loop held
behind and starts again in the new one, without losing the hits it had not sent yet. Two
loops running at once (in two threads) cannot share one limiter: that raises
:class:`~ratelimit.errors.EventLoopError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ratelimit.errors import EventLoopError


def abort_transport(transport: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Close a connection's ``transport`` from outside its ``loop`` (ended, or idle): abort
    it, and close its socket where a closed loop can no longer finish the close."""
    if transport is None:
        return
    with contextlib.suppress(RuntimeError):  # raised once the loop is closed
        transport.abort()  # marks it closing; an idle loop finishes the close later
    inner = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
    if inner is not None:  # TLS: the socket is its carrier's
        abort_transport(inner, loop)
    if loop.is_closed():  # its selector is gone: close the socket itself
        sock = getattr(transport, "_sock", None)
        if sock is not None:
            sock.close()
            transport._sock = None  # closed: no "unclosed transport" warning later


class LoopBinding:
    """The event loop something was last used in."""

    __slots__ = ("loop",)

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    def moved(self) -> bool:
        """Bind to the running loop; say whether it differs from the one bound before (a
        first use counts as a move). Raises ``EventLoopError`` while the old loop runs."""
        loop = asyncio.get_running_loop()
        if loop is self.loop:
            return False
        old = self.loop
        if old is not None and old.is_running() and not old.is_closed():
            raise EventLoopError()
        self.loop = loop
        return True
