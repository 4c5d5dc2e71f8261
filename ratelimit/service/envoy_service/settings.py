"""envoyproxy/ratelimit's environment variables, read with its defaults
(``src/settings/settings.go``), for ``ratelimit serve --envoy``.

Values are read as its ``envconfig`` reads them: booleans as Go's ``strconv.ParseBool``
(``1 t T TRUE true True`` and ``0 f F FALSE false False``), whole numbers as
``strconv.ParseInt`` in base 0 (``10``, ``0x10``, ``0o17``, ``017``, ``1_000``), durations as
``time.ParseDuration`` (``10s``, ``300ms``, ``1m30s``, ``1.5h``, ``0``; units ns, us, µs, ms, s,
m, h; a number without a unit is refused), ``EXTRA_TAGS`` as ``k1:v1,k2:v2``. A bad value
raises :class:`~ratelimit.errors.ConfigurationError` naming the variable, the value and
what is expected (``REDIS_POOL_SIZE='ten': a whole number``); so does a value Go would stop
at start for (``BACKEND_TYPE=memcache`` too: this service counts on Redis, or in one
process with our own ``BACKEND_TYPE=memory``).

One difference: a variable set to the empty string counts as unset, and its default is
used. envconfig 1.4 tells the two apart (an empty number or boolean stops Go's service, an
empty string is kept), so no setting that works under Go changes meaning, except an empty
``RUNTIME_APPDIRECTORY`` or ``RUNTIME_ROOT``, which read the default here.

Every variable of Go's ``Settings`` is in exactly one of :data:`HONOURED` (read into
:class:`EnvoySettings`) and :data:`IGNORED`; :func:`unhonoured` names the ignored ones an
environment sets, for one warning at start.

Example::

    settings = EnvoySettings.from_env(os.environ)
    client = redis_client(settings.redis)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

from ratelimit.algorithms import ALGORITHMS, named
from ratelimit.backends.redis.envoy.connection import address_of, endpoints, scheme_of
from ratelimit.errors import ConfigurationError
from ratelimit.service.config import LEASE_EXPECTED, lease_seconds
from ratelimit.service.envoy_service.go_values import (
    Parser,
    Unreadable,
    as_text,
    go_bool,
    go_duration,
    go_float,
    go_int,
    go_map,
    read_fields,
    variable_field,
    variable_of,
)

__all__ = ["HONOURED", "IGNORED", "EnvoySettings", "RedisSettings", "unhonoured"]


def _algorithm(text: str) -> str:
    """``RATELIMIT_ALGORITHM``: one of our algorithms."""
    try:
        return named(text).name
    except ConfigurationError:
        raise Unreadable(f"one of {', '.join(ALGORITHMS)} (unset: its fixed windows)") from None


def _lease(text: str) -> float:
    """``RATELIMIT_LEASE``: the lease of our algorithms' limiter (seconds, 0: off)."""
    seconds = lease_seconds(text)
    if seconds is None:
        raise Unreadable(LEASE_EXPECTED)
    return seconds


_PERSECOND_URL = "/var/run/nutcracker/ratelimitpersecond.sock"
"""``REDIS_PERSECOND_URL``'s default."""


