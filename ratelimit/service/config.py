"""The rate-limit service's configuration, from the environment: ``RATELIMIT_*`` variables,
and ratio's own ``RATIO_*`` names for those who run ratio today. Every value is checked at
start, and a bad one stops the service with a message naming the variable.

- ``RATELIMIT_STORAGE`` (ratio: ``RATIO_STORAGE``), default ``memory://``: a URL as
  ``RateLimit.from_url`` takes (ratio's ``inmemory://`` too), checked whole (a port that is
  not a number stops the service, naming the variable);
- ``RATELIMIT_RULES`` (``RATIO_LIMIT``), default ``100/m``: the rules of ratio's
  ``RateLimit(owner, resource)``;
- ``RATELIMIT_RULES_FILE``: Envoy descriptors to rules (:mod:`ratelimit.service.rules_file`);
- ``RATELIMIT_PORT`` (``RATIO_PORT``), default ``50051``: the gRPC port;
- ``RATELIMIT_HOST``, default ``0.0.0.0``: the address to listen on;
- ``RATELIMIT_TIMEOUT`` (``RATIO_CONNECTION_TIMEOUT``), default ``1s``: each call's
  deadline, the storage's included;
- ``RATELIMIT_NAMESPACE``, default ``""``: the namespace of every counter and override;
  the library's own default, which ``RateLimit(...)`` and the ``ratelimit`` command use too
  (earlier versions of the service used ``ratelimit``: set ``RATELIMIT_NAMESPACE=ratelimit``
  to keep what they stored; the service warns at start when it finds overrides there and
  none under ``""``, see :mod:`ratelimit.service.upgrading`);
- ``RATELIMIT_ON_ERROR``, default ``allow``: the failure policy, ``allow``, ``deny`` or
  ``local`` (while the store fails, each process decides on its share of each limit,
  answering OK or OVER_LIMIT as any decision: :mod:`ratelimit.pipeline.fallback`);
- ``RATELIMIT_LOCAL_SHARE``, default ``1`` (with ``RATELIMIT_ON_ERROR=local`` only): that
  share, ``0 < share <= 1``, e.g. ``0.25`` for four processes in all (``RATELIMIT_WORKERS``
  and every replica of the service count);
- ``RATELIMIT_ALGORITHM``, default ``sliding-log``: ``sliding-window``, ``fixed-window`` or
  ``gcra`` (the only one that takes ``burst N`` in rules);
- ``RATELIMIT_LEASE``, default ``0`` (off): the limiter's ``lease``, seconds (``0.05``) or a
  duration (``50ms``), at most 60: each process takes a slice of a hot limit from the store
  in one decision and answers the requests that follow from it
  (:mod:`ratelimit.backends.leases`; GCRA, ``&`` trees and requests whose descriptors
  count different ``hits_addend`` still ask the store every time);
- ``RATELIMIT_METRICS``, default ``prometheus`` when ``prometheus-client`` is installed
  (the ``server`` extra brings it), else ``otel``: Prometheus metrics served at
  ``/metrics`` (:mod:`ratelimit.service.prometheus`), OpenTelemetry metrics on the global
  provider (with the ``otel`` extra), ``console`` to print those every minute, or ``none``;
- ``RATELIMIT_METRICS_PORT``, default ``9464``, and ``RATELIMIT_METRICS_HOST``, default
  ``RATELIMIT_HOST``: where ``/metrics`` is served (plain HTTP), for ``prometheus``;
- ``RATELIMIT_WORKERS``, default ``1``: processes serving the one port (``--workers``);
- ``RATELIMIT_MAX_DESCRIPTORS``, default ``100``: the most descriptors one
  ``ShouldRateLimit`` may have (more is ``INVALID_ARGUMENT``);
- ``RATELIMIT_TLS_CERT`` and ``RATELIMIT_TLS_KEY``, default none (plain text): the server's
  certificate chain and private key (PEM files) to serve over TLS, health included;
- ``RATELIMIT_TLS_CLIENT_CA``, default none: CA certificates (PEM) that must have signed a
  client's certificate (mutual TLS; needs the two above). See :mod:`ratelimit.service.tls`;
- ``RATELIMIT_RESPONSE_HEADERS``, default ``on``: ``ShouldRateLimit`` answers carry
  ``RateLimit-Policy``, ``RateLimit`` and (when ``OVER_LIMIT``) ``Retry-After`` in
  ``response_headers_to_add``, which Envoy adds to its client's response
  (:mod:`ratelimit.service.envoy_headers`); ``off`` for none (also ``true``/``false``,
  ``1``/``0``);
- ``RATELIMIT_SPREAD``, default ``auto``: the limiter's ``spread`` setting on a Redis
  store (``on``/``off``; other stores ignore it). The service's own limits are kept one
  slot per key whatever it says (:mod:`ratelimit.service.handlers`); it is for what the
  service shares a store with.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ratelimit.algorithms import ALGORITHMS, SLIDING_LOG
from ratelimit.backends.redis.schemes import SCHEMES as REDIS_SCHEMES
from ratelimit.backends.urls import redacted, storage_url_problem
from ratelimit.core.checks import MAX_LEASE, check_local_share
from ratelimit.errors import ConfigurationError, RuleSyntaxError
from ratelimit.rules.tree import to_tree
from ratelimit.service.tls import tls_files

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|s|m|h))+\Z")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_WORKERS = 64
MAX_DESCRIPTORS = 100
"""The most descriptors one ``ShouldRateLimit`` may have unless ``RATELIMIT_MAX_DESCRIPTORS``
says otherwise. Envoy sends one per ``rate_limits`` entry of the route and its virtual host,
a handful in practice; one request is one script on Redis, about 10 us of Redis time per
descriptor, so 100 keeps a decision near the millisecond every other decision is held to."""
SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
"""The values of an on/off variable (any case)."""


def default_metrics() -> str:
    """``prometheus`` where ``prometheus-client`` is installed, else ``otel``."""
    return "prometheus" if importlib.util.find_spec("prometheus_client") else "otel"


@dataclass(frozen=True)
class ServiceConfig:
    storage: str = "memory://"
    rules: str = "100/m"
    rules_file: str | None = None
    port: int = 50051
    host: str = "0.0.0.0"
    timeout: float = 1.0
    namespace: str = ""
    namespace_given: bool = False
    """``RATELIMIT_NAMESPACE`` was set (even empty): no warning of the old default's."""
    on_error: str = "allow"
    local_share: float = 1.0
    metrics: str = field(default_factory=default_metrics)
    metrics_port: int = 9464
    metrics_host: str | None = None
    workers: int = 1
    algorithm: str = SLIDING_LOG
    lease: float = 0.0
    max_descriptors: int = MAX_DESCRIPTORS
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    response_headers: bool = True
    spread: bool | None = None

    def store_spread(self) -> bool | None:
        """``spread`` for ``RateLimit.from_url``: ``None`` (the default) but on a Redis store."""
        return self.spread if urlsplit(self.storage).scheme in REDIS_SCHEMES else None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServiceConfig:
        """The configuration the environment gives; ``ConfigurationError`` naming the
        variable for a bad value."""
        read = _reader(env)
        values: dict[str, object] = {}
        _read_what(read, values)
        _read_serving(read, values)
        _read_deciding(read, values)
        values["namespace_given"] = "RATELIMIT_NAMESPACE" in env
        _read_answering(read, values)
        _read_layout(read, values)
        values.update(tls_files(env))
        config = cls(**values)  # type: ignore[arg-type]
        if config.workers > 1 and config.storage.startswith("memory://"):
            raise ConfigurationError(
                f"RATELIMIT_WORKERS={config.workers} with storage memory://: each worker would "
                "count apart, admitting up to that many times the limits; give the workers a "
                "store they share (RATELIMIT_STORAGE=redis://..., postgresql://...)"
            )
        return config


