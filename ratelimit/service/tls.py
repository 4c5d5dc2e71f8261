"""TLS and mutual TLS for the service: its files checked at start, and gRPC's credentials.

- ``RATELIMIT_TLS_CERT``: the server's certificate chain (PEM), leaf first;
- ``RATELIMIT_TLS_KEY``: its private key (PEM, unencrypted: gRPC takes no password);
- ``RATELIMIT_TLS_CLIENT_CA``: CA certificates (PEM); with it, every client must present a
  certificate they signed (mutual TLS).

A certificate needs its key and a key its certificate; a client CA needs both. Each file must
be readable and PEM, and the key the certificate's: :func:`tls_files` checks it all with the
standard library's :mod:`ssl` (which reads PEM as gRPC does), so a mistake stops the service
at start with a message naming the variable, not at the first handshake. The files are read
once, when the service starts (:func:`server_credentials`): a renewed certificate takes a
restart.

Example::

    files = tls_files({"RATELIMIT_TLS_CERT": "server.pem", "RATELIMIT_TLS_KEY": "server.key"})
    credentials = server_credentials(**files)  # None without a certificate
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ratelimit.core.extras import needs_extra
from ratelimit.errors import ConfigurationError

if TYPE_CHECKING:
    import grpc

CERT = "RATELIMIT_TLS_CERT"
KEY = "RATELIMIT_TLS_KEY"
CLIENT_CA = "RATELIMIT_TLS_CLIENT_CA"


def tls_files(env: Mapping[str, str]) -> dict[str, str]:
    """The TLS paths the environment gives, as ``ServiceConfig`` fields (``tls_cert``,
    ``tls_key``, ``tls_client_ca``; none without TLS), once they are known to work together;
    ``ConfigurationError`` naming the variable otherwise."""
    cert, key, client_ca = (env.get(name, "").strip() or None for name in (CERT, KEY, CLIENT_CA))
    if cert is None and key is None:
        if client_ca is not None:
            raise ConfigurationError(
                f"{CLIENT_CA}={client_ca!r} needs {CERT} and {KEY}: client certificates are "
                "asked for over TLS, which needs the server's certificate and key"
            )
        return {}
    if key is None:
        raise ConfigurationError(f"{CERT}={cert!r} needs {KEY}, the certificate's private key")
    if cert is None:
        raise ConfigurationError(f"{KEY}={key!r} needs {CERT}, the key's certificate chain")
    for variable, path in ((CERT, cert), (KEY, key), (CLIENT_CA, client_ca)):
        if path is not None:
            _read(variable, path)
    _check_pair(cert, key)
    found = {"tls_cert": cert, "tls_key": key}
    if client_ca is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=client_ca)
        except ssl.SSLError as exc:
            raise ConfigurationError(
                f"{CLIENT_CA}={client_ca!r}: no PEM certificate in it ({exc})"
            ) from None
        found["tls_client_ca"] = client_ca
    return found


def _check_pair(cert: str, key: str) -> None:
    """The certificate is PEM, the key is PEM, unencrypted, and the certificate's."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=cert)  # certificates only: says which file
    except ssl.SSLError as exc:
        raise ConfigurationError(f"{CERT}={cert!r}: no PEM certificate in it ({exc})") from None

    def encrypted() -> bytes:  # asked only for an encrypted key, never at a terminal
        raise ConfigurationError(
            f"{KEY}={key!r}: the key is encrypted; gRPC takes an unencrypted key "
            "(openssl pkey -in KEY -out KEY.plain)"
        )

    try:
        context.load_cert_chain(cert, key, password=encrypted)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigurationError(
                f"{KEY}={key!r} is not the private key of {CERT}={cert!r}: they do not match"
            ) from None
        raise ConfigurationError(
            f"{KEY}={key!r}: no PEM private key in it that goes with {CERT}={cert!r} ({exc})"
        ) from None


def _read(variable: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(
            f"{variable}={path!r}: cannot read it ({exc.strerror or exc})"
        ) from None


def server_credentials(
    tls_cert: str | None = None, tls_key: str | None = None, tls_client_ca: str | None = None
) -> grpc.ServerCredentials | None:
    """gRPC's credentials for the files :func:`tls_files` checked, read now; ``None``
    without a certificate (plain text). With a client CA, a client without a certificate it
    signed is refused during the handshake."""
    if tls_cert is None or tls_key is None:
        return None
    with needs_extra("server"):
        import grpc

    chain = (_read(KEY, tls_key), _read(CERT, tls_cert))
    client_ca = None if tls_client_ca is None else _read(CLIENT_CA, tls_client_ca)
    return grpc.ssl_server_credentials(
        [chain], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def described(tls_cert: str | None, tls_client_ca: str | None) -> str:
    """How clients connect, for the line the service prints at start."""
    if tls_cert is None:
        return ""
    return ", TLS with client certificates" if tls_client_ca is not None else ", TLS"
