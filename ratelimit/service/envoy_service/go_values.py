"""Go's readings of environment variables, as envoyproxy/ratelimit's ``envconfig`` makes
them: booleans as ``strconv.ParseBool``, whole numbers as ``strconv.ParseInt`` in base 0,
floats as ``strconv.ParseFloat``, durations as ``time.ParseDuration``, maps as
``k1:v1,k2:v2``; and dataclass fields that name the variable they are read from
(:func:`variable_field`, :func:`read_fields`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import Field, field, fields
from fractions import Fraction
from typing import Any

from ratelimit.errors import ConfigurationError


class Unreadable(ValueError):
    """A value its parser cannot read; the message says what was expected."""


_INT = re.compile(
    r"[+-]?(?:0[xX](?:_?[0-9a-fA-F])+|0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0(?:_?[0-7])*"
    r"|[1-9](?:_?[0-9])*)\Z"
)
_BASES = {"x": 16, "b": 2, "o": 8}
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9}
_NS |= {"m": 60 * 10**9, "h": 3600 * 10**9}
_DURATION = "a duration such as 10s, 300ms, 1m30s or 1.5h (units ns, us, ms, s, m, h)"


def go_int(text: str) -> int:
    """Go's ``strconv.ParseInt(text, 0, 64)``: a leading ``0`` alone means octal."""
    if not _INT.match(text):
        raise Unreadable("a whole number")
    sign = -1 if text[0] == "-" else 1
    digits = text.lstrip("+-").replace("_", "")
    if len(digits) > 1 and digits[1].lower() in _BASES:
        value = int(digits[2:], _BASES[digits[1].lower()])
    else:
        value = int(digits, 8 if digits.startswith("0") else 10)
    if not -(1 << 63) <= sign * value < 1 << 63:
        raise Unreadable("a whole number within 64 bits")
    return sign * value


def go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise Unreadable("true or false (Go's 1, t, T, TRUE, true, True, 0, f, F, FALSE, ...)")


def go_float(text: str) -> float:
    """A decimal number, as Go's ``strconv.ParseFloat`` reads one."""
    if not _FLOAT.match(text):
        raise Unreadable("a number")
    return float(text)


def go_duration(text: str) -> float:
    """Go's ``time.ParseDuration``, in seconds (whole nanoseconds, as Go keeps them)."""
    rest = text[1:] if text[:1] in ("+", "-") else text
    if rest == "0":
        return 0.0
    if rest == "":
        raise Unreadable(_DURATION)
    total = Fraction(0)
    while rest:
        number = re.match(r"([0-9]*)(?:\.([0-9]*))?", rest)
        assert number is not None  # the pattern matches the empty string too
        whole, fraction = number.group(1), number.group(2)
        unit = re.match(r"[^0-9.]*", rest[number.end() :])
        assert unit is not None
        if not whole and not fraction:
            raise Unreadable(_DURATION)
        if not unit.group():
            raise Unreadable(f"{_DURATION}: a number needs its unit")
        if unit.group() not in _NS:
            raise Unreadable(f"{_DURATION}: unknown unit {unit.group()!r}")
        total += Fraction(f"{whole or 0}.{fraction or 0}") * _NS[unit.group()]
        rest = rest[number.end() + unit.end() :]
    if total >= 1 << 63:
        raise Unreadable(f"{_DURATION}: at most about 290 years")
    nanoseconds = int(total) * (-1 if text.startswith("-") else 1)
    return nanoseconds / 1e9


def go_map(text: str) -> dict[str, str]:
    """envconfig's ``map[string]string``: ``k1:v1,k2:v2``, each item exactly one ``:``."""
    if not text.strip():
        return {}
    pairs = [item.split(":") for item in text.split(",")]
    if any(len(pair) != 2 for pair in pairs):
        raise Unreadable("key:value pairs separated by commas (k1:v1,k2:v2)")
    return {key: value for key, value in pairs}


def as_text(text: str) -> str:
    """A string variable: its text as given."""
    return text


Parser = Callable[[str], Any]
"""Reads a variable's text as Go does, or raises ``Unreadable`` saying what it expected."""


def variable_field(variable: str, default: Any, parse: Parser = as_text) -> Any:
    """A field read from ``variable`` by ``parse`` (``_URL``: a Redis prefix goes first)."""
    return field(default=default, metadata={"variable": variable, "parse": parse})


def variable_of(item: Field[Any], prefix: str) -> str:
    """The variable a field is read from, under ``prefix`` if its name asks for one."""
    name: str = item.metadata["variable"]
    return prefix + name if name.startswith("_") else name


def read_fields(env: Mapping[str, str], kind: type[Any], prefix: str = "") -> dict[str, Any]:
    """The fields of ``kind`` that ``env`` sets (an empty variable is unset), each parsed."""
    values: dict[str, Any] = {}
    for item in fields(kind):
        if "variable" in item.metadata and env.get(variable_of(item, prefix), ""):
            name = variable_of(item, prefix)
            try:
                values[item.name] = item.metadata["parse"](env[name])
            except Unreadable as exc:
                raise ConfigurationError(f"{name}={env[name]!r}: {exc}") from None
    return values