Read = Callable[..., tuple[str, str] | None]
"""``read(name, ratio=None)``: the variable set (ours, else ratio's name for it) and its
value, stripped; ``None`` when neither is set."""


def _reader(env: Mapping[str, str]) -> Read:
    def read(name: str, ratio: str | None = None) -> tuple[str, str] | None:
        for variable in (name, ratio):
            if variable and env.get(variable, "").strip():
                return variable, env[variable].strip()
        return None

    return read


def _read_what(read: Read, values: dict[str, object]) -> None:
    """What the service decides with: the store and the rules (text or a file)."""
    if found := read("RATELIMIT_STORAGE", "RATIO_STORAGE"):
        variable, url = found
        if url.startswith("inmemory://"):
            url = "memory://"
        problem = storage_url_problem(url)  # named here, not a traceback at start
        if problem is not None:
            raise ConfigurationError(f"{variable}={redacted(url)!r}: {problem}")
        values["storage"] = url
    if found := read("RATELIMIT_RULES", "RATIO_LIMIT"):
        variable, text = found
        try:
            to_tree(text)
        except RuleSyntaxError as exc:
            raise ConfigurationError(f"{variable}={text!r}: {exc}") from None
        values["rules"] = text
    if found := read("RATELIMIT_RULES_FILE"):
        values["rules_file"] = found[1]


