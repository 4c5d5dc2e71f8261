"""The client's address of one request: the connection's peer, or, when the peer is a proxy
the application trusts, what that proxy wrote into the one forwarding header it sets.

Only the header named by ``forwarded_header`` is read (``X-Forwarded-For`` unless told), never
another one because it is present: a proxy that appends ``X-Forwarded-For`` passes a
client's own ``Forwarded`` header through untouched, so believing that would let the client
name itself. The chain is read from the right (what the nearest proxy wrote) and stops at the
first address that is not a trusted proxy, so entries a client wrote before its proxy's own
are never believed. A request whose client cannot be known (a unix socket's peer has no
address, and no trusted header names one) counts as the one client :data:`UNKNOWN`, never as
no client: an ``ip:`` rule then limits all such requests together, and a warning says so once.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ratelimit.errors import ConfigurationError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

logger = logging.getLogger("ratelimit.asgi")

FORWARDED_HEADERS = ("x-forwarded-for", "forwarded", "x-real-ip")
"""The headers a trusted proxy may be said to set: ``X-Forwarded-For`` (a list, each proxy
appending its peer: nginx's ``$proxy_add_x_forwarded_for``, AWS ALB, HAProxy's
``option forwardfor``), RFC 7239 ``Forwarded`` (its ``for=`` parameters) and ``X-Real-IP``
(one address the proxy sets: nginx's ``proxy_set_header X-Real-IP $remote_addr``)."""
UNIX = "unix"
"""The entry of ``trusted_proxies`` that trusts a peer on a unix socket (it has no address)."""
UNKNOWN = "unknown"
"""The client address of every request whose client cannot be known (RFC 7239's word for an
unknown node, which a ``Forwarded: for=unknown`` also gives)."""


class TrustedProxies:
    """The proxies whose forwarding header names the client, and which header that is.

    ``networks``: addresses or networks (``"10.0.0.0/8"``, ``"127.0.0.1"``, ``"::1"``),
    ``"unix"`` for a peer on a unix socket (``uvicorn --uds`` behind nginx), or ``"*"`` for
    every peer, unix sockets included (only when nothing can reach the application except
    through a proxy that sets the header). ``"*"`` trusts the peer, not the addresses in
    the header: with it the client is the header's last entry, unless the entries before
    are proxies named by address too. Empty (the default): the header is ignored and the
    client is the connection's peer. ``forwarded_header``: the header the proxy sets, one of
    :data:`FORWARDED_HEADERS` (default ``"x-forwarded-for"``); no other is read. Repeated
    lines of it are read as one chain, in order. ``ipv6_prefix``: IPv6 clients are counted
    per network of this many bits (default 64: one subscriber's allocation, so that rotating
    addresses inside it gets no fresh quota); 128 counts each address.
    """

    __slots__ = ("_any", "_header", "_networks", "_unix", "_warned", "ipv6_prefix")

    def __init__(
        self,
        networks: Iterable[str] = (),
        ipv6_prefix: int = 64,
        forwarded_header: str = "x-forwarded-for",
    ) -> None:
        if isinstance(networks, str):
            networks = [networks]
        self._any = self._unix = False
        parsed: list[Network] = []
        for entry in networks:
            text = str(entry).strip()
            if text == "*":
                self._any = self._unix = True
            elif text.lower() == UNIX:
                self._unix = True
            else:
                try:
                    parsed.append(ipaddress.ip_network(text, strict=False))
                except ValueError:
                    raise ConfigurationError(
                        f"trusted_proxies: {entry!r} is not an IP address or network "
                        "(write '10.0.0.0/8', '127.0.0.1', '::1', 'unix' or '*')"
                    ) from None
        self._networks = tuple(parsed)
        header = forwarded_header.lower() if isinstance(forwarded_header, str) else None
        if header not in FORWARDED_HEADERS:
            raise ConfigurationError(
                f"forwarded_header: {forwarded_header!r} is not a header this package reads; "
                f"name the one your proxy sets: {', '.join(map(repr, FORWARDED_HEADERS))}"
            )
        self._header = header.encode("ascii")
        if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int):
            raise TypeError(f"ipv6_prefix must be a whole number of bits, not {ipv6_prefix!r}")
        if not 1 <= ipv6_prefix <= 128:
            raise ConfigurationError(f"ipv6_prefix must be from 1 to 128 bits, not {ipv6_prefix}")
        self.ipv6_prefix = ipv6_prefix
        self._warned = False

    @property
    def forwarded_header(self) -> str:
        return self._header.decode("ascii")

    def __bool__(self) -> bool:
        return self._any or self._unix or bool(self._networks)

    def trusts(self, address: str | None) -> bool:
        """Whether a peer is a trusted proxy: ``None`` (no address) is a unix socket's."""
        if address is None:
            return self._unix
        return self._any or self._listed(address)

    def _listed(self, address: str) -> bool:
        """An address in the chain is a trusted proxy: one of the networks (``"*"`` does
        not vouch for what a header says), or a unix socket's placeholder (``unix:``). An
        IPv4 address written as IPv6 (``::ffff:127.0.0.1``, a dual-stack listener's peer)
        is the IPv4 address."""
        if self._unix and (address == UNIX or address.startswith("unix:")):
            return True
        parsed = _address(address)
        if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
            parsed = parsed.ipv4_mapped
        return parsed is not None and any(parsed in network for network in self._networks)

    def client(self, scope: Mapping[str, Any]) -> str:
        """The client's address: the peer, or, when the peer is a trusted proxy, the nearest
        address in its forwarding chain that is not one; :data:`UNKNOWN` when neither gives
        one (see the module's documentation)."""
        peer = scope.get("client")
        address = str(peer[0]) if peer and peer[0] else None  # none: a unix socket
        if self.trusts(address):
            for hop in reversed(self.chain(scope)):
                address = hop
                if not self._listed(hop):
                    break
        if address is None:
            self._warn_unknown()
            return UNKNOWN
        return self.grouped(address)

    def chain(self, scope: Mapping[str, Any]) -> list[str]:
        """The addresses the proxies reported in the forwarding header, first (farthest) to
        last, every line of it in order; ports and brackets removed."""
        wanted, hops = self._header, []
        for name, value in scope.get("headers", ()):
            if name.lower() == wanted:
                text = value.decode("latin-1")
                hops += _forwarded_for(text) if wanted == b"forwarded" else _listed(text)
        if wanted == b"x-real-ip" and len(hops) > 1:  # one address, or a client's own too
            return []  # (a WSGI server joins X_Real_IP with X-Real-IP): trust neither
        return hops

    def grouped(self, address: str) -> str:
        """An address as counted: IPv6 by its ``ipv6_prefix`` network, IPv4 as is; text that
        is no address (``unknown``, an obfuscated RFC 7239 node) unchanged."""
        return _grouped(address, self.ipv6_prefix)

    def _warn_unknown(self) -> None:
        if self._warned:
            return
        self._warned = True
        header = self.forwarded_header
        if self._unix:
            why = (
                f"the trusted proxy on the unix socket sent no {header} header; make it send "
                f"one (nginx: proxy_set_header {header} ...), or name the header it does send "
                f"with forwarded_header= (one of {', '.join(FORWARDED_HEADERS)})"
            )
        else:
            why = (
                "a request came over a unix socket, which gives no peer address; if a proxy "
                f"in front sets {header}, trust it with trusted_proxies=['unix'] (and "
                "forwarded_header= if it sets another header)"
            )
        logger.warning(
            "ratelimit: client addresses are unknown, so every such request counts as the one "
            "client %r (ip: rules limit them together): %s",
            UNKNOWN,
            why,
        )


