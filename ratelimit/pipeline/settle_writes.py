"""A settle's store write, started so that its caller's cancellation never stops it.

A settle's caller awaits a future of its own (:attr:`~ratelimit.core.settling.Settling.write`),
which the store's write completes when it ends, in a done callback that also applies the
failure policy and, after a refund, lifts the key's cached refusals (:func:`start`). A
caller cancelled meanwhile cancels only its own future: the write, its policy and its
refund happen as if it had waited, and the limiter's ``aclose`` waits for it
(``Decider.finish_later``).

The write is what the store's ``settle_write`` returns where it has one
(:class:`SettleWriter`; the Redis script engine: the pipeline's future of a settle queued
behind the batch in flight, which no caller awaits itself, so a cancelled caller never drops
it from its batch), else ``settle``'s coroutine, in a task. A queued settle costs no task and
three loop callbacks (a task awaited through ``asyncio.shield`` took eight, and its frames
and futures, alive across the batch's round trip, made the garbage collector's full passes,
which pause every call under way, come several times as often).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast, runtime_checkable

from ratelimit.backends.base import SettleStore, shortcut
from ratelimit.core.settling import Settlement, Settling
from ratelimit.pipeline.denials import DenialCache
from ratelimit.pipeline.policy import FailurePolicy


@runtime_checkable
class SettleWriter(Protocol):
    """A store that starts a settle's write itself: without a coroutine of its own where it
    can (a future of the store's), which its caller may leave without stopping it."""

    def settle_write(self, settlement: Settlement) -> Awaitable[Any]:
        """What ``settle(settlement)`` does: a future that stands whether or not anyone
        awaits it, or a coroutine to run in a task."""
        ...


class SettleSite(Protocol):
    """What a settle's write uses of its :class:`~ratelimit.pipeline.decider.Decider`."""

    @property
    def backend(self) -> object: ...

    @property
    def policy(self) -> FailurePolicy: ...

    @property
    def denials(self) -> DenialCache: ...

    def finish_later(
        self, work: Awaitable[Any], then: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> asyncio.Future[Any]: ...


def start(site: SettleSite, taken: Settling, settlement: Settlement) -> None:
    """Start the store's write of ``settlement`` (not empty); ``taken`` answers it."""
    backend = site.backend
    if _writes(backend):
        work = cast(SettleWriter, backend).settle_write(settlement)
    else:
        work = cast(SettleStore, backend).settle(settlement)  # checked when the limit was made
    taken.follow(asyncio.get_running_loop(), functools.partial(_outcome, site, settlement))
    site.finish_later(work, taken.finished)  # a future stays itself; a coroutine gets a task


def written_now(site: SettleSite, settlement: Settlement) -> bool | None:
    """The settle's answer where its store writes it without a coroutine (``settle_now``,
    ``memory://``: :func:`~ratelimit.backends.base.shortcut` of ``settle``), written now
    and answered as :func:`_outcome` answers; ``None`` for a store without one (then
    :func:`start`)."""
    now = _NOW.get(type(site.backend))
    if now is None:
        now = _NOW[type(site.backend)] = shortcut(site.backend, "settle_now", "settle") is not None
    if not now:
        return None
    error: BaseException | None = None
    try:
        site.backend.settle_now(settlement)  # type: ignore[attr-defined]
    except Exception as exc:  # what the policy makes of it, as of a write's
        error = exc
    settled = site.policy.settled(settlement, error)
    if settled and min(settlement.deltas) < 0:
        site.denials.forget(settlement.plan.namespace, settlement.plan.key)
    return settled


def _outcome(site: SettleSite, settlement: Settlement, source: asyncio.Future[Any]) -> bool:
    """What the settle answers once its write ended (``source``, not cancelled), as
    ``FailurePolicy.settle`` says; a refund recorded lifts the key's cached refusals."""
    settled = site.policy.settled(settlement, source.exception())
    if settled and min(settlement.deltas) < 0:
        site.denials.forget(settlement.plan.namespace, settlement.plan.key)
    return settled


def _writes(backend: object) -> bool:
    """Whether ``backend`` starts its settles with ``settle_write``
    (:func:`~ratelimit.backends.base.shortcut`: a subclass overriding ``settle`` alone, to
    count or fail settles, keeps every settle on its ``settle``), asked once per class."""
    writes = _WRITES.get(type(backend))
    if writes is None:
        writes = _WRITES[type(backend)] = shortcut(backend, "settle_write", "settle") is not None
    return writes


_WRITES: dict[type, bool] = {}
_NOW: dict[type, bool] = {}
