"""The synchronous API: :class:`RateLimit` for plain functions and threads (Flask, Django,
WSGI, scripts), the async limiter run on an event loop in a thread of its own; see
:mod:`ratelimit.sync.limiter`."""

from ratelimit.sync.limiter import RateLimit
from ratelimit.sync.limits import Concurrency, Limit
from ratelimit.sync.overriding import Overrides

__all__ = ["Concurrency", "Limit", "Overrides", "RateLimit"]