@dataclass(frozen=True)
class RedisSettings:
    """One Redis the service counts on, as envoyproxy/ratelimit connects to it.

    ``type`` is ``SINGLE``, ``CLUSTER`` or ``SENTINEL`` (given in any case, kept upper);
    ``socket_type`` (``unix`` or ``tcp``) matters to ``SINGLE`` alone, as in Go (cluster and
    sentinel nodes are reached over TCP). ``url`` is, for ``SINGLE``, a socket's path (unix)
    or ``host:port`` (tcp), or a whole ``redis://``, ``rediss://`` or ``unix://`` URL (its
    credentials win over ``auth``); for ``CLUSTER`` a comma list of ``host:port``; for
    ``SENTINEL`` the master's name, then the sentinels' ``host:port``. ``auth`` and
    ``sentinel_auth`` (the sentinels' own) are ``password`` or ``user:password``, split as
    Go's ``createDialer`` splits them. ``timeout``: seconds to connect and for each read; 0
    or less: none, as in Go. At most ``pool_size`` connections: a command waits for a free
    one (Go's ``WAIT``; ``CREATE`` and ``ERROR`` are refused as Go v4 refuses them).
    ``prefix`` names the variables in messages (``REDIS`` or ``REDIS_PERSECOND``); the TLS
    files are ``REDIS_TLS_*`` for both, as in Go. :meth:`check` refuses what cannot connect.

    Example::

        settings = RedisSettings(socket_type="tcp", url="127.0.0.1:6379", pool_size=20)
        client = redis_client(settings)
    """

    socket_type: str = variable_field("_SOCKET_TYPE", "unix")
    type: str = variable_field("_TYPE", "SINGLE")
    url: str = variable_field("_URL", "/var/run/nutcracker/ratelimit.sock")
    pool_size: int = variable_field("_POOL_SIZE", 10, go_int)
    auth: str = variable_field("_AUTH", "")
    tls: bool = variable_field("_TLS", False, go_bool)
    tls_client_cert: str = variable_field("REDIS_TLS_CLIENT_CERT", "")
    tls_client_key: str = variable_field("REDIS_TLS_CLIENT_KEY", "")
    tls_cacert: str = variable_field("REDIS_TLS_CACERT", "")
    tls_skip_hostname_verification: bool = variable_field(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", False, go_bool
    )
    timeout: float = variable_field("_TIMEOUT", 10.0, go_duration)
    sentinel_auth: str = variable_field("_SENTINEL_AUTH", "")
    pool_on_empty_behavior: str = variable_field("_POOL_ON_EMPTY_BEHAVIOR", "WAIT")
    prefix: str = "REDIS"

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", self.type.upper())
        object.__setattr__(self, "socket_type", self.socket_type.lower())

    def check(self) -> None:
        """Refuses, naming the variable, what Go refuses when it connects (and TLS over a
        unix socket). :meth:`EnvoySettings.from_env` checks the connections in use, as Go
        does; :func:`~ratelimit.backends.redis.envoy.connection.redis_client` checks the one
        it makes."""
        if self.type not in ("SINGLE", "CLUSTER", "SENTINEL"):
            self._refuse("TYPE", self.type, "single, cluster or sentinel (any case)")
        if self.socket_type not in ("unix", "tcp") and self.type == "SINGLE":
            self._refuse("SOCKET_TYPE", self.socket_type, "tcp or unix")
        if self.pool_size < 1:
            self._refuse("POOL_SIZE", str(self.pool_size), "a whole number, at least 1")
        behavior = self.pool_on_empty_behavior.upper()
        if behavior in ("CREATE", "ERROR"):
            instead = {"CREATE": "creating overflow connections", "ERROR": "failing fast"}
            self._refuse(
                "POOL_ON_EMPTY_BEHAVIOR",
                self.pool_on_empty_behavior,
                f"{behavior} is not supported, as in Go's radix v4: the pool waits instead of "
                f"{instead[behavior]}; remove it or set WAIT (and consider a larger "
                f"{self.prefix}_POOL_SIZE)",
            )
        endpoints(self)  # the URL's form, for this type
        unix = scheme_of(self.url) == "unix" or (
            self.type == "SINGLE" and self.socket_type == "unix" and not scheme_of(self.url)
        )
        if self.tls and unix:
            self._refuse("TLS", "true", f"TLS is over TCP, and {self.prefix}_URL is a socket")

    def _refuse(self, suffix: str, value: str, expected: str) -> NoReturn:
        raise ConfigurationError(f"{self.prefix}_{suffix}={value!r}: {expected}")


_LOG_LEVELS = {"panic": 50, "fatal": 50, "error": 40, "warn": 30, "warning": 30}
_LOG_LEVELS |= {"info": 20, "debug": 10, "trace": 5}


