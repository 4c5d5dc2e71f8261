"""The package's exceptions: one tree, each carrying the data a caller needs.

::

    RateLimitError
    ├── RateLimitExceeded (also RuntimeError)    retry_after, rule, key, decision
    │   └── ConcurrencyLimitExceeded              limit: the full slot limit
    ├── RuleSyntaxError (also ValueError)         text, column
    ├── RuleConflictError (also ValueError)       key
    ├── ConfigurationError (also ValueError)      a setting that cannot work, such as a cost
    ├── UnknownKeyError (also LookupError)        key
    ├── SelectorNotFoundError (also LookupError)  selector, looked_in
    ├── LockTimeoutError (also TimeoutError)      lock, waited, retry_after
    ├── LimiterClosedError (also RuntimeError)    the limiter was used after aclose()
    ├── EventLoopError (also RuntimeError)        two event loops ran one limiter at once,
    │                                             or ratelimit.sync ran in an event loop
    ├── SourceValueError (also ValueError)        source, value: an HTTP value its type= cannot read
    ├── SettleError (also ValueError)             a decision that cannot be settled (again)
    └── BackendError                              the backend's own error is its __cause__

``RateLimitExceeded`` is raised only by the raising front ends (the decorator and
``async with``); ``Limit.decide()`` returns a :class:`~ratelimit.Decision` instead. It is
defined in :mod:`ratelimit.core.decision`, beside the ``Decision`` it carries, and
``ConcurrencyLimitExceeded`` (a call that found no free concurrency slot) in
:mod:`ratelimit.front.concurrency`, so that this module imports nothing of the package (every
module may raise these without an import loop); import both from ``ratelimit``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class RateLimitError(Exception):
    """Base of every exception this package raises."""


class RuleSyntaxError(RateLimitError, ValueError):
    """A rule could not be parsed or is out of range.

    ``column`` is 1-based, or ``None`` when the error is not about one place in a text.
    """

    def __init__(self, message: str, text: str | None = None, column: int | None = None) -> None:
        self.message = message
        self.text = text
        self.column = column
        where = f" at column {column}" if column is not None else ""
        shown = f" in {text!r}" if text is not None else ""
        super().__init__(f"{message}{where}{shown}")


class RuleConflictError(RateLimitError, ValueError):
    """Different rules were registered twice under one key."""

    def __init__(self, key: str, registered: object, new: object) -> None:
        self.key = key
        super().__init__(
            f"key {key!r} already has rules '{registered}'; refusing different rules '{new}' "
            f"(give this limit its own key=, or reuse the rules with limit(key={key!r}))"
        )


class ConfigurationError(RateLimitError, ValueError):
    """A setting that cannot work, such as a cost above a rule's count."""


class UnknownKeyError(RateLimitError, LookupError):
    """``limit(key=...)`` without rules named a key that no limit registered."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"no rules are registered for key {key!r}: decorate one function with "
            f"limit(<rules>, key={key!r}) before calling a limit(key={key!r}) without rules"
        )


class SelectorNotFoundError(RateLimitError, LookupError):
    """A rule names a selector that none of the places looked in could supply: raised when
    decorating a function that no call could supply it for, else by the call."""

    def __init__(
        self, selector: str, key: str, looked_in: Sequence[str], message: str | None = None
    ) -> None:
        self.selector = selector
        self.key = key
        self.looked_in = tuple(looked_in)
        super().__init__(
            message
            or f"selector {selector!r} of key {key!r} was not found; looked in: "
            + "; ".join(self.looked_in)
        )


_VALUE = re.compile(r"=[^{}]*\}")
"""A selector's value inside a spread hash tag (``{ns:key:apikey=<value>}``)."""


class LockTimeoutError(RateLimitError, TimeoutError):
    """The command engine could not take its Redis lock within ``lock_timeout``.

    The call was neither admitted nor counted. ``lock`` is the lock's Redis key (where
    keys spread, one per selector value: the message, which is logged, shows ``=…``
    instead of the value, an API key perhaps), ``waited`` the seconds spent trying,
    ``retry_after`` the seconds until the holder seen last loses the lock by its
    ``lock_ttl`` (``None`` when not known).

    Under ``on_error="raise"`` it reaches the caller; otherwise the failure policy turns it
    into a refusal (``Decision(allowed=False, degraded=True)``): lock contention never
    admits a call. It is not a storage outage.
    """

    def __init__(self, lock: str, waited: float, retry_after: float | None = None) -> None:
        self.lock = lock
        self.waited = waited
        self.retry_after = retry_after
        super().__init__(
            f"could not take lock {_VALUE.sub('=…}', lock)!r} within {waited:.3f} s; the call "
            "was not admitted "
            "(raise lock_timeout, or lower contention on this key)"
        )


class LimiterClosedError(RateLimitError, RuntimeError):
    """The limiter (or its backend) was used after ``aclose()``: nothing was decided or
    counted. Make a new one, or close it only when the application stops."""

    def __init__(self, what: str = "this RateLimit") -> None:
        super().__init__(
            f"{what} was closed by aclose(): it decides and counts nothing more "
            "(make a new one, or close it only when the application stops)"
        )


class EventLoopError(RateLimitError, RuntimeError):
    """The limiter was called from one event loop while another, still running (in another
    thread), was using it (one loop after another is fine; two at once are not); or the
    synchronous API (:mod:`ratelimit.sync`) was called from a running event loop."""

    def __init__(
        self,
        message: str = (
            "this RateLimit is in use by an event loop that is still running in another "
            "thread: make one RateLimit per thread's event loop"
        ),
    ) -> None:
        super().__init__(message)


class SettleError(RateLimitError, ValueError):
    """A decision that cannot be settled: settled already, or one that recorded nothing to
    settle (a peek, a call admitted by background counting). Refused and degraded
    decisions settle as a no-op instead: nothing was recorded, nothing is owed."""


class BackendError(RateLimitError):
    """The storage failed (Redis unreachable, timed out, or answered with an error).

    The original exception is chained as ``__cause__``.
    """


class SourceValueError(RateLimitError, ValueError):
    """A request's selector value that its source's ``type`` cannot read: the middleware
    (and a ``RouteLimit`` without it) answers ``422`` with problem details. ``source``: the
    source, as written (``"json_field('account', type=int)"``); ``value``: what the request
    held."""

    def __init__(self, source: str, value: object, expected: str) -> None:
        self.source = source
        self.value = value
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(f"{source}: {shown} is not {expected}")
