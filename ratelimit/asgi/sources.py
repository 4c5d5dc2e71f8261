"""Where an HTTP limit's selector values come from: the client address, a header, a path or
query parameter, the authenticated user, a field of the JSON body (route dependencies only),
or any function of the request, sync or async.

Each source is a function of an :class:`~ratelimit.asgi.request.HTTPRequest`. A value of
``None`` or ``""`` means the rule does not apply to that request (as everywhere in this
package): a request without an ``X-API-Key`` header is not limited by ``apikey:10/m``.

``header``, ``query_param``, ``path_param``, ``json_field`` and ``user`` take ``type=``
(``int``, ``bool`` or any function of the value) so that every spelling of one value counts
as one: ``json_field("account", type=int)`` counts ``7``, ``"07"`` and ``7.0`` as 7, and
refuses ``"x"`` with 422 (see :mod:`ratelimit.asgi.values` for the rules, with and without
a type).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ratelimit.asgi.request import HTTPRequest
from ratelimit.asgi.values import Convert, as_text, converted, converter
from ratelimit.core.plan import CompiledTree
from ratelimit.errors import ConfigurationError, SourceValueError

SourceFunction = Callable[[HTTPRequest], Any]


@dataclass(frozen=True, slots=True)
class Source:
    """A named way to read a selector value from a request. ``needs_body``: reads the body,
    which only a route dependency can (the middleware never buffers one). ``convert``: reads
    a present value as its type (``expected`` names it in errors)."""

    read: SourceFunction
    what: str
    needs_body: bool = False
    convert: Convert | None = None
    expected: str = ""
    path_param: str | None = None
    """The path parameter it reads (:func:`path_param`), which a route's pattern must have."""

    def __repr__(self) -> str:
        return self.what


def client_ip() -> Source:
    """The client's address (see ``trusted_proxies``; ``"unknown"``, shared by every such
    request, when it cannot be known). The default source of a selector named ``ip``."""
    return Source(lambda request: request.client_ip, "client_ip()")


def header(name: str, *, type: object = None) -> Source:
    """A request header, by name (any case). Sent more than once, it is refused (422,
    :class:`~ratelimit.errors.SourceValueError`): frameworks read one line of several
    (Starlette the first, others the last, or all joined), so counting any one of them
    could count what the endpoint does not use. ``type``: see the module's documentation
    (for every source below too)."""
    _check_name("header", name)
    lower, what = name.lower(), f"header({name!r})"
    return _typed(
        lambda request: _once(request.header_values(lower), what), "header", repr(name), type
    )


def _once(values: list[str], what: str) -> str | None:
    """The one value a request sent, ``None`` for none; more than one is refused."""
    if len(values) > 1:
        raise SourceValueError(what, ", ".join(values), f"one value (sent {len(values)} times)")
    return values[0] if values else None


def query_param(name: str, *, type: object = None) -> Source:
    """A query-string parameter. Given more than once (``?org=1&org=7``), it is refused
    (422): Starlette and FastAPI read the last value, other frameworks the first."""
    _check_name("query_param", name)
    what = f"query_param({name!r})"
    return _typed(
        lambda request: _once(request.query_values(name), what), "query_param", repr(name), type
    )


def path_param(name: str, *, type: object = None) -> Source:
    """A path parameter: ``{name}`` in the route's pattern, or the framework's own."""
    _check_name("path_param", name)
    source = _typed(lambda request: request.path_params.get(name), "path_param", repr(name), type)
    return dataclasses.replace(source, path_param=name)


def user(attribute: str | None = None, *, type: object = None) -> Source:
    """The authenticated user, ``scope["user"]`` (Starlette's ``AuthenticationMiddleware``
    sets it): its ``attribute``, else its ``identity``, ``username`` or ``display_name``,
    else its text. An unauthenticated user (``is_authenticated`` false) has no value."""
    if attribute is not None:
        _check_name("user", attribute)

    def read(request: HTTPRequest) -> Any:
        who = request.user
        if who is None or getattr(who, "is_authenticated", True) is False:
            return None
        if attribute is not None:
            return getattr(who, attribute, None)
        for name in ("identity", "username", "display_name"):
            value = getattr(who, name, None)
            if value:
                return value
        return who

    return _typed(read, "user", "" if attribute is None else repr(attribute), type)