@dataclass(frozen=True)
class EnvoySettings:
    """envoyproxy/ratelimit's settings, with its defaults; :meth:`from_env` reads them.

    Each field says its variable. Times are in seconds. ``backend_type`` is ``redis``, or
    our own ``memory`` (counted in this one process: for trying the service out).
    ``redis`` counts every limit, or all but the per-second ones when ``redis_persecond``
    is set (those go to ``persecond``). ``log_level`` is kept upper-case
    (:attr:`logging_level` is the :mod:`logging` level); ``log_format`` is ``json`` or
    ``text`` (Go's rule: any other value is text). Go keeps ``near_limit_ratio`` as a
    float32. ``expiration_jitter_max_seconds`` of 0 or less: no jitter, as in Go.

    Example::

        settings = EnvoySettings.from_env({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379"})
        assert settings.config_directory == "/srv/runtime_data/current/config"
    """

    host: str = variable_field("HOST", "0.0.0.0")
    port: int = variable_field("PORT", 8080, go_int)
    debug_host: str = variable_field("DEBUG_HOST", "0.0.0.0")
    debug_port: int = variable_field("DEBUG_PORT", 6070, go_int)
    grpc_host: str = variable_field("GRPC_HOST", "0.0.0.0")
    grpc_port: int = variable_field("GRPC_PORT", 8081, go_int)
    grpc_uds: str = variable_field("GRPC_UDS", "")
    grpc_server_use_tls: bool = variable_field("GRPC_SERVER_USE_TLS", False, go_bool)
    grpc_server_tls_cert: str = variable_field("GRPC_SERVER_TLS_CERT", "")
    grpc_server_tls_key: str = variable_field("GRPC_SERVER_TLS_KEY", "")
    grpc_client_tls_cacert: str = variable_field("GRPC_CLIENT_TLS_CACERT", "")
    log_level: str = variable_field("LOG_LEVEL", "WARN")
    log_format: str = variable_field("LOG_FORMAT", "text")
    config_type: str = variable_field("CONFIG_TYPE", "FILE")
    force_start_without_initial_config: bool = variable_field(
        "FORCE_START_WITHOUT_INITIAL_CONFIG", False, go_bool
    )
    use_statsd: bool = variable_field("USE_STATSD", True, go_bool)
    statsd_host: str = variable_field("STATSD_HOST", "localhost")
    statsd_port: int = variable_field("STATSD_PORT", 8125, go_int)
    statsd_protocol: str = variable_field("STATSD_PROTOCOL", "tcp")
    """gostats' own variable (not in ``settings.go``): ``tcp``, or ``udp``."""
    algorithm: str | None = variable_field("RATELIMIT_ALGORITHM", None, _algorithm)
    """Ours (not in ``settings.go``): every limit decided by this algorithm of ours
    (:mod:`~ratelimit.service.envoy_service.our_answers`); ``None``: its fixed windows."""
    lease: float = variable_field("RATELIMIT_LEASE", 0.0, _lease)
    """Ours (not in ``settings.go``): the ``lease`` of our algorithms' limiter, seconds
    (``0.05``, ``50ms``; 0: off): each process answers a hot descriptor from a slice of its
    limit taken from the store in one decision (:mod:`ratelimit.backends.leases`). With
    ``RATELIMIT_ALGORITHM`` only: its fixed windows lease nothing, so it is refused without."""
    extra_tags: dict[str, str] = field(
        default_factory=dict, metadata={"variable": "EXTRA_TAGS", "parse": go_map}
    )
    stats_flush_interval: float = variable_field("STATS_FLUSH_INTERVAL", 10.0, go_duration)
    disable_stats: bool = variable_field("DISABLE_STATS", False, go_bool)
    use_prometheus: bool = variable_field("USE_PROMETHEUS", False, go_bool)
    prometheus_addr: str = variable_field("PROMETHEUS_ADDR", ":9090")
    prometheus_path: str = variable_field("PROMETHEUS_PATH", "/metrics")
    prometheus_mapper_yaml: str = variable_field("PROMETHEUS_MAPPER_YAML", "")
    prometheus_response_time_as_milliseconds: bool = variable_field(
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", False, go_bool
    )
    runtime_root: str = variable_field("RUNTIME_ROOT", "/srv/runtime_data/current")
    runtime_subdirectory: str = variable_field("RUNTIME_SUBDIRECTORY", "")
    runtime_appdirectory: str = variable_field("RUNTIME_APPDIRECTORY", "config")
    runtime_ignore_dotfiles: bool = variable_field("RUNTIME_IGNOREDOTFILES", False, go_bool)
    runtime_watch_root: bool = variable_field("RUNTIME_WATCH_ROOT", True, go_bool)
    expiration_jitter_max_seconds: int = variable_field(
        "EXPIRATION_JITTER_MAX_SECONDS", 300, go_int
    )
    local_cache_size_in_bytes: int = variable_field("LOCAL_CACHE_SIZE_IN_BYTES", 0, go_int)
    near_limit_ratio: float = variable_field("NEAR_LIMIT_RATIO", 0.8, go_float)
    cache_key_prefix: str = variable_field("CACHE_KEY_PREFIX", "")
    backend_type: str = variable_field("BACKEND_TYPE", "redis")
    stop_cache_key_increment_when_overlimit: bool = variable_field(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", False, go_bool
    )
    response_headers_enabled: bool = variable_field(
        "LIMIT_RESPONSE_HEADERS_ENABLED", False, go_bool
    )
    header_limit: str = variable_field("LIMIT_LIMIT_HEADER", "RateLimit-Limit")
    header_remaining: str = variable_field("LIMIT_REMAINING_HEADER", "RateLimit-Remaining")
    header_reset: str = variable_field("LIMIT_RESET_HEADER", "RateLimit-Reset")
    healthy_with_at_least_one_config_loaded: bool = variable_field(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", False, go_bool
    )
    redis: RedisSettings = field(default_factory=RedisSettings)
    redis_persecond: bool = variable_field("REDIS_PERSECOND", False, go_bool)
    persecond: RedisSettings = field(
        default_factory=lambda: RedisSettings(url=_PERSECOND_URL, prefix="REDIS_PERSECOND")
    )
    shadow_mode: bool = variable_field("SHADOW_MODE", False, go_bool)
    quota_mode: bool = variable_field("QUOTA_MODE", False, go_bool)
    response_dynamic_metadata: bool = variable_field("RESPONSE_DYNAMIC_METADATA", False, go_bool)
    merge_domain_config: bool = variable_field("MERGE_DOMAIN_CONFIG", False, go_bool)

    def __post_init__(self) -> None:
        """Refuses what Go refuses at start, or what this service cannot do, naming the
        variable."""
        ports = [("PORT", self.port, 0), ("DEBUG_PORT", self.debug_port, 0)]
        ports += [("GRPC_PORT", self.grpc_port, 0), ("STATSD_PORT", self.statsd_port, 1)]
        for name, port, lowest in ports:  # 0 to listen: any free port
            if not lowest <= port <= 65535:
                raise ConfigurationError(f"{name}='{port}': a port, {lowest} to 65535")
        if address_of(self.prometheus_addr, lowest=0) is None:
            raise ConfigurationError(f"PROMETHEUS_ADDR={self.prometheus_addr!r}: host:port")
        if self.log_level.lower() not in _LOG_LEVELS:
            raise ConfigurationError(
                f"LOG_LEVEL={self.log_level!r}: panic, fatal, error, warn, info, debug or "
                "trace (any case)"
            )
        object.__setattr__(self, "log_level", self.log_level.upper())
        json = self.log_format.lower() == "json"
        object.__setattr__(self, "log_format", "json" if json else "text")
        self._check_choices()
        if self.lease and not self.algorithm:
            raise ConfigurationError(
                f"RATELIMIT_LEASE='{self.lease:g}': leases are for our algorithms "
                "(RATELIMIT_ALGORITHM=sliding-log, sliding-window or fixed-window); with "
                "RATELIMIT_ALGORITHM unset, its own fixed windows count request by request, "
                "as envoyproxy/ratelimit does, and lease nothing: set RATELIMIT_ALGORITHM, or "
                "unset RATELIMIT_LEASE"
            )
        if self.stats_flush_interval <= 0:
            raise ConfigurationError(
                f"STATS_FLUSH_INTERVAL='{self.stats_flush_interval}s': a duration above 0"
            )
        if not 0 <= self.near_limit_ratio <= 1:
            raise ConfigurationError(f"NEAR_LIMIT_RATIO='{self.near_limit_ratio}': 0 to 1")
        if self.local_cache_size_in_bytes < 0:
            raise ConfigurationError(
                f"LOCAL_CACHE_SIZE_IN_BYTES='{self.local_cache_size_in_bytes}': bytes, 0 for "
                "no local cache"
            )
        if self.use_statsd and self.use_prometheus and not self.disable_stats:
            raise ConfigurationError(
                "USE_STATSD=true and USE_PROMETHEUS=true: one stats sink at a time, as in "
                "envoyproxy/ratelimit (USE_STATSD is true by default: set USE_STATSD=false "
                "to serve Prometheus)"
            )
        if self.grpc_server_use_tls and not self.grpc_server_tls_cert:
            raise ConfigurationError("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT")
        if self.grpc_server_use_tls and not self.grpc_server_tls_key:
            raise ConfigurationError("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_KEY")

    def _check_choices(self) -> None:
        """What configures the rules and counts them: files, and Redis (or memory)."""
        if self.config_type == "GRPC_XDS_SOTW":
            raise ConfigurationError(
                "CONFIG_TYPE='GRPC_XDS_SOTW': configuration over xDS is not supported here; "
                "use CONFIG_TYPE=FILE, with the YAML files in RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/"
                "RUNTIME_APPDIRECTORY"
            )
        if self.config_type != "FILE":
            raise ConfigurationError(f"CONFIG_TYPE={self.config_type!r}: FILE")
        if self.backend_type == "memcache":
            raise ConfigurationError(
                "BACKEND_TYPE='memcache': this service counts on Redis (BACKEND_TYPE=redis), "
                "or in one process with BACKEND_TYPE=memory; memcache is not supported"
            )
        if self.backend_type not in ("redis", "memory"):
            raise ConfigurationError(
                f"BACKEND_TYPE={self.backend_type!r}: redis (or memory: counted in this one "
                "process, for trying the service out)"
            )

    @property
    def config_directory(self) -> str:
        """The directory whose YAML files hold the limits (Go reads this one in both
        ``RUNTIME_WATCH_ROOT`` modes; they differ in what they watch)."""
        return os.path.join(self.runtime_root, self.runtime_subdirectory, self.runtime_appdirectory)

    @property
    def logging_level(self) -> int:
        """``log_level`` as a :mod:`logging` level (trace: 5; panic and fatal: critical)."""
        return _LOG_LEVELS[self.log_level.lower()]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EnvoySettings:
        """The settings ``env`` gives, read as Go reads them (an empty variable is unset);
        ``ConfigurationError`` naming the variable, its value and what is expected. The
        Redis connections in use are checked (:meth:`RedisSettings.check`), and the files Go
        reads at start (TLS) must be readable."""
        if san := env.get("GRPC_CLIENT_TLS_SAN", ""):
            raise ConfigurationError(
                f"GRPC_CLIENT_TLS_SAN={san!r}: not supported here: a client's certificate is "
                "checked against GRPC_CLIENT_TLS_CACERT only, so any certificate that CA signed "
                "would be let in (unset it, or give the service a CA of its own clients)"
            )
        persecond = {"url": _PERSECOND_URL, **read_fields(env, RedisSettings, "REDIS_PERSECOND")}
        settings = cls(
            **read_fields(env, cls),
            redis=RedisSettings(**read_fields(env, RedisSettings, "REDIS"), prefix="REDIS"),
            persecond=RedisSettings(**persecond, prefix="REDIS_PERSECOND"),
        )
        if settings.statsd_protocol not in ("tcp", "tcp4", "tcp6", "udp", "udp4", "udp6"):
            raise ConfigurationError(
                f"STATSD_PROTOCOL={settings.statsd_protocol!r}: tcp or udp (tcp4, tcp6, udp4 "
                "and udp6 keep to one address family)"
            )
        if settings.backend_type == "redis":
            settings.redis.check()
            if settings.redis_persecond:
                settings.persecond.check()
        redis, files = settings.redis, {}
        if redis.tls or settings.persecond.tls:  # Go loads them for either
            files["REDIS_TLS_CACERT"] = redis.tls_cacert
            if redis.tls_client_cert and redis.tls_client_key:  # one alone: none, as in Go
                files["REDIS_TLS_CLIENT_CERT"] = redis.tls_client_cert
                files["REDIS_TLS_CLIENT_KEY"] = redis.tls_client_key
        if settings.grpc_server_use_tls:
            files["GRPC_SERVER_TLS_CERT"] = settings.grpc_server_tls_cert
            files["GRPC_SERVER_TLS_KEY"] = settings.grpc_server_tls_key
            files["GRPC_CLIENT_TLS_CACERT"] = settings.grpc_client_tls_cacert
        for name, path in files.items():
            try:
                with open(path or os.devnull, "rb"):
                    pass
            except OSError as exc:
                raise ConfigurationError(f"{name}={path!r}: {exc.strerror}") from None
        return settings


