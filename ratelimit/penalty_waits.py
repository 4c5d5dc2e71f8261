"""A call that waits its turn (``wait=``, :func:`ratelimit.waiting.admitted`; an HTTP
route's ``delay=``) counts towards a ``penalty=`` once at most: refusals it meets while
waiting are not noted; when it is admitted in the end, none is; when it is refused in the
end (its wait runs out, a refusal outlasts it), that last refusal is noted (:meth:`Waiting.final`).
A client that was only slowed down is not held back for it. Pure bookkeeping in the
caller's context: no import of the limiter's parts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ratelimit.decision import Decision

Note = Callable[["Decision"], Awaitable["Decision"]]


class Waiting:
    """``with Waiting() as waiting:`` around a call's asks; a penalty's refusal seen
    within is kept in ``pending`` (its note, the last one) instead of being noted."""

    __slots__ = ("_token", "pending")

    def __init__(self) -> None:
        self.pending: Note | None = None
        self._token: Token[Waiting | None] | None = None

    def __enter__(self) -> Waiting:
        self._token = _WAITING.set(self)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._token is not None
        _WAITING.reset(self._token)

    async def final(self, decision: Decision) -> Decision:
        """``decision``, the call's last: a refusal of the rules is noted now (a hold it
        starts refuses it as held); anything else notes nothing."""
        note, self.pending = self.pending, None
        if note is None or decision.allowed or decision.degraded or decision.penalty is not None:
            return decision
        return await note(decision)


_WAITING: ContextVar[Waiting | None] = ContextVar("ratelimit_waiting", default=None)


def waiting_call() -> Waiting | None:
    """The :class:`Waiting` of the call being decided, if it waits its turn."""
    return _WAITING.get()
