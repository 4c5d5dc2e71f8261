"""The event loop behind the synchronous API: one daemon thread per limiter runs it, and any
thread hands it coroutines and blocks until they are done.

So the sync API is the async one, not a second implementation: a decision the sync direct
path (:mod:`ratelimit.sync.direct`) does not take runs the async limiter's code on this
loop, and the automatic pipeline batches the decisions of all threads into one script
call. A coroutine runs with a copy of the calling thread's context variables, so selector
callables that read them (Flask's ``request`` and ``g``) see the caller's.

- A caller interrupted while it waits (``KeyboardInterrupt``, any exception raised in its
  thread) cancels its coroutine on the loop: a wait for admission or for a concurrency
  slot ends there, counting and holding nothing.
- :meth:`Portal.close` fails the calls still queued and cancels those still running
  (``LimiterClosedError``), then stops the thread; later calls raise the same, and none
  waits for ever.
- :meth:`Portal.abandon` does the same for a limiter collected without ``close()``,
  without waiting for it: its thread and connections are given back. At the interpreter's
  exit, one hook waits (up to ``CLOSE_WITHIN``) for the threads of abandoned portals still
  closing, so that what ``background=True`` queued is counted even when the limiter was
  dropped just before the exit (the loop's thread is a daemon, killed at exit).
- After ``fork()`` the child has no such thread (threads do not survive a fork) and must
  not use the parent's connections: the next call in the child starts a new loop, and the
  limiter opens new connections (see :class:`ratelimit.sync.RateLimit`). Its locks are
  made anew in the child, as a lock another thread held at the fork would stay held.

The module registers one at-exit and one at-fork hook in all, which go through a weak set
of the live portals: none per portal, so making and dropping limiters leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import contextvars
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ratelimit.errors import EventLoopError, LimiterClosedError

T = TypeVar("T")

IN_LOOP = (
    "ratelimit.sync was called from a running event loop, which it would block: in async "
    "code use ratelimit.RateLimit (await rl.limit(...).decide(), async with rl.limit(...))"
)
CLOSED = "this ratelimit.sync.RateLimit"
LOOKING_EVERY = 1.0
"""How often a waiting caller looks whether the loop is still there (a closed one, or one
stopped under it): it then raises instead of waiting for ever."""
CLOSE_WITHIN = 10.0


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
        self.closed = False
        self.started = 0
        """How many loops were started (a forked child starts its own)."""
        self._closing: asyncio.Task[None] | None = None
        _live.add(self)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop of this process, started if there is none."""
        loop = self._loop
        if loop is not None and self._pid == os.getpid():
            return loop
        with self._lock:
            if self.closed:
                raise LimiterClosedError(CLOSED)
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
            try:
                loop.run_forever()
            finally:
                loop.close()  # its selector and self-pipe: stopped by close() or abandon()
                with _abandoned_lock:
                    _abandoned.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=self.name, daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread, self._pid = loop, thread, os.getpid()
        self.started += 1

    def check_caller(self) -> None:
        if asyncio._get_running_loop() is not None:  # no exception raised: every call asks
            raise EventLoopError(IN_LOOP)
        if threading.current_thread() is self._thread:
            raise EventLoopError(IN_LOOP)  # a selector of the sync API calling it again

    def run(
        self,
        make: Callable[[], Coroutine[Any, Any, T]],
        undo: Callable[[T], Coroutine[Any, Any, object]] | None = None,
    ) -> T:
        """Run the coroutine ``make()`` gives on the loop, in this thread's context, and
        block until it is done: its result, or its exception raised here. ``undo``: what
        gives its result back when the caller was interrupted just as it came (a slot
        taken).

        The hand-over is cheap under load: calls queue, and the loop is woken (a write to
        its self-pipe) only when it is not already about to take them; each caller waits
        on a lock of its own, which the loop releases."""
        self.check_caller()
        if self.closed:
            raise LimiterClosedError(CLOSED)
        return self._run(make, self.loop(), undo)

    def _run(
        self,
        make: Callable[[], Coroutine[Any, Any, T]],
        loop: Any,
        undo: Callable[[T], Coroutine[Any, Any, object]] | None = None,
    ) -> T:
        call = _Call(make, contextvars.copy_context())
        self._pending.append(call)
        if not self._waking:
            self._waking = True
            loop.call_soon_threadsafe(self._take)
        try:
            while not call.done.acquire(timeout=LOOKING_EVERY):
                thread = self._thread
                if loop.is_closed() or thread is None or not thread.is_alive():
                    raise LimiterClosedError(CLOSED)  # closed, or stopped, under this call
        except BaseException:
            self._cancel(call, loop)
            task = call.task
            came = task is not None and task.done() and not task.cancelled()
            if undo is not None and came and call.error is None:  # it came all the same
                given = asyncio.run_coroutine_threadsafe(undo(call.result), loop)
                given.result(CLOSE_WITHIN)
            raise
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
            if self.closed and not call.closing:
                call.fail(LimiterClosedError(CLOSED))
                continue
            try:
                call.task = loop.create_task(call.make(), context=call.context)
            except BaseException as exc:  # handed to the caller
                call.fail(exc)
                continue
            call.task.add_done_callback(call.finished)

    def _cancel(self, call: _Call, loop: asyncio.AbstractEventLoop) -> None:
        """The caller of ``call`` stopped waiting: cancel its coroutine and wait a moment
        for it to unwind (a wait for a slot gives back nothing it did not take)."""

        def cancel() -> None:
            if call.task is not None:
                call.task.cancel()
            elif call in self._pending:  # not started: never will be
                self._pending.remove(call)
                call.fail(concurrent.futures.CancelledError())

        if not loop.is_closed():
            loop.call_soon_threadsafe(cancel)
            call.done.acquire(timeout=CLOSE_WITHIN)

    def close(self, last: Callable[[], Coroutine[Any, Any, object]] | None = None) -> None:
        """Run ``last()`` (closing what the loop holds), fail every call still queued or
        running with ``LimiterClosedError``, then stop the loop and its thread. Nothing in
        a forked child (the loop is its parent's) or when closed already."""
        self.check_caller()
        with self._lock:
            loop, thread = self._loop, self._thread
            if self.closed:
                return
            self.closed = True
            if loop is None or thread is None or self._pid != os.getpid():
                self._loop = self._thread = None
                return
        try:
            if last is not None:
                closing = _Call(last, contextvars.copy_context(), closing=True)
                self._pending.append(closing)
                loop.call_soon_threadsafe(self._take)
                closing.done.acquire(timeout=CLOSE_WITHIN)
        finally:
            asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(CLOSE_WITHIN)
            loop.call_soon_threadsafe(self._fail_pending)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CLOSE_WITHIN)
            if not thread.is_alive():
                loop.close()
            self._fail_pending()

    def abandon(self, last: Callable[[], Coroutine[Any, Any, object]] | None = None) -> None:
        """What a limiter dropped without :meth:`close` does, from whichever thread
        collects it (the loop's own, or one running an event loop, included): without
        waiting, ``last()`` (closing what the loop holds) and then the loop's other tasks
        end on the loop, which stops, closes and ends its thread."""
        loop = self._loop
        if self.closed:
            return
        self.closed = True
        thread = self._thread
        if loop is None or thread is None or self._pid != os.getpid() or loop.is_closed():
            return  # never started, or the parent's loop (a forked child)

        async def closing() -> None:
            try:
                if last is not None:
                    with contextlib.suppress(Exception):  # no one is left to tell
                        await asyncio.wait_for(last(), CLOSE_WITHIN)
            finally:
                await _cancel_all()
                self._fail_pending()
                loop.stop()

        def start() -> None:
            self._closing = loop.create_task(closing())  # kept: the loop holds tasks weakly

        with _abandoned_lock:
            _abandoned.difference_update([t for t in _abandoned if not t.is_alive()])
            _abandoned.add(thread)  # waited for at exit, until it ends
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(start)

    def _fail_pending(self) -> None:
        while self._pending:
            self._pending.popleft().fail(LimiterClosedError(CLOSED))


