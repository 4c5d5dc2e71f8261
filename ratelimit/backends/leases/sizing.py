"""How large a lease one process takes: from its own recent rate, never more than a share of
what the limit has left, one call when it is idle or near the limit.

A lease is sized when it is taken (:meth:`Sizer.size`): the process's rate since the last
one (an average that halves the weight of the past at every lease) times the hold, rounded
down to the call's cost times a power of two (so one limit uses a handful of plan sizes,
each built once), at most twice the last lease (a burst grows its leases step by step),
at most :data:`SHARE` of what the store said the limit had left after the last lease, and
at most what one call of the rules may cost. A process the store has not answered yet, or
that was refused, takes one call: it decides per call until an admission says there is room.
"""

from __future__ import annotations

SHARE = 0.125
"""The most of what a limit has left (by the last lease's answer) one lease takes. With
``P`` processes taking leases at once, what they hold unused is at most ``P`` leases, each
at most this share of what was left: near the limit, leases shrink to one call."""

_SHORTEST = 1e-6
"""Seconds: the shortest time a rate is measured over (two leases in one clock tick)."""


class Sizer:
    """One limit's lease sizes in one process (:mod:`ratelimit.backends.leases`)."""

    __slots__ = ("_demand", "_since", "hold", "last", "rate")

    def __init__(self, hold: float) -> None:
        self.hold = hold
        """Seconds a lease lasts at most."""
        self.rate = 0.0
        """The process's recent rate (cost per second), as last measured."""
        self.last = 0.0
        """The last lease's size (0: none taken yet)."""
        self._since: float | None = None
        self._demand = 0.0

    def asked(self, cost: float) -> None:
        """A call of ``cost`` asked for the limit (admitted from a lease, or not)."""
        self._demand += cost

    def size(self, now: float, cost: float, left: float | None, most: float) -> float:
        """The size of the lease a call of ``cost`` takes at ``now`` (seconds, the lease
        clock): ``left`` is what the store said the limit had left after the last lease
        (``None``: unknown, or refused since), ``most`` what one call of the rules may
        cost. Counts the asking call's own cost (:meth:`asked` need not be called for it)."""
        self._demand += cost
        if self._since is not None:
            sample = self._demand / max(now - self._since, _SHORTEST)
            self.rate = sample if self.last == 0 else (self.rate + sample) / 2
        self._since = now
        self._demand = 0.0
        if left is None:
            self.last = cost
            return cost
        ceiling = min(self.rate * self.hold, SHARE * left, most, 2 * max(self.last, cost))
        size = cost
        while size * 2 <= ceiling:
            size *= 2
        self.last = size
        return size

    def forget(self) -> None:
        """Start again (the limit was reset): the next lease is one call."""
        self.rate = 0.0
        self.last = 0.0
        self._since = None
        self._demand = 0.0
