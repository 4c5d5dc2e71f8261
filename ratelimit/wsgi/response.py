"""One request the WSGI middleware let through: the application called with a
``start_response`` that adds the rate-limit headers (and settles the route's request from
the response it starts), and its body passed through, chunk by chunk, nothing buffered.

A response is *sent* once a non-empty chunk has gone to the server (or ``write()`` was
called): until then a ``RateLimitExceeded`` (or ``SourceValueError``) from the application,
raised by its call or while its body is produced, replaces its response with the refusal,
through ``start_response``'s ``exc_info`` as PEP 3333 provides; after, it propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeAlias
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from ratelimit.asgi.headers import problem_headers, unreadable
from ratelimit.asgi.limits import HTTPLimit, HTTPResponse
from ratelimit.asgi.request import HTTPRequest
from ratelimit.core.decision import Decision, RateLimitExceeded
from ratelimit.core.slots import SlotLimit
from ratelimit.errors import SourceValueError
from ratelimit.sync.limiter import RateLimit

ExcInfo: TypeAlias = (
    "tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None] | None"
)
"""``start_response``'s ``exc_info`` (PEP 3333)."""
logger = logging.getLogger("ratelimit.wsgi")


class Middleware(Protocol):
    """What an exchange asks of the middleware (:class:`ratelimit.wsgi.RateLimitMiddleware`)."""

    @property
    def app(self) -> WSGIApplication: ...

    @property
    def limiter(self) -> RateLimit: ...

    def headers_for(
        self, decisions: Sequence[Decision], full: SlotLimit | None = None
    ) -> list[tuple[str, str]]: ...

    def refuse(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        request: HTTPRequest,
        decision: Decision,
        decisions: Sequence[Decision],
        full: SlotLimit | None = None,
        exc_info: ExcInfo = None,
    ) -> Iterable[bytes]: ...


def as_text(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """ASGI header pairs (bytes) as WSGI's (latin-1 text)."""
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]


class Exchange:
    """The application's side of one admitted request (or one no route decided).
    ``settle``: the route's limit when it settles from the response."""

    __slots__ = (
        "called",
        "decisions",
        "environ",
        "middleware",
        "request",
        "sent",
        "settle",
        "start_response",
    )

    def __init__(
        self,
        middleware: Middleware,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        request: HTTPRequest,
        decisions: list[Decision],
    ) -> None:
        self.middleware = middleware
        self.environ = environ
        self.start_response = start_response
        self.request = request
        self.decisions = decisions
        self.settle: HTTPLimit | None = None
        self.called = False  # the application called start_response
        self.sent = False  # a body byte went to the server: the response has started

    def run(self) -> Iterable[bytes]:
        """Call the application; its body, passed through."""
        try:
            result = self.middleware.app(self.environ, self.start)
        except (RateLimitExceeded, SourceValueError) as exc:
            return self.refusal(exc)
        wrapper = self.environ.get("wsgi.file_wrapper")
        if isinstance(result, list | tuple) or (
            isinstance(wrapper, type) and isinstance(result, wrapper)
        ):
            return result  # nothing left to raise; the server's own length and file handling
        return Body(self, result)

    def start(
        self, status: str, headers: list[tuple[str, str]], exc_info: ExcInfo = None
    ) -> Callable[[bytes], object]:
        """The application's ``start_response``: the rate-limit headers added."""
        write = self.start_response(
            status, [*headers, *self.middleware.headers_for(self.decisions)], exc_info
        )
        first, self.called = not self.called, True
        if first and self.settle is not None and self.decisions:
            self._settle(self.settle, status, headers)

        def write_noting(data: bytes) -> object:
            if data:
                self.sent = True
            return write(data)

        return write_noting

    def _settle(self, limit: HTTPLimit, status: str, headers: list[tuple[str, str]]) -> None:
        """The route's request settled from the response the application starts."""
        try:
            code = int(status.split(None, 1)[0])
        except (ValueError, IndexError):
            logger.warning("ratelimit: request not settled: status %r is not a number", status)
            return
        raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
        response = HTTPResponse.of({"status": code, "headers": raw})
        request, decision = self.request, self.decisions[0]
        self.middleware.limiter.run(
            lambda limiter: limit.settled(limiter, request, response, decision)
        )

    def refusal(self, exc: RateLimitExceeded | SourceValueError) -> Iterable[bytes]:
        """The answer replacing the application's for ``exc``; ``exc`` raised again once
        the response has been sent."""
        if self.sent:
            raise exc
        trace = exc.__traceback__
        info: ExcInfo = (type(exc), exc, trace) if self.called and trace is not None else None
        if isinstance(exc, SourceValueError):
            return answer(self.start_response, *unreadable(exc), exc_info=info)
        if all(decision is not exc.decision for decision in self.decisions):
            self.decisions.append(exc.decision)
        full: Any = getattr(exc, "limit", None)  # a concurrency limit's full slots
        return self.middleware.refuse(
            self.environ, self.start_response, self.request, exc.decision, self.decisions, full,
            info,
        )  # fmt: skip


class Body:
    """The application's body, passed through; replaced by the refusal when the
    application refuses before sending any of it. ``close()`` closes what it holds."""

    __slots__ = ("chunks", "exchange", "replaced", "result")

    def __init__(self, exchange: Exchange, result: Iterable[bytes]) -> None:
        self.exchange = exchange
        self.result = result
        self.chunks: Iterator[bytes] = iter(result)
        self.replaced = False

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            chunk = next(self.chunks)
        except (RateLimitExceeded, SourceValueError) as exc:
            if self.replaced or self.exchange.sent:
                raise
            self.replaced = True
            self.close()
            self.result = self.exchange.refusal(exc)
            self.chunks = iter(self.result)
            return next(self.chunks)
        if chunk:
            self.exchange.sent = True
        return chunk

    def close(self) -> None:
        close = getattr(self.result, "close", None)
        if close is not None:
            close()


def answer(
    start_response: StartResponse,
    status: int,
    body: bytes,
    added: Sequence[tuple[str, str]] = (),
    exc_info: ExcInfo = None,
) -> list[bytes]:
    """Answer with a problem: ``status``, ``body``, and ``added`` headers after the content
    headers."""
    reason = {422: "Unprocessable Content", 429: "Too Many Requests"}.get(status)
    line = f"{status} {reason or 'Service Unavailable'}"
    start_response(line, [*as_text(problem_headers(body)), *added], exc_info)
    return [body]
