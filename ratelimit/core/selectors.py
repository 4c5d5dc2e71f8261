"""Selector values: where a rule's ``username`` or ``apikey`` comes from, for one call.

Looked up in this order, first match wins:

1. keyword arguments given to ``limit()``: a literal, a callable or an async callable;
2. the ``selector=`` object: a mapping item, else an attribute, method or async method;
3. the decorated call's own arguments, by parameter name (defaults applied);
4. an attribute, method or async method of the call's first positional argument (``self``).

Callables are called with no arguments and awaited when they return an awaitable. Values
become text (``bytes`` are decoded losslessly); ``None`` and ``""`` mean "no value": the
rule is then not limited and records nothing. Nothing here is stored between calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratelimit.errors import SelectorNotFoundError

_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class SelectorSources:
    """The call-independent places a limit takes selector values from."""

    keywords: Mapping[str, object] = field(default_factory=dict)
    obj: object | None = None

    def merged_over(self, registered: SelectorSources) -> SelectorSources:
        """These sources first, then those registered for the same key."""
        return SelectorSources(
            {**registered.keywords, **self.keywords},
            self.obj if self.obj is not None else registered.obj,
        )


class Parameters:
    """Where each named parameter of a function is found in a call, computed once.

    Finds a name where :meth:`inspect.Signature.bind` would put it (the positional
    argument, else the keyword, else the default; other keywords count when the function
    takes ``**kwargs``) without binding the whole call.
    """

    __slots__ = (
        "_defaults",
        "_keywords",
        "_max_positional",
        "_positional_only",
        "_positions",
        "_required_keywords",
        "_required_positional",
        "names",
        "signature",
    )

    def __init__(self, signature: inspect.Signature) -> None:
        kinds = inspect.Parameter
        parameters = list(signature.parameters.values())
        self.signature = signature
        self.names = tuple(signature.parameters)
        positional = [
            p for p in parameters if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        takes_any_positional = any(p.kind is kinds.VAR_POSITIONAL for p in parameters)
        self._max_positional = None if takes_any_positional else len(positional)
        # After a parameter with a default, every positional one has a default: the
        # required ones are the first few.
        self._required_positional = tuple(
            (p.name, p.kind is kinds.POSITIONAL_ONLY) for p in positional if p.default is p.empty
        )
        self._required_keywords = tuple(
            p.name for p in parameters if p.kind is kinds.KEYWORD_ONLY and p.default is p.empty
        )
        self._positions = {
            p.name: i
            for i, p in enumerate(parameters)
            if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        }
        self._positional_only = frozenset(
            p.name for p in parameters if p.kind is kinds.POSITIONAL_ONLY
        )
        takes_any_keyword = any(p.kind is kinds.VAR_KEYWORD for p in parameters)
        self._keywords: frozenset[str] | None = (
            None
            if takes_any_keyword
            else frozenset(
                p.name
                for p in parameters
                if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
            )
        )
        self._defaults = {p.name: p.default for p in parameters if p.default is not p.empty}

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` as the function itself would when the call cannot bind to its
        parameters, before anything is decided or counted; quickly when it can."""
        if not self._binds(args, kwargs):
            self.signature.bind(*args, **kwargs)  # raises, with Python's own words

    def positions(self, names: Sequence[str]) -> tuple[int, ...] | None:
        """Where each of ``names`` comes by position, or ``None`` when one cannot."""
        positions = [self._positions.get(name) for name in names]
        return None if None in positions else tuple(positions)  # type: ignore[arg-type]

    def positional_range(self) -> tuple[int, int]:
        """How many positional arguments a call without keywords binds with: (fewest,
        most); an empty range when it never does (a keyword-only parameter is required)."""
        if self._required_keywords:
            return 1, 0
        most = self._max_positional
        return len(self._required_positional), (1 << 62) if most is None else most

    def binds(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether the call binds to the parameters (:meth:`check` without raising)."""
        return self._binds(args, kwargs)

    def _binds(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        given = len(args)
        if self._max_positional is not None and given > self._max_positional:
            return False
        required = self._required_positional
        if not kwargs:
            return len(required) <= given and not self._required_keywords
        for position, (name, positional_only) in enumerate(required):
            if position >= given and (positional_only or name not in kwargs):
                return False
        for name in kwargs:
            if name in self._positional_only:
                if self._keywords is not None:
                    return False  # a positional-only name, and no **kwargs to take it
                continue
            at = self._positions.get(name)
            if at is not None and at < given:
                return False  # given both by position and by name
            if self._keywords is not None and name not in self._keywords:
                return False
        return all(name in kwargs for name in self._required_keywords)

    def may_give(self, name: str) -> bool:
        """Whether some call could give selector ``name``: a parameter of that name (not
        ``*args`` or ``**kwargs``), any name when it takes ``**kwargs``, or any name when
        its first argument is an object whose attributes may hold it (see :func:`_object_first`)."""
        kinds = inspect.Parameter
        parameter = self.signature.parameters.get(name)
        variadic = (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        if parameter is not None and parameter.kind not in variadic:
            return True
        return self._keywords is None or _object_first(self.signature)

    def lookup(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        """The argument the call gives parameter ``name``, or a missing marker."""
        position = self._positions.get(name)
        if position is not None and position < len(args):
            return args[position]
        if (
            name in kwargs
            and name not in self._positional_only
            and (self._keywords is None or name in self._keywords)
        ):
            return kwargs[name]
        return self._defaults.get(name, _MISSING)


@dataclass(slots=True)  # not frozen: built on every call, and frozen init is 4x slower
class CallSite:
    """The decorated function's parameters and one call's arguments (none for ``async with``)."""

    parameters: Parameters
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


async def resolve(
    names: Sequence[str], sources: SelectorSources, key: str, call: CallSite | None = None
) -> tuple[str | None, ...]:
    """Resolve every selector in ``names`` for one call; the values come in that order."""
    values: list[str | None] = []
    for name in names:
        value = _MISSING
        if name in sources.keywords:
            value = await _called(sources.keywords[name])
        elif sources.obj is not None:
            value = await _from_object(sources.obj, name)
        if value is _MISSING and call is not None:
            value = call.parameters.lookup(name, call.args, call.kwargs)
            if value is _MISSING and call.args:
                value = await _from_object(call.args[0], name, mapping=False)
        if value is _MISSING:
            raise SelectorNotFoundError(name, key, _places(sources, call))
        values.append(as_text(value))
    return tuple(values)


def resolved_now(
    names: Sequence[str], sources: SelectorSources, call: CallSite | None
) -> tuple[str | None, ...] | None:
    """:func:`resolve` without a coroutine, for the common case that every name is one of
    the call's arguments (no keyword source, no selector object: nothing to call or await);
    ``None`` otherwise, and :func:`resolve` answers."""
    if call is None or sources.obj is not None:
        return None
    keywords, lookup, args, kwargs = (
        sources.keywords,
        call.parameters.lookup,
        call.args,
        call.kwargs,
    )
    values: list[str | None] = []
    for name in names:
        if name in keywords:
            return None
        value = lookup(name, args, kwargs)
        if value is _MISSING:
            return None
        values.append(as_text(value))
    return tuple(values)


_PLAIN = frozenset(
    {"str", "bytes", "bytearray", "int", "float", "complex", "bool", "list", "dict", "tuple"}
    | {"set", "frozenset", "None"}
)


def unannotated_first(signature: inspect.Signature) -> bool:
    """Whether the first parameter is positional, unannotated and not ``self``/``cls``: a
    plain value or an object (a ``request``), which only a call tells apart."""
    kinds = inspect.Parameter
    first = next(iter(signature.parameters.values()), None)
    return (
        first is not None
        and first.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        and first.name not in ("self", "cls")
        and first.annotation is first.empty
    )


def _object_first(signature: inspect.Signature) -> bool:
    """Whether the first positional argument may be an object with selector attributes:
    ``self`` or ``cls``, ``*args``, or annotated with something other than a built-in type
    (``str``, ``int``, ...). An unannotated first parameter of another name is taken for a
    plain value here; :func:`ratelimit.front.wrapping.findable` still lets its attributes answer
    a name that is no misspelling of that parameter's own name (:func:`unannotated_first`)."""
    kinds = inspect.Parameter
    first = next(iter(signature.parameters.values()), None)
    if first is None or first.kind in (kinds.KEYWORD_ONLY, kinds.VAR_KEYWORD):
        return False
    if first.kind is kinds.VAR_POSITIONAL or first.name in ("self", "cls"):
        return True
    annotation = first.annotation
    if annotation is first.empty or annotation is None:
        return False
    named = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return named not in _PLAIN


def as_text(value: object) -> str | None:
    """A selector value as text: ``None`` stays ``None``, bytes decode without loss."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


async def _called(value: object) -> object:
    if callable(value):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value


async def _from_object(obj: object, name: str, *, mapping: bool = True) -> object:
    if mapping and isinstance(obj, Mapping):
        return await _called(obj[name]) if name in obj else _MISSING
    attribute = getattr(obj, name, _MISSING)
    return _MISSING if attribute is _MISSING else await _called(attribute)


def _places(sources: SelectorSources, call: CallSite | None) -> list[str]:
    places = [f"keyword arguments of limit() ({', '.join(sources.keywords) or 'none'})"]
    if sources.obj is not None:
        kind = "items" if isinstance(sources.obj, Mapping) else "attributes"
        places.append(f"{kind} of the selector object {type(sources.obj).__name__}")
    if call is None:
        places.append("no call arguments (async with): pass it to limit() or use selector=")
    else:
        places.append(f"parameters of the call ({', '.join(call.parameters.names)})")
        if call.args:
            places.append(f"attributes of the first argument ({type(call.args[0]).__name__})")
    return places
