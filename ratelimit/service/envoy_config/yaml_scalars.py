"""go-yaml v2's reading of a file's bytes and of its scalars, and Go's printing of what it
decodes: the parts of ``gopkg.in/yaml.v2`` (v2.4.0, the version envoyproxy/ratelimit pins)
that a Python YAML loader does differently.

- :func:`decoded`: its reader (``readerc.go``): UTF-8, or UTF-16 after a byte order mark;
  its errors (``invalid leading UTF-8 octet``, ``control characters are not allowed``...).
- :func:`resolve`: its ``resolve.go``, the YAML 1.1 table it keeps: booleans ``y``, ``Y``,
  ``yes``, ``on``, ``n``, ``no``, ``off`` (and their capitalised and upper-case forms) beside
  ``true`` and ``false``; integers as Go's ``strconv.ParseInt(s, 0, 64)`` reads them once
  every ``_`` is dropped (``0x1F``, ``0o17``, ``0b101``, ``010`` octal, ``+1``), then as
  ``ParseUint`` (up to 2**64 - 1); floats with or without a dot (``1e3``, ``08``, ``.5``,
  ``.inf``, ``-.Inf``, ``.nan``); timestamps (``2001-12-14``), which it keeps as text.
- :func:`go_text` (``%v``) and :func:`go_syntax` (``%#v``) of a decoded value, as its
  loader's messages and its metadata keys print them.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from datetime import date
from decimal import Decimal
from typing import Any, Literal

STR = "tag:yaml.org,2002:str"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
BOOL = "tag:yaml.org,2002:bool"
NULL = "tag:yaml.org,2002:null"
TIMESTAMP = "tag:yaml.org,2002:timestamp"
BINARY = "tag:yaml.org,2002:binary"
MERGE = "tag:yaml.org,2002:merge"
_RESOLVABLE = frozenset(("", STR, BOOL, INT, FLOAT, NULL, TIMESTAMP))
INT64_MAX = 2**63 - 1
"""Above it a whole number is a Go ``uint64``, not an ``int``."""


class YamlFailure(Exception):
    """One of go-yaml's own failures (``failf``): its text, after ``yaml: ``."""


def short_tag(tag: str) -> str:
    """``shortTag``: ``!!int`` for ``tag:yaml.org,2002:int``; a plain ``<<`` is a string."""
    if tag == MERGE:
        return "!!str"
    prefix = "tag:yaml.org,2002:"
    return "!!" + tag[len(prefix) :] if tag.startswith(prefix) else tag


# the reader


_BOMS = ((b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"), (b"\xef\xbb\xbf", "utf-8"))
_CONTROL = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def decoded(data: bytes) -> str:
    """The text go-yaml reads from ``data``: UTF-8, or UTF-16 after its byte order mark (a
    UTF-8 one is dropped); :class:`YamlFailure` with its reader's words for the first
    character it refuses."""
    encoding = "utf-8"
    for bom, name in _BOMS:
        if data.startswith(bom):
            data, encoding = data[len(bom) :], name
            break
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        valid = data[: exc.start].decode(encoding)
        if _CONTROL.search(valid):
            raise YamlFailure("control characters are not allowed") from None
        if encoding == "utf-8":
            raise YamlFailure(_utf8_problem(data, exc.start)) from None
        raise YamlFailure(_utf16_problem(data[exc.start :], encoding)) from None
    if _CONTROL.search(text):
        raise YamlFailure("control characters are not allowed")
    return text


def _utf8_problem(data: bytes, at: int) -> str:
    """What go-yaml's reader says of the bytes at ``at``, where UTF-8 decoding failed."""
    octet = data[at]
    widths = {0xC0: 2, 0xD0: 2, 0xE0: 3, 0xF0: 4 if octet < 0xF8 else 0}
    width = widths.get(octet & 0xF0, 0)
    if not width:
        return "invalid leading UTF-8 octet"
    if width > len(data) - at:
        return "incomplete UTF-8 octet sequence"
    value = octet & (0x1F, 0x0F, 0x07)[width - 2]
    for trailing in data[at + 1 : at + width]:
        if trailing & 0xC0 != 0x80:
            return "invalid trailing UTF-8 octet"
        value = value << 6 | trailing & 0x3F
    if value < (0x80, 0x800, 0x10000)[width - 2]:
        return "invalid length of a UTF-8 sequence"
    return "invalid Unicode character"  # a surrogate, or past U+10FFFF


def _utf16_problem(data: bytes, encoding: str) -> str:
    """What go-yaml's reader says of UTF-16 ``data`` that starts where decoding failed."""
    order: Literal["little", "big"] = "little" if encoding == "utf-16-le" else "big"
    if len(data) < 2:
        return "incomplete UTF-16 character"
    unit = int.from_bytes(data[:2], order)
    if unit & 0xFC00 == 0xDC00:
        return "unexpected low surrogate area"
    if len(data) < 4:
        return "incomplete UTF-16 surrogate pair"
    return "expected low surrogate area"


# scalars


_BOOLS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE"), True),
    **dict.fromkeys(("on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE"), False),
    **dict.fromkeys(("off", "Off", "OFF"), False),
}
_TABLE: dict[str, tuple[str, Any]] = {
    **{text: (BOOL, value) for text, value in _BOOLS.items()},
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), (NULL, None)),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), (FLOAT, math.nan)),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), (FLOAT, math.inf)),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), (FLOAT, -math.inf)),
}
"""``resolveMap``: the scalars it knows by their text."""
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z")
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_DATE = re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})")
_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})(?:[.,][0-9]+)?")
_ZONE = re.compile(r"(?:Z|[+-][0-9]{2}:[0-9]{2})\Z")