def _read_serving(read: Read, values: dict[str, object]) -> None:
    """Where the service listens, and with how many workers."""
    if found := read("RATELIMIT_PORT", "RATIO_PORT"):
        values["port"] = port(*found)
    if found := read("RATELIMIT_METRICS_PORT"):
        values["metrics_port"] = port(*found)
    if found := read("RATELIMIT_METRICS_HOST"):
        values["metrics_host"] = found[1]
    if found := read("RATELIMIT_WORKERS"):
        variable, text = found
        if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
            raise ConfigurationError(
                f"{variable}={text!r}: the number of worker processes is a whole number "
                f"from 1 to {MAX_WORKERS}"
            )
        values["workers"] = int(text)
    if found := read("RATELIMIT_HOST"):
        values["host"] = found[1]


def _read_deciding(read: Read, values: dict[str, object]) -> None:
    """How each decision is made: deadline, namespace, failure policy, algorithm."""
    if found := read("RATELIMIT_TIMEOUT", "RATIO_CONNECTION_TIMEOUT"):
        variable, text = found
        values["timeout"] = duration(text, variable)
    if found := read("RATELIMIT_NAMESPACE"):
        values["namespace"] = found[1]
    if found := read("RATELIMIT_ON_ERROR"):
        variable, text = found
        if text not in ("allow", "deny", "local"):
            raise ConfigurationError(
                f"{variable}={text!r}: the service's failure policy is 'allow' (answer OK, "
                "marked degraded), 'deny' (answer OVER_LIMIT) or 'local' (decide on this "
                "process's share of each limit)"
            )
        values["on_error"] = text
    if found := read("RATELIMIT_LOCAL_SHARE"):
        values["local_share"] = local_share(*found, values.get("on_error", "allow"))
    if found := read("RATELIMIT_ALGORITHM"):
        variable, text = found
        if text not in ALGORITHMS:
            raise ConfigurationError(
                f"{variable}={text!r}: the algorithm is one of {', '.join(ALGORITHMS)}"
            )
        values["algorithm"] = text
    if found := read("RATELIMIT_LEASE"):
        values["lease"] = lease(*found)


def _read_answering(read: Read, values: dict[str, object]) -> None:
    """What the service tells: metrics, how many descriptors it reads, headers for clients."""
    if found := read("RATELIMIT_METRICS"):
        variable, text = found
        if text not in ("prometheus", "otel", "console", "none"):
            raise ConfigurationError(
                f"{variable}={text!r}: metrics go to 'prometheus' (served at /metrics), "
                "'otel' (the global OpenTelemetry provider), 'console' (printed every "
                "minute) or 'none'"
            )
        values["metrics"] = text
    if found := read("RATELIMIT_MAX_DESCRIPTORS"):
        variable, text = found
        if not text.isdigit() or int(text) < 1:
            raise ConfigurationError(
                f"{variable}={text!r}: the most descriptors a request may have is a whole "
                "number, 1 or more"
            )
        values["max_descriptors"] = int(text)
    if found := read("RATELIMIT_RESPONSE_HEADERS"):
        variable, text = found
        if text.lower() not in SWITCH:
            raise ConfigurationError(
                f"{variable}={text!r}: the headers Envoy passes on to clients are 'on' "
                "or 'off' (or true/false, 1/0)"
            )
        values["response_headers"] = SWITCH[text.lower()]


