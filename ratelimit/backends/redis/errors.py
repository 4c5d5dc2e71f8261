"""The one place where redis-py's errors become this package's :class:`BackendError`.

Every Redis engine runs its Redis work inside :func:`mapped`: a missed deadline, an error
Redis answered, a dropped connection or a socket error leaves the block as a
``BackendError`` naming what was being done, with the original as its ``__cause__``, which
the failure policy (``on_error``) then answers. The package's own errors (a
``LockTimeoutError``, which is also a ``TimeoutError``) pass through unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