NO_PROXIES = TrustedProxies()


def _listed(text: str) -> list[str]:
    """``X-Forwarded-For`` / ``X-Real-IP``: comma-separated addresses."""
    return [_host(hop.strip()) for hop in text.split(",") if hop.strip()]


def _forwarded_for(text: str) -> list[str]:
    """RFC 7239 ``Forwarded``: the ``for=`` of each element. Every comma ends an element and
    every semicolon a pair, quotes or not: no node (an address, ``unknown``, ``_hidden``,
    with a port) holds either, and a quote a client leaves open must not swallow the entry a
    proxy appends after it on the same line (the proxy's entry is always after the last
    comma it adds). Quotes around a node, and escapes inside them, are removed."""
    hops = []
    for element in text.split(","):
        for pair in element.split(";"):
            name, _, raw = pair.partition("=")
            if name.strip().lower() == "for":
                hops.append(_host(_unquoted(raw.strip())))
    return hops


_ESCAPE = re.compile(r"\\(.)")


def _unquoted(value: str) -> str:
    """A node without its quotes (and their escapes); one left open loses its opening."""
    if value.startswith('"'):
        value = value[1:-1] if len(value) >= 2 and value.endswith('"') else value[1:]
        return _ESCAPE.sub(r"\1", value)
    return value


def _host(hop: str) -> str:
    """``1.2.3.4:80`` → ``1.2.3.4``; ``[2001:db8::1]:80`` → ``2001:db8::1``."""
    if hop.startswith("["):
        return hop[1 : hop.find("]")] if "]" in hop else hop[1:]
    if hop.count(":") == 1 and not hop.startswith("unix:"):
        return hop.split(":", 1)[0]
    return hop


@functools.lru_cache(maxsize=65536)
def _grouped(address: str, ipv6_prefix: int) -> str:
    """:meth:`TrustedProxies.grouped`, remembered: a busy client is parsed once."""
    parsed = _address(address)
    if parsed is None:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.scope_id is not None:  # "fe80::1%eth0": one host, whatever its zone
            parsed = ipaddress.IPv6Address(parsed.packed)
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
