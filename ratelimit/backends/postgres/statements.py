"""What the Postgres store's feature mixins (:mod:`.decisions`, :mod:`.settles`,
:mod:`.resets`) share of the backend that holds them: ``_guarded``, which runs a statement on
a connection of the store, set up, within its deadline, and the time a statement passes (the
database's clock unless one is injected)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ratelimit.backends.base import Clock, clock_us


class Statements:
    """The attributes :class:`~ratelimit.backends.postgres.backend.PostgresBackend` sets, as
    its feature mixins read them."""

    clock: Clock | None
    _guarded: Callable[..., Awaitable[Any]]

    def _now(self) -> int | None:
        """The time a statement passes as ``p_now``: ``None`` (the database's clock) unless a
        clock is injected."""
        return None if self.clock is None else clock_us(self.clock)
