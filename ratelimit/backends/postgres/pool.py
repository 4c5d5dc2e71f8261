"""The Postgres store's pool, set up apart from decisions.

Setting up (the pool opened, the table and functions in place: :mod:`.schema`) is not a
decision. It runs once, in a task of its own (:meth:`SetUpPool.set_up`) that every call
arriving meanwhile waits for and none cancels by leaving, bounded by ``setup_timeout``
rather than a decision's ``timeout``. After a failed set-up, calls wait for the next one
within their own deadline only, so a database that is down does not hold every call for
``setup_timeout``. When a call finds the table or a function gone, :meth:`SetUpPool.lost`
has the next call set the store up again. Each new connection is warmed before it serves a
decision (:func:`.schema.warm`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ratelimit.backends.loops import abort_transport
from ratelimit.backends.postgres.schema import put_in_place, warm
from ratelimit.errors import BackendError


class SetUpPool:
    """An asyncpg pool of up to ``max_size`` connections to ``dsn``, opened and set up in
    the running event loop by :meth:`set_up`; ``asyncpg`` is the module.

    Example::

        pool = SetUpPool(asyncpg, "postgresql://app@db/app", 20, setup_timeout=5.0)
        connection_pool = pool.ready() or await pool.set_up(None)
    """

    def __init__(self, asyncpg: Any, dsn: str, max_size: int, setup_timeout: float) -> None:
        self._asyncpg = asyncpg
        self.dsn = dsn
        self.max_size = max_size
        self.setup_timeout = setup_timeout
        self.failed = False
        """The last set-up failed."""
        self.generation = 0
        """How many set-ups completed."""
        self.done = ""
        """What the last set-up did, in words."""
        self._pool: Any = None
        self._ready = False
        self._task: asyncio.Task[None] | None = None

    def ready(self) -> Any:
        """The pool, if it is set up; else ``None``."""
        return self._pool if self._ready else None

    def forget(self) -> None:
        """Leave the pool and the set-up of an event loop that is gone, closing the pool's
        connections' sockets (their loop can no longer)."""
        pool, self._pool, self._ready, self._task = self._pool, None, False, None
        loop = getattr(pool, "_loop", None)
        if not isinstance(loop, asyncio.AbstractEventLoop):
            return
        for holder in getattr(pool, "_holders", ()):  # asyncpg's, one per connection
            connection = getattr(holder, "_con", None)
            if connection is None:
                continue
            transport = getattr(connection, "_transport", None)
            with contextlib.suppress(RuntimeError):  # its loop is closed: the socket below
                connection.terminate()  # marks it closed (no "unclosed connection" later)
            abort_transport(transport, loop)

    def lost(self, generation: int) -> None:
        """A call that started after set-up ``generation`` found the schema gone: the next
        call sets it up again (unless another set-up completed since)."""
        if self.generation == generation:
            self._ready = False

    async def set_up(self, wait: float | None) -> Any:
        """The pool, set up: wait for the set-up under way, or start one, for at most
        ``wait`` seconds (``None``: until it ends, within ``setup_timeout``). Leaving does
        not stop it. ``BackendError`` when it fails or ``wait`` passes."""
        task = self._task
        if task is None or task.done():
            task = self._task = asyncio.get_running_loop().create_task(self._setting_up())
            task.add_done_callback(_consume)
        try:
            async with asyncio.timeout(wait):
                await asyncio.shield(task)
        except TimeoutError:
            raise BackendError(
                f"postgres was not set up within {wait} s (a set-up failed before; the next "
                "goes on without this call)"
            ) from None
        return self._pool

    async def _setting_up(self) -> None:
        asyncpg = self._asyncpg
        try:
            async with asyncio.timeout(self.setup_timeout):
                if self._pool is None:
                    self._pool = await asyncpg.create_pool(
                        self.dsn, min_size=1, max_size=self.max_size, init=self._warm
                    )
                async with self._pool.acquire() as connection:
                    self.done = await put_in_place(connection)
                    await warm(connection, asyncpg.PostgresError)
        except BaseException as exc:
            self.failed = True
            if isinstance(exc, TimeoutError):
                raise BackendError(
                    f"postgres was not set up within setup_timeout={self.setup_timeout} s "
                    "(opening the pool, putting the schema in place)"
                ) from None
            if isinstance(exc, (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)):
                raise BackendError(f"postgres could not be set up: {exc}") from exc
            raise
        self._ready, self.failed = True, False
        self.generation += 1

    async def _warm(self, connection: Any) -> None:
        """``create_pool(init=...)``: a new connection of a set-up store is warmed."""
        if self._ready:
            await warm(connection, self._asyncpg.PostgresError)

    async def aclose(self) -> None:
        """Stop a set-up under way and close the pool (both of the running event loop)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._pool is not None:
            await self._pool.close()


def _consume(task: asyncio.Task[Any]) -> None:
    """A set-up that failed with nobody left waiting for it: no "never retrieved" warning."""
    if not task.cancelled():
        task.exception()
