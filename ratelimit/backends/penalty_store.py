"""Where penalties are kept (``limit(..., penalty=...)``): :class:`PenaltyStore`, a store
every process of a namespace shares, so a hold started in one is seen by all.

Per identifier held back (a :class:`~ratelimit.core.plan.Identifier`: namespace, key, selector
and value; selector and value ``None`` for a whole key) the store keeps the times of its
recent refusals (trimmed to the penalty's span) and, while one lasts, the end of its hold.
Implemented by memory:// (:mod:`ratelimit.backends.memory.penalties`), both Redis engines
(:mod:`ratelimit.backends.redis.penalties`) and Postgres
(:mod:`ratelimit.backends.postgres.penalties`); ``sync_rate``'s local counters and backend
objects of your own that lack these methods refuse ``penalty=`` when the limit is made
(:func:`check_penalties`).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, TypeGuard, runtime_checkable

from ratelimit.core.plan import Identifier
from ratelimit.errors import ConfigurationError


class PenaltyHold(NamedTuple):
    """One hold in force: the identifier held back and the seconds left of its hold."""

    key: str
    selector: str | None
    value: str | None
    left: float


@runtime_checkable
class PenaltyStore(Protocol):
    """Keeps refusals and holds, on the store's clock (an injected one in tests)."""

    async def note_refusal(
        self, target: Identifier, count: int, span_ms: int, hold_ms: int
    ) -> float:
        """Note one refusal of ``target``; when it makes ``count`` refusals within
        ``span_ms``, start a hold of ``hold_ms`` (and forget the refusals counted), and
        return its seconds. ``0.0`` when no hold started (also while one is in force:
        a held call is not a refusal of the rules, and a hold is never extended)."""
        ...

    async def penalty_left(self, target: Identifier) -> float:
        """Seconds left of ``target``'s hold; ``0.0`` when none is in force."""
        ...

    async def list_penalties(self, namespace: str, key: str | None = None) -> list[PenaltyHold]:
        """The holds in force in ``namespace`` (of ``key`` only, if given)."""
        ...

    async def lift_penalties(
        self, namespace: str, key: str, selector: str | None = None, value: str | None = None
    ) -> int:
        """End holds now: ``key``'s hold of ``selector=value``; with ``selector`` ``None``,
        every hold of ``key`` (its whole-key hold included). Returns how many were lifted;
        the refusals counted towards the next hold go with them."""
        ...


def holds_penalties(backend: object) -> TypeGuard[PenaltyStore]:
    """Whether ``backend`` keeps penalties: it has :class:`PenaltyStore`'s methods and
    does not say otherwise (``holds_penalties`` false)."""
    return isinstance(backend, PenaltyStore) and bool(getattr(backend, "holds_penalties", True))


def check_penalties(backend: object) -> PenaltyStore:
    """``backend``, which keeps penalties, else ``ConfigurationError`` saying so."""
    if not holds_penalties(backend):
        raise ConfigurationError(
            f"this storage ({type(backend).__name__}) keeps no penalties: penalty= needs "
            "memory://, Redis or PostgreSQL (not sync_rate's local counters, not a backend "
            "object without PenaltyStore's methods)"
        )
    return backend
