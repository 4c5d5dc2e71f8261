"""Leases: a slice of a shared limit taken from the store at once, admitted in-process
(``RateLimit(..., lease=seconds)``): :class:`~.backend.LeasedBackend`."""

from ratelimit.backends.leases.backend import LeasedBackend, LeaseShare, leasable

__all__ = ["LeaseShare", "LeasedBackend", "leasable"]