def _read_layout(read: Read, values: dict[str, object]) -> None:
    """Where a Redis store keeps each identifier (``RATELIMIT_SPREAD``)."""
    if found := read("RATELIMIT_SPREAD"):
        variable, text = found
        if text.lower() != "auto" and text.lower() not in SWITCH:
            raise ConfigurationError(
                f"{variable}={text!r}: where a Redis store keeps each identifier is "
                "'auto' (spread on a Redis Cluster), 'on' or 'off'"
            )
        values["spread"] = SWITCH.get(text.lower())


def bare_host(host: str) -> str:
    """``host`` without the brackets of an IPv6 address (``[::1]`` -> ``::1``), as sockets
    take it."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def address(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:50051``), as gRPC and URLs take
    it."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def port(variable: str, text: str) -> int:
    """A port number from ``text``; ``ConfigurationError`` naming ``variable``."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ConfigurationError(
            f"{variable}={text!r}: a port is a number from 0 to 65535 (0: any free one)"
        )
    return int(text)


def seconds_of(text: str) -> float | None:
    """Seconds from ``"1.5"``, ``"250ms"``, ``"1s"`` or Go's ``"1m30s"``; ``None`` for
    anything else."""
    try:
        return float(text)
    except ValueError:
        if not _DURATION.match(text):
            return None
        return sum(float(n) * _UNIT_S[unit] for n, unit in _PART.findall(text))


def duration(text: str, variable: str) -> float:
    """Seconds from ``"1.5"``, ``"250ms"``, ``"1s"`` or Go's ``"1m30s"``."""
    seconds = seconds_of(text)
    if seconds is None:
        raise ConfigurationError(
            f"{variable}={text!r}: a duration is seconds (1.5) or like 250ms, 1s, 1m30s"
        )
    if not 0 < seconds <= 3600:
        raise ConfigurationError(
            f"{variable}={text!r}: the timeout must be above 0 and at most an hour"
        )
    return seconds


LEASE_EXPECTED = (
    f"a lease is seconds from 0 to {MAX_LEASE:g} (0.05, or a duration such as 50ms; 0: off, "
    "every decision asks the store): how long a process may answer from a slice of a limit "
    "it took from the store"
)


def lease_seconds(text: str) -> float | None:
    """``RATELIMIT_LEASE``'s seconds (``0.05``, ``50ms``), from 0 to
    :data:`~ratelimit.core.checks.MAX_LEASE`; ``None`` for anything else."""
    seconds = seconds_of(text)
    if seconds is None or not 0 <= seconds <= MAX_LEASE:  # NaN too
        return None
    return seconds


def lease(variable: str, text: str) -> float:
    """``RATELIMIT_LEASE``: :func:`lease_seconds`, or ``ConfigurationError`` naming
    ``variable``."""
    seconds = lease_seconds(text)
    if seconds is None:
        raise ConfigurationError(f"{variable}={text!r}: {LEASE_EXPECTED}")
    return seconds


def local_share(variable: str, text: str, on_error: object) -> float:
    """``RATELIMIT_LOCAL_SHARE``: a number with ``0 < share <= 1``, with
    ``RATELIMIT_ON_ERROR=local`` only."""
    if on_error != "local":
        raise ConfigurationError(
            f"{variable}={text!r} applies only to RATELIMIT_ON_ERROR=local (here "
            f"{on_error!r}, so it would do nothing)"
        )
    try:
        share: object = float(text)
    except ValueError:
        share = text
    return check_local_share(share, variable)
