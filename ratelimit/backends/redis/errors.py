"""The one place where redis-py's errors become this package's :class:`BackendError`.

Every Redis engine runs its Redis work inside :func:`mapped`: a missed deadline, an error
Redis answered, a dropped connection or a socket error leaves the block as a
``BackendError`` naming what was being done, with the original as its ``__cause__``, which
the failure policy (``on_error``) then answers. The package's own errors (a
``LockTimeoutError``, which is also a ``TimeoutError``) pass through unchanged.

A reply that is not one Redis gives to what was asked (:data:`NOT_A_REPLY` raised reading
it) means something else answered: another server at the address, or a socket connected to
itself, which reads its own request back (a client reconnecting to a stopped server's port
in the ephemeral range may be given that port as its own end). :func:`replied` and
:func:`not_a_reply` make that a ``BackendError`` too; the engine closes the client's idle
connections first (:func:`~ratelimit.backends.redis.connections.close_idle`), so that the
next calls connect again instead of reading their own requests back.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from ratelimit.backends.redis.compat import ServerError
from ratelimit.errors import BackendError, RateLimitError


def backend_error(exc: BaseException, doing: str, timeout: float | None) -> BackendError:
    """A fresh ``BackendError`` for ``exc`` met while ``doing`` (such as
    ``"deciding key 'k'"``) under a deadline of ``timeout`` seconds."""
    if isinstance(exc, TimeoutError):
        error = BackendError(f"redis did not answer within {timeout} s {doing}")
    else:
        error = BackendError(f"redis failed {doing}: {exc}")
    error.__cause__ = exc
    return error


def is_backend_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of Redis or of the way to it (not one of ours)."""
    return isinstance(exc, (*ServerError, OSError)) and not isinstance(exc, RateLimitError)


@contextlib.contextmanager
def mapped(doing: str, timeout: float | None) -> Iterator[None]:
    """Raise what fails in the block as a ``BackendError`` (see the module's docstring).

    Example::

        with mapped(f"resetting key {key!r}", timeout):
            async with asyncio.timeout(timeout):
                await client.delete(*keys)
    """
    try:
        yield
    except BaseException as exc:
        if not is_backend_failure(exc):
            raise
        raise backend_error(exc, doing, timeout) from exc


NOT_A_REPLY = (ValueError, TypeError, IndexError, AttributeError, KeyError)
"""What reading a reply raises when it is not a reply of Redis to what was asked (redis-py
reading a ``HELLO`` reply that is not a map raises ``AttributeError``). The package's own
errors (some are ``ValueError`` subclasses) are never taken for one."""


def foreign_reply(exc: BaseException) -> BaseException | None:
    """The error that says a reply was not Redis's (:data:`NOT_A_REPLY`, not ours): ``exc``
    itself, or the cause a Redis error of the client's wraps it in (since redis-py 8.2 a
    cluster client raises ``RedisClusterException`` from the error reading ``CLUSTER
    SLOTS``'s reply); ``None`` when ``exc`` says something else."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes is short; a loop of them never ends
        if seen is None or isinstance(seen, RateLimitError):
            return None
        if isinstance(seen, NOT_A_REPLY):
            return seen
        if not isinstance(seen, ServerError):
            return None
        seen = seen.__cause__
    return None


def is_not_a_reply(exc: BaseException) -> bool:
    """Whether ``exc`` says a reply was not Redis's (see :func:`foreign_reply`)."""
    return foreign_reply(exc) is not None


CloseIdle = Callable[[], Awaitable[None]]
"""Closes the connections a client (or a pipeline) holds idle, so that the next calls
connect anew: one of them carried a reply that was not Redis's."""


def not_a_reply(exc: BaseException, doing: str) -> BackendError:
    """The ``BackendError`` for a reply that ``exc`` says is not Redis's, met while
    ``doing``; its caller closed the client's idle connections first."""
    error = BackendError(
        f"redis failed {doing}: what answered is not a reply of Redis "
        f"({foreign_reply(exc) or exc}); is a Redis "
        "server at that address? The client's idle connections were closed, to connect again"
    )
    error.__cause__ = exc
    return error


@contextlib.asynccontextmanager
async def replied(close_idle: CloseIdle, doing: str, deadline: float | None) -> AsyncIterator[None]:
    """:func:`mapped` (``deadline`` is the block's timeout, for the message), and a reply
    that is not Redis's (:data:`NOT_A_REPLY` raised in the block, which reads it) a
    ``BackendError`` too, after ``close_idle()``."""
    try:
        with mapped(doing, deadline):
            yield
    except NOT_A_REPLY as exc:
        if not is_not_a_reply(exc):
            raise
        await close_idle()
        raise not_a_reply(exc, doing) from exc
    except BackendError as exc:  # a Redis error of the client's wrapping one of them
        cause = exc.__cause__
        if cause is None or not is_not_a_reply(cause):
            raise
        await close_idle()
        raise not_a_reply(cause, doing) from cause