def resolve(tag: str, text: str) -> tuple[str, Any]:
    """``resolve``: the tag and value go-yaml gives scalar ``text`` tagged ``tag`` (``""``:
    a plain scalar): ``None``, a bool, an int, a float, or text (for a string or a
    timestamp). :class:`YamlFailure` for a tag its text does not fit (``!!int abc``)."""
    if tag not in _RESOLVABLE:
        return tag, text
    resolved, value = _resolved(tag, text)
    if tag in ("", resolved, STR):
        return resolved, value
    if tag == FLOAT and resolved == INT:
        return FLOAT, float(value)
    raise YamlFailure(f"cannot decode {short_tag(resolved)} `{text}` as a {short_tag(tag)}")


def _resolved(tag: str, text: str) -> tuple[str, Any]:
    hint = "N" if text == "" else _hint(text[0])
    if not hint or tag == STR:
        return STR, text
    if text in _TABLE:
        return _TABLE[text]
    if hint == "." and text.isascii():
        number = _go_float(text)
        if number is not None:
            return FLOAT, number
    elif hint == "D":
        if tag in ("", TIMESTAMP) and _timestamp(text):
            return TIMESTAMP, text
        plain = text.replace("_", "")
        for parse in (_parse_int, _parse_uint):
            whole = parse(plain, 0)
            if whole is not None:
                return INT, whole
        if _YAML_FLOAT.match(plain):
            number = _go_float(plain)
            if number is not None:
                return FLOAT, number
        if plain.startswith("0b"):  # as it reads "0b-101" too
            whole = _parse_int(plain[2:], 2)
            if whole is None:
                whole = _parse_uint(plain[2:], 2)
            if whole is not None:
                return INT, whole
        elif plain.startswith("-0b"):
            whole = _parse_int("-" + plain[3:], 2)
            if whole is not None:
                return INT, whole
    return STR, text


def _hint(first: str) -> str:
    """``resolveTable``: what a scalar's first character says it may be."""
    if first in "+-0123456789":
        return "D"  # a sign or a digit: a number or a timestamp
    if first in "yYnNtTfFoO~":
        return "M"  # only what the table holds
    return "." if first == "." else ""


def _parse_uint(text: str, base: int) -> int | None:
    """Go's ``strconv.ParseUint(text, base, 64)`` (``None``: an error); base 0 reads a
    ``0x``, ``0o``, ``0b`` or ``0`` prefix."""
    if not text:
        return None
    if base == 0:
        base = 10
        if text[0] == "0":
            prefix = text[1:2].lower()
            if len(text) >= 3 and prefix in ("b", "o", "x"):
                base, text = {"b": 2, "o": 8, "x": 16}[prefix], text[2:]
            else:
                base, text = 8, text[1:]
    if not text.isascii() or any(c not in _DIGITS[:base] for c in text.lower()):
        return None
    value = int(text, base) if text else 0
    return value if value < 2**64 else None