def json_field(path: str, *, type: object = None) -> Source:
    """A field of the JSON body: ``"username"``, or ``"user.name"`` for nested objects.
    Route dependencies only: the middleware never reads a body. Without ``type``, an
    object or a list is no value; with one, it is a value the type cannot read (422)."""
    _check_name("json_field", path)
    parts = path.split(".")
    keep_containers = type is not None

    async def read(request: HTTPRequest) -> Any:
        value = await request.json()
        for part in parts:
            if not isinstance(value, Mapping):
                return None
            value = value.get(part)
        if isinstance(value, Mapping | list) and not keep_containers:
            return None
        return value

    return _typed(read, "json_field", repr(path), type, needs_body=True)


def _typed(
    read: SourceFunction, kind: str, argument: str, type_: object, needs_body: bool = False
) -> Source:
    """A source of ``kind`` (named with its ``argument`` text), reading ``type_`` when given."""
    if type_ is None:
        return Source(read, f"{kind}({argument})", needs_body)
    convert, expected, name = converter(type_, f"{kind}({argument})")
    what = f"{kind}({', '.join(filter(None, [argument, f'type={name}']))})"
    return Source(read, what, needs_body, convert, expected)


def _check_name(source: str, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{source}() takes a non-empty name, not {name!r}")


def sources_for(
    compiled: CompiledTree, given: Mapping[str, object], where: str, body: bool
) -> dict[str, Source]:
    """Every selector of ``compiled`` mapped to its source, checked now: a selector named
    ``ip`` reads :func:`client_ip` unless given; a function of the request is wrapped; a
    literal is fixed. A missing source, a source for no selector of the rules, or a body
    source where no body can be read (``body`` false) raises ``ConfigurationError``."""
    unknown = sorted(set(given) - set(compiled.selectors))
    if unknown:
        raise ConfigurationError(
            f"{where}: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a "
            f"selector of its rules '{compiled.tree}'"
        )
    sources: dict[str, Source] = {}
    for name in compiled.selectors:
        if name in given:
            sources[name] = _as_source(given[name], name, where)
        elif name == "ip":
            sources[name] = client_ip()
        else:
            raise ConfigurationError(
                f"{where}: rules '{compiled.tree}' select {name!r} but no source was given; "
                f"pass {name}=header('x-{name}'), query_param({name!r}), path_param({name!r}), "
                f"user(), json_field({name!r}) or a function of the request"
            )
        if sources[name].needs_body and not body:
            raise ConfigurationError(
                f"{where}: {name}={sources[name]!r} reads the request body, which the "
                "middleware never buffers; limit that route with a dependency "
                "(ratelimit.asgi.RouteLimit) instead"
            )
    return sources


def _as_source(value: object, name: str, where: str) -> Source:
    if isinstance(value, Source):
        return value
    if callable(value):
        function: SourceFunction = value
        return Source(function, getattr(value, "__qualname__", repr(value)))
    if value is None or isinstance(value, str | int | bytes):
        return Source(lambda request: value, repr(value))
    raise TypeError(
        f"{where}: {name}= must be a source (header(), query_param(), ...), a function of "
        f"the request or a literal, not {type(value).__name__}"
    )


Values = tuple[str | None, ...]
"""One request's selector values, in the order of its tree's selectors."""


def resolve_now(
    names: tuple[str, ...], sources: Mapping[str, Source], request: HTTPRequest
) -> Values | Awaitable[Values]:
    """The selector values of one request, in the order of ``names``; an awaitable of them
    once a source answers an awaitable (a body field, an async function), which reads the
    sources after it then (each source is read once)."""
    values: list[str | None] = []
    for i, name in enumerate(names):
        source = sources[name]
        value = source.read(request)
        if value is not None and value.__class__ is not str and inspect.isawaitable(value):
            return _resolved(names, sources, request, values, i, value)
        values.append(_value(source, value))
    return tuple(values)


async def resolve(
    names: tuple[str, ...], sources: Mapping[str, Source], request: HTTPRequest
) -> Values:
    """The selector values of one request, in the order of ``names``."""
    values = resolve_now(names, sources, request)
    return values if values.__class__ is tuple else await values  # type: ignore[misc]


async def _resolved(
    names: tuple[str, ...],
    sources: Mapping[str, Source],
    request: HTTPRequest,
    values: list[str | None],
    at: int,
    awaited: Awaitable[object],
) -> Values:
    """:func:`resolve_now` from the source at ``at``, whose value is ``awaited``."""
    values.append(_value(sources[names[at]], await awaited))
    for name in names[at + 1 :]:
        source = sources[name]
        value = source.read(request)
        if inspect.isawaitable(value):
            value = await value
        values.append(_value(source, value))
    return tuple(values)


def _value(source: Source, value: object) -> str | None:
    if source.convert is not None and value is not None and value != "":
        value = converted(value, source.convert, source.what, source.expected)
    return as_text(value)