async def _cancel_all() -> None:
    """Cancel every task of the loop but this one, and let them unwind."""
    mine = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not mine]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=CLOSE_WITHIN)


_live: weakref.WeakSet[Portal] = weakref.WeakSet()
"""Every portal not yet collected: what the at-fork hook renews."""
_abandoned: set[threading.Thread] = set()
"""The threads of abandoned portals still closing (each leaves when it ends)."""
_abandoned_lock = threading.RLock()  # a collection may abandon one in the thread holding it


def _after_fork() -> None:
    """In a forked child: new locks (another thread of the parent may have held them), and
    none of the parent's threads to wait for."""
    global _abandoned_lock
    _abandoned_lock = threading.RLock()
    _abandoned.clear()
    for portal in list(_live):
        portal._lock = threading.Lock()
        portal._pending = collections.deque()
        portal._waking = False


def join_abandoned(within: float = CLOSE_WITHIN) -> None:
    """Wait, up to ``within`` seconds in all, for the threads of abandoned portals to end
    (each counts what ``background=True`` queued, then closes its store)."""
    deadline = time.monotonic() + within
    with _abandoned_lock:
        threads = list(_abandoned)
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


os.register_at_fork(after_in_child=_after_fork)
atexit.register(join_abandoned)


class _Call:
    """One coroutine handed to the loop: how to make it, the caller's context, and what
    came of it; ``done`` is released once it is known."""

    __slots__ = ("closing", "context", "done", "error", "make", "result", "task")

    def __init__(
        self,
        make: Callable[[], Coroutine[Any, Any, Any]],
        context: contextvars.Context,
        closing: bool = False,
    ) -> None:
        self.make = make
        self.context = context
        self.closing = closing
        self.result: Any = None
        self.error: BaseException | None = None
        self.task: asyncio.Task[Any] | None = None
        self.done = threading.Lock()
        self.done.acquire()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.release()

    def finished(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():  # by close() (a caller that gave up reads nothing)
            self.error = LimiterClosedError(CLOSED)
        elif (exc := task.exception()) is not None:
            self.error = exc
        else:
            self.result = task.result()
        self.done.release()
