"""A WSGI request as the ASGI package's pieces read it: :func:`scope_of` builds, from a PEP
3333 ``environ``, the scope-like mapping that :class:`~ratelimit.asgi.HTTPRequest`, the
selector sources and :class:`~ratelimit.asgi.TrustedProxies` read, so both middlewares
count one request alike.

- ``method``: ``REQUEST_METHOD``; ``path``: ``SCRIPT_NAME`` + ``PATH_INFO`` with
  ``root_path``: ``SCRIPT_NAME``, so the path routes match is ``PATH_INFO`` (the
  application's own, as under an ASGI mount or ``--root-path``). WSGI gives paths as bytes
  read as latin-1; they are read as UTF-8 here, as ASGI servers give them.
- ``query_string``: ``QUERY_STRING``; ``headers``: every ``HTTP_*`` variable (``HTTP_X_API_KEY``
  is ``x-api-key``), with ``CONTENT_TYPE`` and ``CONTENT_LENGTH`` when set. A WSGI server
  joins a header sent on several lines into one (with ``,``), so a ``header()`` source cannot
  refuse repeated lines as it does under ASGI; a forwarding header's chain reads the same.
- ``client``: ``(REMOTE_ADDR, REMOTE_PORT)``; no address (a unix socket) is no client, as in
  ASGI. ``user``: ``REMOTE_USER`` (set by the server's or a middleware's authentication),
  read by the ``user()`` source. ``wsgi.environ``: the environ itself, for source functions
  of your own (``lambda request: request.scope["wsgi.environ"]["beaker.session"]...``).
"""

from __future__ import annotations

from typing import Any
from wsgiref.types import WSGIEnvironment

_CONTENT = {"CONTENT_TYPE": b"content-type", "CONTENT_LENGTH": b"content-length"}


def scope_of(environ: WSGIEnvironment) -> dict[str, Any]:
    """The scope-like view of one WSGI request (see the module's documentation)."""
    root = _utf8(environ.get("SCRIPT_NAME", ""))
    headers: list[tuple[bytes, bytes]] = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            key = name[5:].replace("_", "-").lower().encode("latin-1", "replace")
        elif name in _CONTENT and value:
            key = _CONTENT[name]
        else:
            continue
        headers.append((key, str(value).encode("latin-1", "replace")))
    address = environ.get("REMOTE_ADDR") or None
    scope: dict[str, Any] = {
        "type": "http",
        "method": str(environ.get("REQUEST_METHOD", "GET")).upper(),
        "scheme": environ.get("wsgi.url_scheme", "http"),
        "root_path": root,
        "path": root + _utf8(environ.get("PATH_INFO", "")),
        "query_string": str(environ.get("QUERY_STRING", "")).encode("latin-1", "replace"),
        "headers": headers,
        "client": None if address is None else (str(address), _port(environ.get("REMOTE_PORT"))),
        "wsgi.environ": environ,
    }
    user = environ.get("REMOTE_USER")
    if user:
        scope["user"] = user
    return scope


def _utf8(text: object) -> str:
    """A WSGI path (bytes read as latin-1) read as UTF-8; kept as given when it is not."""
    value = str(text)
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def _port(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def routed(path: str) -> str:
    """The path routes and exclusions match: with one leading slash, as Werkzeug (Flask)
    routes ``//login`` and ``login`` as ``/login`` (an empty path is ``/``). Matching a
    spelling the application serves as ``/login`` on another route would let it past
    ``/login``'s limit."""
    return "/" + path.lstrip("/")