def _parse_int(text: str, base: int) -> int | None:
    """Go's ``strconv.ParseInt(text, base, 64)`` (``None``: an error)."""
    negative = text[:1] == "-"
    magnitude = _parse_uint(text[1:] if text[:1] in ("+", "-") else text, base)
    if magnitude is None:
        return None
    if negative:
        return -magnitude if magnitude <= 2**63 else None
    return magnitude if magnitude <= INT64_MAX else None


def _go_float(text: str) -> float | None:
    """Go's ``strconv.ParseFloat(text, 64)`` of a decimal ``text`` (``None``: an error, an
    overflow included)."""
    try:
        number = float(text)
    except ValueError:
        return None
    return None if math.isinf(number) else number


def _timestamp(text: str) -> bool:
    """``parseTimestamp``: ``text`` is a date, or a date and time, in the forms it reads."""
    found = _DATE.match(text)
    if found is None:
        return False
    try:
        date(*map(int, found.groups()))
    except ValueError:
        return False
    rest = text[found.end() :]
    if not rest:
        return True
    if rest[0] not in "Tt ":
        return False
    clock = _CLOCK.match(rest, 1)
    if clock is None:
        return False
    hour, minute, second = map(int, clock.groups())
    if hour > 23 or minute > 59 or second > 59:
        return False
    zone = rest[clock.end() :]
    return (zone == "") if rest[0] == " " else bool(_ZONE.match(zone))


def interface_value(tag: str, text: str) -> Any:
    """The value go-yaml decodes scalar ``text`` (tag ``tag``) into ``interface{}``: a
    timestamp stays text, ``!!binary`` is decoded."""
    resolved, value = resolve(tag, text)
    if resolved == BINARY:
        try:
            data = base64.b64decode(re.sub("[\r\n]", "", text), validate=True)
        except (binascii.Error, ValueError):
            raise YamlFailure("!!binary value contains invalid base64 data") from None
        return data.decode("utf-8", "replace")
    return value


# printing


def go_text(value: Any) -> str:
    """``fmt.Sprintf("%v", value)`` of a value go-yaml decoded (maps by sorted key)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, list):
        return "[" + " ".join(go_text(v) for v in value) + "]"
    if isinstance(value, dict):
        items = " ".join(f"{go_text(k)}:{go_text(value[k])}" for k in _sorted_keys(value))
        return f"map[{items}]"
    return str(value)


def go_syntax(value: Any) -> str:
    """``fmt.Sprintf("%#v", value)`` of a value go-yaml decoded into ``interface{}``."""
    if value is None:
        return "interface {}(nil)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value > INT64_MAX:
        return f"0x{value:x}"  # a uint64
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(go_syntax(v) for v in value) + "}"
    if isinstance(value, dict):
        items = ", ".join(f"{go_syntax(k)}:{go_syntax(value[k])}" for k in _sorted_keys(value))
        return "map[interface {}]interface {}{" + items + "}"
    return str(value)


def format_float(value: float) -> str:
    """``strconv.FormatFloat(value, 'g', -1, 64)``, as ``%v`` prints a float64: the
    shortest digits, with an exponent from 1e+06 on and below 1e-04."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    shortest = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, shortest.digits))
    point = len(digits) + int(shortest.exponent)  # digits before the decimal point
    exponent = point - 1
    if exponent < -4 or exponent >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _sorted_keys(mapping: dict[Any, Any]) -> list[Any]:
    """A map's keys in the order ``fmt`` prints them (``internal/fmtsort``: by value within
    a type; keys of different types in an order of ours, as Go's depends on the binary)."""

    def order(key: Any) -> tuple[int, Any]:
        if key is None:
            return (0, 0)
        if isinstance(key, bool):
            return (1, key)
        if isinstance(key, int):
            return (2, key)
        if isinstance(key, float):
            return (3, (not math.isnan(key), key if not math.isnan(key) else 0.0))
        return (4, str(key))

    return sorted(mapping, key=order)


_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPES |= {"\v": "\\v", "\\": "\\\\", '"': '\\"'}


def _quoted(text: str) -> str:
    """``strconv.Quote``: printable characters as they are, others escaped."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif char < " " or char == "\x7f":
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'
