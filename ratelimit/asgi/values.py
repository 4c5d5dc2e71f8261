"""What a selector value read from a request counts as: one text per value the endpoint sees.

A client may spell one value many ways (``7``, ``"7"``, ``7.0``, ``" 7"``, ``"+7"`` in a
JSON body; ``07`` in a query), and an endpoint that validates an integer (FastAPI, pydantic)
reads them all as 7. Counted by spelling, each would be a fresh counter. So:

- **Without a type**, a value counts as its text, with numbers by value: a JSON number that
  is whole counts as that integer (``7``, ``7.0``, ``7e0`` and ``"7"`` are one), other
  numbers by their shortest text (``7.5``), ``true``/``false`` as JSON spells them, text as
  it is (``" 7"`` and ``"07"`` stay apart: only a type says they are numbers).
- **With** ``type=int`` the value is read as an integer, at least as leniently as pydantic
  reads an ``int`` field (FastAPI's rules) and as Python's ``int()``: whitespace around,
  a sign, leading zeros, ``_`` between digits, a fraction of zeros (``"7.00"``), a whole
  float, a boolean (1/0). ``type=bool`` reads pydantic's spellings (``true``/``1``/``yes``/
  ``on``/``t``/``y``, and their opposites, any case). Any other callable (``str.lower``,
  ``uuid.UUID``, a function of your own) is called with the value, and what it returns
  counts by the rule above.
- A value the type cannot read (``"x"`` or ``7.5`` for an integer, a list) raises
  :class:`SourceValueError`: the request is refused with ``422`` problem details and counted
  nowhere, rather than counted under a spelling of its own or not limited at all. The
  endpoint would refuse it too when it declares that type. A value that is absent
  (``None``, ``""``) is not read: as everywhere, the rule then does not apply.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ratelimit.errors import SourceValueError

Convert = Callable[[Any], Any]


def as_text(value: object) -> str | None:
    """A value as counted (the rule without a type): ``None`` stays ``None``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


_ZERO_FRACTION = re.compile(r"(?<=\d)\.0+$")


def to_int(value: object) -> int:
    """``type=int``: see the module's documentation."""
    if isinstance(value, int):  # bool too: True is 1, as pydantic reads it
        return int(value)
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ValueError("not a whole number")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        return int(_ZERO_FRACTION.sub("", value.strip()))
    raise TypeError(f"{type(value).__name__} is not a number")


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def to_bool(value: object) -> bool:
    """``type=bool``: see the module's documentation."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
    raise ValueError("not true or false")


def converter(type_: object, where: str) -> tuple[Convert, str, str]:
    """A source's ``type``, checked now: the function that reads a value, what it expects
    (for error messages) and its name (for the source's text)."""
    if type_ is int:
        return to_int, "an integer", "int"
    if type_ is bool:
        return to_bool, "true or false", "bool"
    if not callable(type_):
        raise TypeError(f"{where}: type= takes int, bool or a function of the value, not {type_!r}")
    name = getattr(type_, "__qualname__", None) or repr(type_)
    return type_, f"accepted by {name}", name


def converted(value: Any, convert: Convert, source: str, expected: str) -> Any:
    """``convert(value)``, its failure a :class:`SourceValueError`."""
    try:
        return convert(value)
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise SourceValueError(source, value, expected) from exc
