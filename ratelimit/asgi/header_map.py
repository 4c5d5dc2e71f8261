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
    wanted = _folded(name)
    if wanted is None:
        return []
    return [value.decode("latin-1") for key, value in raw if key.lower() == wanted]


def _folded(name: object) -> bytes | None:
    """``name`` as the bytes of a field's name in lower case (ASCII letters only, as HTTP
    folds them and as ``bytes.lower`` does: ``"Ä"`` stays, ``"\u212a"`` (Kelvin) is no
    ``k``); ``None`` for what is no header's name (not a str, or not latin-1)."""
    try:
        return name.encode("latin-1").lower() if isinstance(name, str) else None
    except UnicodeEncodeError:
        return None


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
            folded = _folded(name)
            if folded is None or folded.decode("latin-1") not in self._fields:
                raise KeyError(name)
            return self._fields[folded.decode("latin-1")]
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
                key, text = name.lower().decode("latin-1"), value.decode("latin-1")
                fields[key] = f"{fields[key]}, {text}" if key in fields else text
            self._fields = fields
        return self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._joined())

    def __len__(self) -> int:
        return len(self._joined())

    def __repr__(self) -> str:
        return f"HeaderMap({self._joined()!r})"