def _variables(kind: type[Any], prefix: str = "", shared: bool = True) -> tuple[str, ...]:
    """The variables ``kind``'s fields are read from (``shared=False``: prefixed ones only)."""
    return tuple(
        variable_of(item, prefix)
        for item in fields(kind)
        if "variable" in item.metadata and (shared or item.metadata["variable"].startswith("_"))
    )


GOSTATS = ("STATSD_PROTOCOL",)
"""The variables of the stats library its service is built with (gostats) that it honours."""
OURS = ("RATELIMIT_ALGORITHM", "RATELIMIT_LEASE")
"""The variables of ours that ``serve --envoy`` reads besides its service's."""
HONOURED: tuple[str, ...] = (
    _variables(EnvoySettings)
    + _variables(RedisSettings, "REDIS")
    + _variables(RedisSettings, "REDIS_PERSECOND", shared=False)
)
"""Go's variables this service reads into :class:`EnvoySettings` (and acts on)."""

_IGNORED_DEFAULTS: dict[str, tuple[Parser, str]] = {
    "GRPC_MAX_CONNECTION_AGE": (go_duration, "24h"),
    "GRPC_MAX_CONNECTION_AGE_GRACE": (go_duration, "1h"),
    "GRPC_CLIENT_TLS_SAN": (as_text, ""),
    "CONFIG_GRPC_XDS_NODE_ID": (as_text, "default"),
    "CONFIG_GRPC_XDS_NODE_METADATA": (as_text, ""),
    "CONFIG_GRPC_XDS_SERVER_URL": (as_text, "localhost:18000"),
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": (go_duration, "3s"),
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": (as_text, ""),
    "CONFIG_GRPC_XDS_SERVER_USE_TLS": (go_bool, "false"),
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": (as_text, ""),
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": (as_text, ""),
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": (as_text, ""),
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN": (as_text, ""),
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": (go_duration, "10s"),
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL": (go_duration, "60s"),
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": (go_float, "0.5"),
    "XDS_CLIENT_BACKOFF_JITTER": (go_bool, "true"),
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": (go_int, ""),
    "USE_DOG_STATSD": (go_bool, "false"),
    "USE_DOG_STATSD_MOGRIFIERS": (as_text, ""),
    "REDIS_PIPELINE_WINDOW": (go_duration, "0"),
    "REDIS_PIPELINE_LIMIT": (go_int, "0"),
    "REDIS_CLUSTER_PIPELINE_PARALLELISM": (go_int, "1"),
    "REDIS_PERSECOND_PIPELINE_WINDOW": (go_duration, "0"),
    "REDIS_PERSECOND_PIPELINE_LIMIT": (go_int, "0"),
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": (go_int, "1"),
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": (go_bool, "false"),
    "REDIS_STARTUP_INITIAL_INTERVAL": (go_duration, "1s"),
    "REDIS_STARTUP_MAX_INTERVAL": (go_duration, "30s"),
    "REDIS_STARTUP_MAX_ELAPSED_TIME": (go_duration, "0"),
    "MEMCACHE_HOST_PORT": (as_text, ""),
    "MEMCACHE_MAX_IDLE_CONNS": (go_int, "2"),
    "MEMCACHE_SRV": (as_text, ""),
    "MEMCACHE_SRV_REFRESH": (go_duration, "0"),
    "MEMCACHE_TLS": (go_bool, "false"),
    "MEMCACHE_TLS_CLIENT_CERT": (as_text, ""),
    "MEMCACHE_TLS_CLIENT_KEY": (as_text, ""),
    "MEMCACHE_TLS_CACERT": (as_text, ""),
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": (go_bool, "false"),
    "TRACING_ENABLED": (go_bool, "false"),
    "TRACING_SERVICE_NAME": (as_text, "RateLimit"),
    "TRACING_SERVICE_NAMESPACE": (as_text, ""),
    "TRACING_SERVICE_INSTANCE_ID": (as_text, ""),
    "TRACING_EXPORTER_PROTOCOL": (as_text, "http"),
    "TRACING_SAMPLING_RATE": (go_float, "1"),
}
"""Each variable this service ignores, with Go's parser and default: set to its default, it
changes nothing in Go either, and is not reported."""

IGNORED: tuple[str, ...] = tuple(_IGNORED_DEFAULTS)
"""Go's variables this service does not act on: gRPC connection ages; the client
certificate's SAN check (``GRPC_CLIENT_TLS_SAN``, refused when set: a client certificate is
checked against ``GRPC_CLIENT_TLS_CACERT`` alone); configuration over xDS
(``CONFIG_TYPE=GRPC_XDS_SOTW`` is refused); DogStatsD; radix's pipelining, Redis health
and start-up retries; memcache (``BACKEND_TYPE=memcache`` is refused); tracing."""


def unhonoured(env: Mapping[str, str]) -> list[str]:
    """The variables of :data:`IGNORED` that ``env`` sets (not empty, not Go's default), in
    the order of Go's ``Settings``: what the caller's one warning at start names."""
    found = []
    for name, (parse, default) in _IGNORED_DEFAULTS.items():
        text = env.get(name, "")
        if text == "" or text == default:
            continue
        try:
            if default and parse(text) == parse(default):
                continue
        except Unreadable:
            pass
        found.append(name)
    return found
