"""HTTP header fields as a user's function reads them: a read-only mapping whose names are
case-insensitive, as HTTP's are (RFC 9110 §5.1): ``headers.get("X-API-Key")``,
``headers["x-api-key"]`` and ``"X-Api-Key" in headers`` read one field.

A field sent on several lines reads as one value, its lines joined with ``", "`` in the
order they came (RFC 9110 §5.3); :meth:`HeaderMap.values_of` gives them one by one. Names
iterate in lower case, each once.

It wraps the ASGI list of ``(name, value)`` byte pairs without copying: a lookup scans that
list (a request has a few dozen fields at most); iteration and ``len`` build the joined
fields once, when first asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping


def field_values(raw: Iterable[tuple[bytes, bytes]], name: str) -> list[str]:
    """Every line of the field ``name`` (any case) in ASGI's ``raw`` pairs, in order."""
    try:
        wanted = name.lower().encode("latin-1")
    except (AttributeError, UnicodeEncodeError):  # not a str, or no header's name
        return []
    return [value.decode("latin-1") for key, value in raw if key.lower() == wanted]


class HeaderMap(Mapping[str, str]):
    """Read-only, case-insensitive header fields over ASGI ``(name, value)`` byte pairs.

    Example::

        headers = HeaderMap([(b"x-api-key", b"k1"), (b"accept", b"a"), (b"Accept", b"b")])
        assert headers.get("X-API-Key") == "k1"
        assert headers["ACCEPT"] == "a, b"
    """

    __slots__ = ("_fields", "_raw")

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._fields: dict[str, str] | None = None

    def values_of(self, name: str) -> list[str]:
        """Every line of the field ``name`` (any case), in order; ``[]`` when absent."""
        return field_values(self._raw, name)

    def __getitem__(self, name: str) -> str:
        if self._fields is not None:
            return self._fields[name.lower() if isinstance(name, str) else name]
        found = self.values_of(name)
        if not found:
            raise KeyError(name)
        return found[0] if len(found) == 1 else ", ".join(found)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self.values_of(name))

    def _joined(self) -> dict[str, str]:
        if self._fields is None:
            fields: dict[str, str] = {}
            for name, value in self._raw:
                key, text = name.decode("latin-1").lower(), value.decode("latin-1")
                fields[key] = f"{fields[key]}, {text}" if key in fields else text
            self._fields = fields
        return self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._joined())

    def __len__(self) -> int:
        return len(self._joined())

    def __repr__(self) -> str:
        return f"HeaderMap({self._joined()!r})"
