"""One HTTP request or WebSocket handshake as the limiter reads it: a view over the ASGI
scope (no framework needed), and the client address, which forwarding headers may change
only when they come from a proxy the application trusts."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from ratelimit.errors import ConfigurationError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class TrustedProxies:
    """The proxies whose ``Forwarded`` / ``X-Forwarded-For`` headers are believed.

    ``networks``: addresses or networks (``"10.0.0.0/8"``, ``"127.0.0.1"``, ``"::1"``), or
    ``"*"`` for every peer (only when nothing can reach the application except through a
    proxy that sets the header). Empty (the default): the headers are ignored and the client
    is the connection's peer. ``ipv6_prefix``: IPv6 clients are counted per network of this
    many bits (default 64: one subscriber's allocation, so that rotating addresses inside it
    gets no fresh quota); 128 counts each address.
    """

    __slots__ = ("_any", "_networks", "ipv6_prefix")

    def __init__(self, networks: Iterable[str] = (), ipv6_prefix: int = 64) -> None:
        if isinstance(networks, str):
            networks = [networks]
        self._any = False
        parsed: list[Network] = []
        for text in networks:
            if text == "*":
                self._any = True
                continue
            try:
                parsed.append(ipaddress.ip_network(str(text).strip(), strict=False))
            except ValueError:
                raise ConfigurationError(
                    f"trusted_proxies: {text!r} is not an IP address or network "
                    "(write '10.0.0.0/8', '127.0.0.1', '::1' or '*')"
                ) from None
        self._networks = tuple(parsed)
        if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int):
            raise TypeError(f"ipv6_prefix must be a whole number of bits, not {ipv6_prefix!r}")
        if not 1 <= ipv6_prefix <= 128:
            raise ConfigurationError(f"ipv6_prefix must be from 1 to 128 bits, not {ipv6_prefix}")
        self.ipv6_prefix = ipv6_prefix

    def __bool__(self) -> bool:
        return self._any or bool(self._networks)

    def trusts(self, address: str) -> bool:
        if self._any:
            return True
        parsed = _address(address)
        return parsed is not None and any(parsed in network for network in self._networks)

    def client(self, scope: Mapping[str, Any]) -> str | None:
        """The client's address: the peer, or, when the peer is a trusted proxy, the nearest
        address in its forwarding chain that is not one (read right to left, so that what
        a client wrote into the header itself is never believed)."""
        peer = scope.get("client")
        address = str(peer[0]) if peer else None
        if address is not None and self and self.trusts(address):
            for hop in reversed(forwarded_chain(scope)):
                address = hop
                if not self.trusts(hop):
                    break
        return None if address is None else self.grouped(address)

    def grouped(self, address: str) -> str:
        """An address as counted: IPv6 by its ``ipv6_prefix`` network, IPv4 as is; text that
        is no address (``unknown``, a unix socket's path) unchanged."""
        return _grouped(address, self.ipv6_prefix)


@functools.lru_cache(maxsize=65536)
def _grouped(address: str, ipv6_prefix: int) -> str:
    """:meth:`TrustedProxies.grouped`, remembered: a busy client is parsed once."""
    parsed = _address(address)
    if parsed is None:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        if ipv6_prefix < 128:
            return str(ipaddress.ip_network(f"{parsed}/{ipv6_prefix}", strict=False))
    return str(parsed)


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def forwarded_chain(scope: Mapping[str, Any]) -> list[str]:
    """The client addresses the proxies reported, first (farthest) to last: RFC 7239
    ``Forwarded: for=`` when present, else ``X-Forwarded-For``; ports and brackets removed."""
    forwarded: list[str] = []
    xff: list[str] = []
    for name, value in scope.get("headers", ()):
        if name == b"forwarded":
            for element in value.decode("latin-1").split(","):
                for pair in element.split(";"):
                    key, _, raw = pair.strip().partition("=")
                    if key.strip().lower() == "for":
                        forwarded.append(_host(raw.strip().strip('"')))
        elif name == b"x-forwarded-for":
            xff += [_host(hop.strip()) for hop in value.decode("latin-1").split(",") if hop.strip()]
    return forwarded or xff


def _host(hop: str) -> str:
    """``1.2.3.4:80`` → ``1.2.3.4``; ``[2001:db8::1]:80`` → ``2001:db8::1``."""
    if hop.startswith("["):
        return hop[1 : hop.find("]")] if "]" in hop else hop[1:]
    if hop.count(":") == 1:
        return hop.split(":", 1)[0]
    return hop


NO_PROXIES = TrustedProxies()


class HTTPRequest:
    """What selector sources read: the ASGI scope of one request (or WebSocket handshake).

    ``method`` (``"GET"``; ``"WEBSOCKET"`` for a handshake), ``path``, ``headers`` (lower-case
    names; repeated ones joined with ``", "``), ``query`` (the first value of each
    parameter), ``path_params`` (the route's own and the framework's), ``client_ip`` (see
    :class:`TrustedProxies`), ``user`` (``scope["user"]``, set by authentication middleware),
    and :meth:`json` for the body, where a framework has read it (the dependency); the
    middleware never reads a body.
    """

    __slots__ = (
        "_body",
        "_client",
        "_headers",
        "_json",
        "_proxies",
        "_query",
        "path_params",
        "scope",
    )

    def __init__(
        self,
        scope: Mapping[str, Any],
        proxies: TrustedProxies = NO_PROXIES,
        path_params: Mapping[str, str] | None = None,
        body: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.scope = scope
        self._proxies = proxies
        self._client: Any = _UNREAD
        self.path_params: Mapping[str, Any] = {
            **scope.get("path_params", {}),
            **(path_params or {}),
        }
        self._body = body
        self._headers: dict[str, str] | None = None
        self._query: dict[str, str] | None = None
        self._json: Any = _UNREAD

    @property
    def client_ip(self) -> str | None:
        """The client's address (see :class:`TrustedProxies`), read when first asked."""
        if self._client is _UNREAD:
            self._client = self._proxies.client(self.scope)
        client: str | None = self._client
        return client

    def header(self, name: str) -> str | None:
        """One header by lower-case name (repeated ones joined with ``", "``)."""
        if self._headers is not None:
            return self._headers.get(name)
        wanted = name.encode("latin-1")
        found = [value for key, value in self.scope.get("headers", ()) if key.lower() == wanted]
        if not found:
            return None
        return b", ".join(found).decode("latin-1")

    @property
    def method(self) -> str:
        return str(self.scope.get("method", "WEBSOCKET"))

    @property
    def path(self) -> str:
        return str(self.scope.get("path", ""))

    @property
    def headers(self) -> Mapping[str, str]:
        if self._headers is None:
            headers: dict[str, str] = {}
            for name, value in self.scope.get("headers", ()):
                key, text = name.decode("latin-1").lower(), value.decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            self._headers = headers
        return self._headers

    @property
    def query(self) -> Mapping[str, str]:
        if self._query is None:
            query: dict[str, str] = {}
            raw = self.scope.get("query_string", b"").decode("latin-1")
            for name, value in parse_qsl(raw, keep_blank_values=True):
                query.setdefault(name, value)
            self._query = query
        return self._query

    @property
    def user(self) -> Any:
        return self.scope.get("user")

    async def json(self) -> Any:
        """The body parsed as JSON (``None`` when it is not JSON). Only where a framework
        reads the body (the route dependency); the middleware has none to give."""
        if self._json is _UNREAD:
            if self._body is None:
                raise ConfigurationError(
                    "the middleware never reads a request body: take selectors from the "
                    "body in a route dependency (ratelimit.asgi.RouteLimit) instead"
                )
            try:
                self._json = await self._body()
            except (ValueError, UnicodeDecodeError):  # not JSON: no value
                self._json = None
        return self._json


_UNREAD: Any = object()
