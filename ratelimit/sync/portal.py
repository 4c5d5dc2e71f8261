"""The event loop behind the synchronous API: one daemon thread per limiter runs it, and any
thread hands it coroutines and blocks until they are done.

So the sync API is the async one, not a second implementation: every decision goes through
the same pipeline, and the automatic pipeline batches the decisions of all threads into
one script call. A coroutine runs with a copy of the calling thread's context variables, so
selector callables that read them (Flask's ``request`` and ``g``) see the caller's.

After ``fork()`` the child has no such thread (threads do not survive a fork) and must not
use the parent's connections: the next call in the child starts a new loop, and the
limiter opens new connections (see :class:`ratelimit.sync.RateLimit`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ratelimit.errors import EventLoopError

T = TypeVar("T")

IN_LOOP = (
    "ratelimit.sync was called from a running event loop, which it would block: in async "
    "code use ratelimit.RateLimit (await rl.limit(...).decide(), async with rl.limit(...))"
)


class Portal:
    """A loop in a thread of its own, started at the first call (and again in a forked
    child); ``name`` names the thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._pending: collections.deque[_Call] = collections.deque()
        self._waking = False
        self.started = 0
        """How many loops were started (a forked child starts its own)."""

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop of this process, started if there is none."""
        loop = self._loop
        if loop is not None and self._pid == os.getpid():
            return loop
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._start()
            assert self._loop is not None
            return self._loop

    @property
    def forked(self) -> bool:
        """Whether a loop was started in another process (this one is its forked child)."""
        return self._loop is not None and self._pid != os.getpid()

    def _start(self) -> None:
        self._pending.clear()  # a forked child's copy of its parent's queue
        self._waking = False
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        thread = threading.Thread(target=run, name=self.name, daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread, self._pid = loop, thread, os.getpid()
        self.started += 1

    def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine ``make()`` gives on the loop, in this thread's context, and
        block until it is done: its result, or its exception raised here.

        The hand-over is cheap under load: calls queue, and the loop is woken (a write to
        its self-pipe) only when it is not already about to take them; each caller waits
        on a lock of its own, which the loop releases."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise EventLoopError(IN_LOOP)
        if threading.current_thread() is self._thread:
            raise EventLoopError(IN_LOOP)  # a selector of the sync API calling it again
        loop = self.loop()
        call = _Call(make, contextvars.copy_context())
        self._pending.append(call)
        if not self._waking:
            self._waking = True
            loop.call_soon_threadsafe(self._take)
        call.done.acquire()  # released by the loop once the coroutine is done
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]

    def _take(self) -> None:
        """On the loop: start every queued coroutine."""
        self._waking = False
        pending, loop = self._pending, self._loop
        assert loop is not None
        while pending:
            call = pending.popleft()
            try:
                task = loop.create_task(call.make(), context=call.context)
            except BaseException as exc:  # handed to the caller
                call.error = exc
                call.done.release()
                continue
            task.add_done_callback(call.finished)

    def close(self, last: Callable[[], Coroutine[Any, Any, object]] | None = None) -> None:
        """Run ``last()`` (closing what the loop holds), then stop the loop and its thread.
        Nothing in a forked child: the loop is its parent's."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or self._pid != os.getpid():
                self._loop = self._thread = None
                return
        try:
            if last is not None:
                self.run(last)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None


class _Call:
    """One coroutine handed to the loop: how to make it, the caller's context, and what
    came of it; ``done`` is released once it is known."""

    __slots__ = ("context", "done", "error", "make", "result")

    def __init__(self, make: Callable[[], Coroutine[Any, Any, Any]], context: contextvars.Context):
        self.make = make
        self.context = context
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()

    def finished(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self.error = concurrent.futures.CancelledError()
        elif (exc := task.exception()) is not None:
            self.error = exc
        else:
            self.result = task.result()
        self.done.release()
