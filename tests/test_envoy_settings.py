"""envoyproxy/ratelimit's environment variables (``ratelimit serve --envoy``): each read as Go
reads it, with Go's default, a bad value named with what is expected; every variable of Go's
``settings.go`` honoured or ignored; and the Redis clients the settings make, on real
redis-servers started here."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import tempfile
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    BlockingConnectionPool,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import AuthenticationError

from ratelimit.backends.redis.client import close_client
from ratelimit.backends.redis.envoy.connection import redis_client
from ratelimit.errors import ConfigurationError
from ratelimit.service.envoy_service.settings import (
    GOSTATS,
    HONOURED,
    IGNORED,
    OURS,
    EnvoySettings,
    RedisSettings,
    unhonoured,
)
from tests.redis_server import RedisCluster as ClusterServers
from tests.redis_server import RedisServer, SentinelSet

pytestmark = pytest.mark.timeout(30)

MIRROR = Path("/work/.mirror/envoyproxy+ratelimit/repo")
"""A git directory of envoyproxy/ratelimit, where there is one; the tests reading it skip
without it."""


def go_variables() -> dict[str, str]:
    """Every ``envconfig:"NAME"`` of Go's ``settings.go``, with its ``default:"..."`` text."""
    try:
        text = subprocess.run(
            ["git", "-C", str(MIRROR), "show", "HEAD:src/settings/settings.go"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"no envoyproxy/ratelimit mirror at {MIRROR}")
    tags = re.finditer(r'envconfig:"([A-Z0-9_]+)"(?:\s+default:"([^"]*)")?', text)
    return {tag[1]: tag[2] or "" for tag in tags}


# --- every variable: honoured or ignored, with Go's defaults ---


def test_every_go_variable_is_honoured_or_ignored() -> None:
    go = go_variables()
    assert len(set(HONOURED)) == len(HONOURED)
    assert not set(HONOURED) & set(IGNORED)
    assert set(HONOURED) | set(IGNORED) == set(go) | set(GOSTATS) | set(OURS)


def test_go_defaults_are_ours() -> None:
    """A variable set to Go's default reads as unset; an ignored one so set is not reported
    (it changes nothing in Go either)."""
    unset = EnvoySettings.from_env({})
    for name, default in go_variables().items():
        if name in HONOURED and default:
            assert EnvoySettings.from_env({name: default}) == unset, name
        if name in IGNORED:
            assert unhonoured({name: default}) == [], name


DEFAULTS: dict[str, object] = {
    "host": "0.0.0.0",
    "port": 8080,
    "debug_host": "0.0.0.0",
    "debug_port": 6070,
    "grpc_host": "0.0.0.0",
    "grpc_port": 8081,
    "grpc_uds": "",
    "grpc_server_use_tls": False,
    "log_level": "WARN",
    "log_format": "text",
    "config_type": "FILE",
    "force_start_without_initial_config": False,
    "use_statsd": True,
    "statsd_host": "localhost",
    "statsd_port": 8125,
    "extra_tags": {},
    "stats_flush_interval": 10.0,
    "disable_stats": False,
    "use_prometheus": False,
    "prometheus_addr": ":9090",
    "prometheus_path": "/metrics",
    "prometheus_mapper_yaml": "",
    "runtime_root": "/srv/runtime_data/current",
    "runtime_subdirectory": "",
    "runtime_appdirectory": "config",
    "runtime_ignore_dotfiles": False,
    "runtime_watch_root": True,
    "expiration_jitter_max_seconds": 300,
    "local_cache_size_in_bytes": 0,
    "near_limit_ratio": 0.8,
    "cache_key_prefix": "",
    "backend_type": "redis",
    "stop_cache_key_increment_when_overlimit": False,
    "response_headers_enabled": False,
    "header_limit": "RateLimit-Limit",
    "header_remaining": "RateLimit-Remaining",
    "header_reset": "RateLimit-Reset",
    "healthy_with_at_least_one_config_loaded": False,
    "redis_persecond": False,
    "shadow_mode": False,
    "quota_mode": False,
    "response_dynamic_metadata": False,
    "merge_domain_config": False,
    "redis.socket_type": "unix",
    "redis.type": "SINGLE",
    "redis.url": "/var/run/nutcracker/ratelimit.sock",
    "redis.pool_size": 10,
    "redis.auth": "",
    "redis.tls": False,
    "redis.timeout": 10.0,
    "redis.sentinel_auth": "",
    "redis.pool_on_empty_behavior": "WAIT",
    "persecond.socket_type": "unix",
    "persecond.type": "SINGLE",
    "persecond.url": "/var/run/nutcracker/ratelimitpersecond.sock",
    "persecond.pool_size": 10,
    "persecond.timeout": 10.0,
    "persecond.prefix": "REDIS_PERSECOND",
}


def test_the_defaults() -> None:
    settings = EnvoySettings.from_env({})
    assert settings == EnvoySettings()
    assert {path: attrgetter(path)(settings) for path in DEFAULTS} == DEFAULTS
    assert settings.config_directory == "/srv/runtime_data/current/config"
    assert settings.logging_level == 30
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]


def test_an_empty_variable_is_unset() -> None:
    assert EnvoySettings.from_env(dict.fromkeys(HONOURED, "")) == EnvoySettings()


# --- each honoured variable: a good value, a bad one ---

TCP = {"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.local:6379"}
PERSECOND = {"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp"}
PERSECOND |= {"REDIS_PERSECOND_URL": "ps:6379"}

GOOD: list[tuple[dict[str, str], str, object]] = [
    ({"HOST": "127.0.0.1"}, "host", "127.0.0.1"),
    ({"PORT": "9000"}, "port", 9000),
    ({"PORT": "0x1F90"}, "port", 8080),
    ({"DEBUG_HOST": "::1"}, "debug_host", "::1"),
    ({"DEBUG_PORT": "0"}, "debug_port", 0),
    ({"GRPC_UDS": "/run/rl.sock"}, "grpc_uds", "/run/rl.sock"),
    ({"GRPC_HOST": "10.0.0.1"}, "grpc_host", "10.0.0.1"),
    ({"GRPC_PORT": "65535"}, "grpc_port", 65535),
    ({"GRPC_SERVER_USE_TLS": "F"}, "grpc_server_use_tls", False),
    ({"GRPC_SERVER_TLS_CERT": "/tls/c.pem"}, "grpc_server_tls_cert", "/tls/c.pem"),
    ({"GRPC_SERVER_TLS_KEY": "/tls/k.pem"}, "grpc_server_tls_key", "/tls/k.pem"),
    ({"GRPC_CLIENT_TLS_CACERT": "/tls/ca.pem"}, "grpc_client_tls_cacert", "/tls/ca.pem"),
    ({"LOG_LEVEL": "debug"}, "log_level", "DEBUG"),
    ({"LOG_LEVEL": "Warning"}, "logging_level", 30),
    ({"LOG_LEVEL": "trace"}, "logging_level", 5),
    ({"LOG_FORMAT": "JSON"}, "log_format", "json"),
    ({"LOG_FORMAT": "logfmt"}, "log_format", "text"),  # Go: anything else is text
    ({"CONFIG_TYPE": "FILE"}, "config_type", "FILE"),
    ({"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"}, "force_start_without_initial_config", True),
    ({"USE_STATSD": "0"}, "use_statsd", False),
    ({"STATSD_HOST": "statsd"}, "statsd_host", "statsd"),
    ({"STATSD_PORT": "9125"}, "statsd_port", 9125),
    ({"STATSD_PROTOCOL": "udp"}, "statsd_protocol", "udp"),
    (
        {"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "true"},
        "prometheus_response_time_as_milliseconds",
        True,
    ),
    ({"RATELIMIT_ALGORITHM": "gcra"}, "algorithm", "gcra"),
    ({"RATELIMIT_ALGORITHM": "sliding-log", "RATELIMIT_LEASE": "0.05"}, "lease", 0.05),
    ({"RATELIMIT_ALGORITHM": "sliding-log", "RATELIMIT_LEASE": "50ms"}, "lease", 0.05),
    ({"EXTRA_TAGS": "a:1,b:2"}, "extra_tags", {"a": "1", "b": "2"}),
    ({"EXTRA_TAGS": "a: 1,a:2"}, "extra_tags", {"a": "2"}),  # kept as given, last wins
    ({"EXTRA_TAGS": "  "}, "extra_tags", {}),
    ({"STATS_FLUSH_INTERVAL": "1m30s"}, "stats_flush_interval", 90.0),
    ({"DISABLE_STATS": "T"}, "disable_stats", True),
    ({"USE_PROMETHEUS": "true", "USE_STATSD": "false"}, "use_prometheus", True),
    ({"USE_PROMETHEUS": "1", "DISABLE_STATS": "1"}, "use_prometheus", True),
    ({"PROMETHEUS_ADDR": "127.0.0.1:9102"}, "prometheus_addr", "127.0.0.1:9102"),
    ({"PROMETHEUS_PATH": "/m"}, "prometheus_path", "/m"),
    ({"PROMETHEUS_MAPPER_YAML": "/m.yaml"}, "prometheus_mapper_yaml", "/m.yaml"),
    ({"RUNTIME_ROOT": "/data"}, "config_directory", "/data/config"),
    ({"RUNTIME_SUBDIRECTORY": "ratelimit"}, "runtime_subdirectory", "ratelimit"),
    (
        {"RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "limits"},
        "config_directory",
        "/srv/runtime_data/current/ratelimit/limits",
    ),
    ({"RUNTIME_IGNOREDOTFILES": "1"}, "runtime_ignore_dotfiles", True),
    ({"RUNTIME_WATCH_ROOT": "false"}, "runtime_watch_root", False),
    ({"EXPIRATION_JITTER_MAX_SECONDS": "0"}, "expiration_jitter_max_seconds", 0),
    ({"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"}, "local_cache_size_in_bytes", 1 << 20),
    ({"NEAR_LIMIT_RATIO": "0.9"}, "near_limit_ratio", 0.9),
    ({"NEAR_LIMIT_RATIO": ".5"}, "near_limit_ratio", 0.5),
    ({"CACHE_KEY_PREFIX": "prod_"}, "cache_key_prefix", "prod_"),
    ({"BACKEND_TYPE": "memory"}, "backend_type", "memory"),
    (
        {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "True"},
        "stop_cache_key_increment_when_overlimit",
        True,
    ),
    ({"LIMIT_RESPONSE_HEADERS_ENABLED": "TRUE"}, "response_headers_enabled", True),
    ({"LIMIT_LIMIT_HEADER": "X-RateLimit-Limit"}, "header_limit", "X-RateLimit-Limit"),
    ({"LIMIT_REMAINING_HEADER": "X-Left"}, "header_remaining", "X-Left"),
    ({"LIMIT_RESET_HEADER": "X-Reset"}, "header_reset", "X-Reset"),
    (
        {"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "t"},
        "healthy_with_at_least_one_config_loaded",
        True,
    ),
    ({"SHADOW_MODE": "true"}, "shadow_mode", True),
    ({"QUOTA_MODE": "true"}, "quota_mode", True),
    ({"RESPONSE_DYNAMIC_METADATA": "true"}, "response_dynamic_metadata", True),
    ({"MERGE_DOMAIN_CONFIG": "true"}, "merge_domain_config", True),
    ({"REDIS_SOCKET_TYPE": "TCP", "REDIS_URL": "r:6379"}, "redis.socket_type", "tcp"),
    ({**TCP, "REDIS_URL": "[::1]:6380"}, "redis.url", "[::1]:6380"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "a:7000,b:7001"}, "redis.type", "CLUSTER"),
    ({"REDIS_TYPE": "Sentinel", "REDIS_URL": "mymaster,s:26379"}, "redis.type", "SENTINEL"),
    ({"REDIS_URL": "redis://:pw@r:6379/1"}, "redis.url", "redis://:pw@r:6379/1"),
    ({"REDIS_POOL_SIZE": "0x20"}, "redis.pool_size", 32),
    ({"REDIS_AUTH": "user:pa:ss"}, "redis.auth", "user:pa:ss"),
    ({**TCP, "REDIS_TLS": "true"}, "redis.tls", True),
    ({"REDIS_TLS_CLIENT_CERT": "/c.pem"}, "persecond.tls_client_cert", "/c.pem"),  # shared
    ({"REDIS_TLS_CLIENT_KEY": "/k.pem"}, "redis.tls_client_key", "/k.pem"),
    ({"REDIS_TLS_CACERT": "/ca.pem"}, "persecond.tls_cacert", "/ca.pem"),
    (
        {"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
        "persecond.tls_skip_hostname_verification",
        True,
    ),
    ({"REDIS_TIMEOUT": "300ms"}, "redis.timeout", 0.3),
    ({"REDIS_SENTINEL_AUTH": "s:pw"}, "redis.sentinel_auth", "s:pw"),
    ({"REDIS_POOL_ON_EMPTY_BEHAVIOR": "wait"}, "redis.pool_on_empty_behavior", "wait"),
    ({"REDIS_PERSECOND": "1"}, "redis_persecond", True),
    ({"REDIS_PERSECOND_SOCKET_TYPE": "tcp"}, "persecond.socket_type", "tcp"),
    ({"REDIS_PERSECOND_TYPE": "cluster"}, "persecond.type", "CLUSTER"),
    ({**PERSECOND, "REDIS_PERSECOND_URL": "[::1]:1"}, "persecond.url", "[::1]:1"),
    ({"REDIS_PERSECOND_POOL_SIZE": "3"}, "persecond.pool_size", 3),
    ({"REDIS_PERSECOND_AUTH": "pw"}, "persecond.auth", "pw"),
    ({**PERSECOND, "REDIS_PERSECOND_TLS": "true"}, "persecond.tls", True),
    ({"REDIS_PERSECOND_TIMEOUT": "1.5s"}, "persecond.timeout", 1.5),
    ({"REDIS_PERSECOND_SENTINEL_AUTH": "spw"}, "persecond.sentinel_auth", "spw"),
    (
        {"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": "WAIT"},
        "persecond.pool_on_empty_behavior",
        "WAIT",
    ),
]


@pytest.mark.parametrize(("env", "path", "expected"), GOOD)
def test_a_good_value(env: dict[str, str], path: str, expected: object) -> None:
    assert attrgetter(path)(EnvoySettings.from_env(env)) == expected


MISSING = "/nonexistent/file.pem"
BAD: list[tuple[dict[str, str], str]] = [
    ({"PORT": "http"}, "PORT='http': a whole number"),
    ({"PORT": "70000"}, "PORT='70000': a port, 0 to 65535"),
    ({"PORT": "-1"}, "PORT='-1': a port"),
    ({"DEBUG_PORT": "65536"}, "DEBUG_PORT='65536': a port"),
    ({"GRPC_PORT": "8081.0"}, "GRPC_PORT='8081.0': a whole number"),
    ({"STATSD_PORT": "0"}, "STATSD_PORT='0': a port, 1 to 65535"),
    ({"STATSD_PROTOCOL": "quic"}, "STATSD_PROTOCOL='quic': tcp or udp"),
    (
        {"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "maybe"},
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS='maybe'",
    ),
    ({"RATELIMIT_ALGORITHM": "leaky"}, "RATELIMIT_ALGORITHM='leaky': one of sliding-log"),
    (
        {"RATELIMIT_ALGORITHM": "sliding-log", "RATELIMIT_LEASE": "61"},
        "RATELIMIT_LEASE='61': a lease is seconds from 0 to 60",
    ),
    ({"RATELIMIT_LEASE": "0.05"}, "RATELIMIT_LEASE='0.05': leases are for our algorithms"),
    ({"GRPC_SERVER_USE_TLS": "yes"}, "GRPC_SERVER_USE_TLS='yes': true or false"),
    ({"GRPC_SERVER_USE_TLS": "true"}, "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT"),
    (
        {"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": MISSING},
        "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_KEY",
    ),
    (
        {"GRPC_SERVER_USE_TLS": "1", "GRPC_SERVER_TLS_CERT": MISSING, "GRPC_SERVER_TLS_KEY": "k"},
        f"GRPC_SERVER_TLS_CERT='{MISSING}': No such file or directory",
    ),
    ({"LOG_LEVEL": "verbose"}, "LOG_LEVEL='verbose': panic, fatal, error, warn, info"),
    ({"CONFIG_TYPE": "GRPC_XDS_SOTW"}, "configuration over xDS is not supported here"),
    ({"CONFIG_TYPE": "file"}, "CONFIG_TYPE='file': FILE"),  # Go's is case-sensitive
    ({"FORCE_START_WITHOUT_INITIAL_CONFIG": "2"}, "FORCE_START_WITHOUT_INITIAL_CONFIG='2'"),
    ({"USE_STATSD": "on"}, "USE_STATSD='on': true or false"),  # not Go's
    ({"EXTRA_TAGS": "a=1"}, "EXTRA_TAGS='a=1': key:value pairs separated by commas"),
    ({"EXTRA_TAGS": "a:1:2"}, "EXTRA_TAGS='a:1:2': key:value"),
    ({"EXTRA_TAGS": "a:1,"}, "EXTRA_TAGS='a:1,': key:value"),
    ({"STATS_FLUSH_INTERVAL": "10"}, "STATS_FLUSH_INTERVAL='10': a duration such as 10s"),
    ({"STATS_FLUSH_INTERVAL": "0s"}, "STATS_FLUSH_INTERVAL='0.0s': a duration above 0"),
    ({"DISABLE_STATS": "yes"}, "DISABLE_STATS='yes': true or false"),
    ({"USE_PROMETHEUS": "true"}, "USE_STATSD=true and USE_PROMETHEUS=true: one stats sink"),
    ({"USE_PROMETHEUS": "maybe"}, "USE_PROMETHEUS='maybe': true or false"),
    ({"PROMETHEUS_ADDR": "9090"}, "PROMETHEUS_ADDR='9090': host:port"),
    ({"PROMETHEUS_ADDR": ":99999"}, "PROMETHEUS_ADDR=':99999': host:port"),
    ({"RUNTIME_IGNOREDOTFILES": "no"}, "RUNTIME_IGNOREDOTFILES='no': true or false"),
    ({"RUNTIME_WATCH_ROOT": "y"}, "RUNTIME_WATCH_ROOT='y': true or false"),
    ({"EXPIRATION_JITTER_MAX_SECONDS": "5m"}, "EXPIRATION_JITTER_MAX_SECONDS='5m': a whole"),
    ({"LOCAL_CACHE_SIZE_IN_BYTES": "1MB"}, "LOCAL_CACHE_SIZE_IN_BYTES='1MB': a whole number"),
    ({"LOCAL_CACHE_SIZE_IN_BYTES": "-1"}, "LOCAL_CACHE_SIZE_IN_BYTES='-1': bytes, 0 for no"),
    ({"NEAR_LIMIT_RATIO": "1.5"}, "NEAR_LIMIT_RATIO='1.5': 0 to 1"),
    ({"NEAR_LIMIT_RATIO": "eighty"}, "NEAR_LIMIT_RATIO='eighty': a number"),
    ({"BACKEND_TYPE": "memcache"}, "BACKEND_TYPE='memcache': this service counts on Redis"),
    ({"BACKEND_TYPE": "Redis"}, "BACKEND_TYPE='Redis': redis (or memory"),
    ({"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "x"}, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
    ({"LIMIT_RESPONSE_HEADERS_ENABLED": "on"}, "LIMIT_RESPONSE_HEADERS_ENABLED='on': true"),
    ({"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "ok"}, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG"),
    ({"SHADOW_MODE": "shadow"}, "SHADOW_MODE='shadow': true or false"),
    ({"QUOTA_MODE": "x"}, "QUOTA_MODE='x': true or false"),
    ({"RESPONSE_DYNAMIC_METADATA": "x"}, "RESPONSE_DYNAMIC_METADATA='x': true or false"),
    ({"MERGE_DOMAIN_CONFIG": "x"}, "MERGE_DOMAIN_CONFIG='x': true or false"),
    ({"REDIS_SOCKET_TYPE": "udp"}, "REDIS_SOCKET_TYPE='udp': tcp or unix"),
    ({"REDIS_TYPE": "standalone"}, "REDIS_TYPE='STANDALONE': single, cluster or sentinel"),
    ({**TCP, "REDIS_URL": "localhost"}, "REDIS_URL='localhost': 'localhost' is not host:port"),
    ({**TCP, "REDIS_URL": "a:1,b:2"}, "REDIS_URL='a:1,b:2': one host:port"),
    ({**TCP, "REDIS_URL": "::1:6379"}, "is not host:port"),  # Go: brackets, [::1]:6379
    ({"REDIS_URL": "mongodb://m:1"}, "REDIS_URL='mongodb://m:1': a URL is redis://"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b"}, "REDIS_URL='a:1,b': 'b' is not host:port"),
    (
        {"REDIS_TYPE": "sentinel", "REDIS_URL": "s:26379"},
        "REDIS_URL='s:26379': Expected master name and a list of urls for the sentinels, in "
        "the format: <redis master name>,<sentinel1>,...,<sentineln>",
    ),
    ({"REDIS_POOL_SIZE": "ten"}, "REDIS_POOL_SIZE='ten': a whole number"),
    ({"REDIS_POOL_SIZE": "0"}, "REDIS_POOL_SIZE='0': a whole number, at least 1"),
    ({"REDIS_TLS": "yes"}, "REDIS_TLS='yes': true or false"),
    ({"REDIS_TLS": "true"}, "REDIS_TLS='true': TLS is over TCP, and REDIS_URL is a socket"),
    ({"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "no"}, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"),
    (
        {**TCP, "REDIS_TLS": "true", "REDIS_TLS_CACERT": MISSING},
        f"REDIS_TLS_CACERT='{MISSING}': No such file or directory",
    ),
    (
        {**TCP, "REDIS_TLS": "1", "REDIS_TLS_CLIENT_CERT": MISSING, "REDIS_TLS_CLIENT_KEY": "k"},
        f"REDIS_TLS_CLIENT_CERT='{MISSING}': No such file",
    ),
    (
        {**PERSECOND, "REDIS_PERSECOND_TLS": "true"}
        | {"REDIS_TLS_CLIENT_CERT": __file__, "REDIS_TLS_CLIENT_KEY": MISSING},
        f"REDIS_TLS_CLIENT_KEY='{MISSING}': No such file",  # loaded for either, as Go
    ),
    ({"REDIS_TIMEOUT": "10"}, "REDIS_TIMEOUT='10': a duration such as 10s"),
    ({"REDIS_POOL_ON_EMPTY_BEHAVIOR": "CREATE"}, "CREATE is not supported, as in Go's radix v4"),
    ({"REDIS_POOL_ON_EMPTY_BEHAVIOR": "error"}, "ERROR is not supported, as in Go's radix v4"),
    ({"REDIS_PERSECOND": "yes"}, "REDIS_PERSECOND='yes': true or false"),
    (
        {**PERSECOND, "REDIS_PERSECOND_SOCKET_TYPE": "udp"},
        "REDIS_PERSECOND_SOCKET_TYPE='udp': tcp or unix",
    ),
    ({**PERSECOND, "REDIS_PERSECOND_TYPE": "ring"}, "REDIS_PERSECOND_TYPE='RING': single"),
    (
        {**PERSECOND, "REDIS_PERSECOND_TYPE": "sentinel", "REDIS_PERSECOND_URL": "m"},
        "REDIS_PERSECOND_URL='m': Expected master name",
    ),
    ({**PERSECOND, "REDIS_PERSECOND_URL": "ps"}, "REDIS_PERSECOND_URL='ps': 'ps' is not"),
    ({"REDIS_PERSECOND_POOL_SIZE": "x"}, "REDIS_PERSECOND_POOL_SIZE='x': a whole number"),
    ({"REDIS_PERSECOND_TLS": "x"}, "REDIS_PERSECOND_TLS='x': true or false"),
    (
        {"REDIS_PERSECOND": "1", "REDIS_PERSECOND_TLS": "1"},
        "REDIS_PERSECOND_TLS='true': TLS is over TCP",
    ),
    ({"REDIS_PERSECOND_TIMEOUT": "1"}, "REDIS_PERSECOND_TIMEOUT='1': a duration"),
    (
        {**PERSECOND, "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": "ERROR"},
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR='ERROR': ERROR is not supported",
    ),
]


@pytest.mark.parametrize(("env", "message"), BAD)
def test_a_bad_value_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        EnvoySettings.from_env(env)


FREE_TEXT = {
    "HOST",
    "LOG_FORMAT",
    "DEBUG_HOST",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "STATSD_HOST",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "CACHE_KEY_PREFIX",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "REDIS_AUTH",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
}
"""The honoured variables any text is good for (no bad value to test)."""


def test_every_honoured_variable_has_its_tests() -> None:
    assert set(HONOURED) <= {name for env, _, _ in GOOD for name in env}
    assert set(HONOURED) - FREE_TEXT <= {name for env, _ in BAD for name in env}


# --- Go's syntax: whole numbers, booleans, durations ---


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10", 10),
        ("+5", 5),
        ("-5", -5),
        ("0", 0),
        ("0x10", 16),
        ("0X1f", 31),
        ("0o17", 15),
        ("017", 15),  # a leading 0 is octal, as in Go
        ("0b101", 5),
        ("1_000", 1000),
        ("0x_ff", 255),
        ("9223372036854775807", (1 << 63) - 1),
    ],
)
def test_whole_numbers_as_go_parses_them(text: str, value: int) -> None:
    settings = EnvoySettings.from_env({"EXPIRATION_JITTER_MAX_SECONDS": text})
    assert settings.expiration_jitter_max_seconds == value


@pytest.mark.parametrize(
    "text",
    ["ten", "08", "1e3", " 10", "10 ", "0x", "1__0", "_1", "1_", "1.0", "٣", "9223372036854775808"],
)
def test_not_whole_numbers(text: str) -> None:
    with pytest.raises(ConfigurationError, match="EXPIRATION_JITTER_MAX_SECONDS=.*: a whole"):
        EnvoySettings.from_env({"EXPIRATION_JITTER_MAX_SECONDS": text})


@pytest.mark.parametrize(
    ("text", "value"),
    [(t, True) for t in ("1", "t", "T", "TRUE", "true", "True")]
    + [(f, False) for f in ("0", "f", "F", "FALSE", "false", "False")],
)
def test_booleans_as_go_parses_them(text: str, value: bool) -> None:
    assert EnvoySettings.from_env({"SHADOW_MODE": text}).shadow_mode is value


@pytest.mark.parametrize("text", ["yes", "on", "TRue", "2", " true", "y"])
def test_not_booleans(text: str) -> None:
    with pytest.raises(ConfigurationError, match="SHADOW_MODE=.*: true or false"):
        EnvoySettings.from_env({"SHADOW_MODE": text})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("-0", 0.0),
        ("10s", 10.0),
        ("300ms", 0.3),
        ("1.5h", 5400.0),
        ("1m30s", 90.0),
        (".5s", 0.5),
        ("5.s", 5.0),
        ("+2m", 120.0),
        ("-1s", -1.0),  # as Go: no timeout at all
        ("100ns", 1e-7),
        ("1us", 1e-6),
        ("1µs", 1e-6),
        ("1μs", 1e-6),
        ("1h2m3s4ms", 3723.004),
    ],
)
def test_durations_as_go_parses_them(text: str, seconds: float) -> None:
    assert EnvoySettings.from_env({"REDIS_TIMEOUT": text}).redis.timeout == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("10", "a number needs its unit"),
        ("1.5", "a number needs its unit"),
        ("1s2", "a number needs its unit"),
        ("1d", "unknown unit 'd'"),
        ("1 s", "unknown unit ' s'"),
        ("s", "a duration such as"),
        (".s", "a duration such as"),
        ("-", "a duration such as"),
        ("--1s", "a duration such as"),
        ("3000000h", "at most about 290 years"),
    ],
)
def test_not_durations(text: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(f"REDIS_TIMEOUT={text!r}: ")) as bad:
        EnvoySettings.from_env({"REDIS_TIMEOUT": text})
    assert why in str(bad.value)


# --- what this service ignores ---


def test_unhonoured_names_the_ignored_variables_set() -> None:
    env = {
        "TRACING_ENABLED": "true",
        "GRPC_MAX_CONNECTION_AGE": "1h",
        "MEMCACHE_HOST_PORT": "m:11211",
        "USE_DOG_STATSD": "False",  # Go's default, another spelling: changes nothing
        "REDIS_PIPELINE_WINDOW": "0s",
        "XDS_CLIENT_BACKOFF_JITTER": "1",
        "REDIS_STARTUP_MAX_INTERVAL": "",  # empty: unset
        "HOST": "127.0.0.1",  # honoured
    }
    assert unhonoured(env) == ["GRPC_MAX_CONNECTION_AGE", "MEMCACHE_HOST_PORT", "TRACING_ENABLED"]
    assert unhonoured({"GRPC_MAX_CONNECTION_AGE": "soon"}) == ["GRPC_MAX_CONNECTION_AGE"]
    assert unhonoured({"GRPC_CLIENT_TLS_SAN": "client.example"}) == ["GRPC_CLIENT_TLS_SAN"]
    assert unhonoured({}) == []


# --- the Redis clients ---


def options(client: aioredis.Redis) -> dict[str, Any]:
    """The keywords each connection of ``client``'s pool is opened with."""
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    return kwargs


def made(env: dict[str, str]) -> aioredis.Redis:
    client = redis_client(EnvoySettings.from_env(env).redis)
    assert isinstance(client, aioredis.Redis)
    return client


async def test_a_single_client_as_go_connects() -> None:
    client = made({**TCP, "REDIS_POOL_SIZE": "4", "REDIS_TIMEOUT": "2s", "REDIS_AUTH": "pw"})
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool)  # Go's WAIT
    assert (pool.connection_class, pool.max_connections) == (Connection, 4)
    assert {k: options(client)[k] for k in ("host", "port", "password")} == {
        "host": "redis.local",
        "port": 6379,
        "password": "pw",
    }
    assert options(client)["socket_timeout"] == options(client)["socket_connect_timeout"] == 2.0
    assert "username" not in options(client)
    assert options(made({**TCP, "REDIS_TIMEOUT": "0"}))["socket_timeout"] is None
    unix = made({})
    assert unix.connection_pool.connection_class is UnixDomainSocketConnection
    assert options(unix)["path"] == "/var/run/nutcracker/ratelimit.sock"
    for each in (client, unix):
        await each.aclose()


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        ("secret", {"password": "secret"}),
        ("user:secret", {"username": "user", "password": "secret"}),
        ("user:pa:ss", {"username": "user", "password": "pa:ss"}),  # Go cuts at the first :
        (":secret", {"username": None, "password": "secret"}),
    ],
)
async def test_auth_is_split_as_go_splits_it(auth: str, expected: dict[str, str]) -> None:
    client = made({**TCP, "REDIS_AUTH": auth})
    assert {key: options(client).get(key) for key in expected} == expected
    await client.aclose()


async def test_tls_as_go_configures_it(tmp_path: Path) -> None:
    files = {name: tmp_path / f"{name}.pem" for name in ("cert", "key", "ca")}
    for path in files.values():
        path.write_text("")
    env = {
        **TCP,
        "REDIS_TLS": "true",
        "REDIS_TLS_CLIENT_CERT": str(files["cert"]),
        "REDIS_TLS_CLIENT_KEY": str(files["key"]),
        "REDIS_TLS_CACERT": str(files["ca"]),
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true",
    }
    client = made(env)
    assert client.connection_pool.connection_class is SSLConnection
    tls = {key: value for key, value in options(client).items() if key.startswith("ssl_")}
    assert tls == {
        "ssl_certfile": str(files["cert"]),
        "ssl_keyfile": str(files["key"]),
        "ssl_ca_certs": str(files["ca"]),
        "ssl_cert_reqs": "required",  # the chain verified, the host name not
        "ssl_check_hostname": False,
    }
    alone = made({**env, "REDIS_TLS_CLIENT_KEY": ""})  # a certificate alone: none, as Go
    assert "ssl_certfile" not in options(alone)
    assert options(alone)["ssl_check_hostname"] is False
    whole = made({"REDIS_URL": "rediss://r:6380"})  # TLS by its scheme
    assert whole.connection_pool.connection_class is SSLConnection
    for each in (client, alone, whole):
        await each.aclose()


async def test_cluster_and_sentinel_clients_are_made_without_a_server() -> None:
    env = {"REDIS_TYPE": "cluster", "REDIS_URL": "a:7000, b:7001,[::1]:7002"}
    cluster = redis_client(EnvoySettings.from_env({**env, "REDIS_AUTH": "u:p"}).redis)
    assert isinstance(cluster, RedisCluster)
    nodes = cluster.nodes_manager.startup_nodes.values()
    assert [(node.host, node.port) for node in nodes] == [("a", 7000), ("b", 7001), ("::1", 7002)]
    assert (cluster.connection_kwargs["username"], cluster.connection_kwargs["password"]) == (
        "u",
        "p",
    )
    await cluster.aclose()
    sentinel_env = {"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26380"}
    client = made({**sentinel_env, "REDIS_SENTINEL_AUTH": "su:sp", "REDIS_POOL_SIZE": "3"})
    assert isinstance(client.connection_pool, BlockingConnectionPool)  # Go's WAIT
    pool: Any = client.connection_pool
    assert (pool.service_name, pool.max_connections) == ("mymaster", 3)
    sentinels = pool.sentinel_manager.sentinels
    found = [sentinel.connection_pool.connection_kwargs for sentinel in sentinels]
    assert [(s["host"], s["port"], s["username"], s["password"]) for s in found] == [
        ("s1", 26379, "su", "sp"),
        ("s2", 26380, "su", "sp"),
    ]
    await close_client(client)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"type": "ring"}, "REDIS_TYPE='RING'"),
        ({"pool_size": 0, "prefix": "REDIS_PERSECOND"}, "REDIS_PERSECOND_POOL_SIZE='0'"),
        ({"type": "cluster", "url": "a"}, "REDIS_URL='a': 'a' is not host:port"),
    ],
)
def test_redis_settings_made_directly_are_checked(changes: dict[str, Any], message: str) -> None:
    settings = RedisSettings(**changes)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        settings.check()
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        redis_client(settings)


def test_a_redis_not_in_use_is_not_checked() -> None:
    """As Go, which checks a connection when it makes it: the per-second one only with
    ``REDIS_PERSECOND``, neither with ``BACKEND_TYPE=memory``."""
    settings = EnvoySettings.from_env({"REDIS_PERSECOND_TYPE": "ring", "REDIS_PERSECOND_TLS": "1"})
    assert (settings.redis_persecond, settings.persecond.type) == (False, "RING")
    memory = EnvoySettings.from_env({"BACKEND_TYPE": "memory", "REDIS_POOL_SIZE": "0"})
    assert memory.redis.pool_size == 0


async def busy(client: aioredis.Redis | RedisCluster, calls: int) -> list[Any]:
    """``calls`` commands at once, each holding its connection for 0.1 s."""
    return await asyncio.gather(*(client.blpop([f"empty-{i}"], timeout=0.1) for i in range(calls)))


@pytest.mark.redis
async def test_tcp_with_both_auth_forms_waiting_for_a_free_connection() -> None:
    with RedisServer(args=("--requirepass", "s3cret")) as server:
        tcp = {"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": f"127.0.0.1:{server.port}"}
        for auth in ("s3cret", "default:s3cret"):
            client = made({**tcp, "REDIS_AUTH": auth, "REDIS_POOL_SIZE": "2"})
            assert await busy(client, 6) == [None] * 6  # 6 at once on 2 connections
            await client.aclose()
        wrong = made({**tcp, "REDIS_AUTH": "nope"})
        with pytest.raises(AuthenticationError):
            await wrong.ping()
        await wrong.aclose()
        whole = made({"REDIS_URL": f"redis://:s3cret@127.0.0.1:{server.port}/3"})
        await whole.set("k", "v")
        assert await whole.get("k") == b"v"
        assert options(whole)["db"] == 3
        await whole.aclose()


@pytest.mark.redis
async def test_a_unix_socket() -> None:
    with tempfile.TemporaryDirectory(prefix="rl-") as directory:
        path = f"{directory}/redis.sock"
        with RedisServer(args=("--unixsocket", path, "--unixsocketperm", "700")):
            client = made({"REDIS_URL": path})  # REDIS_SOCKET_TYPE's default: unix
            assert await client.ping() is True
            assert await busy(client, 12) == [None] * 12  # 10 connections, waited for
            await client.aclose()


@pytest.mark.redis
async def test_a_sentinel_master() -> None:
    with SentinelSet(password="s3cret") as servers:
        port = servers.sentinel.port
        env = {"REDIS_TYPE": "sentinel", "REDIS_URL": f"{servers.SERVICE},127.0.0.1:{port}"}
        client = made({**env, "REDIS_AUTH": "s3cret", "REDIS_POOL_SIZE": "1"})
        assert (await client.role())[0] == b"master"
        assert await busy(client, 3) == [None] * 3  # waits for its one connection
        await close_client(client)  # and the connections to the sentinels


@pytest.mark.redis
async def test_a_cluster() -> None:
    with ClusterServers(nodes=1) as servers:
        port = servers.servers[0].port
        env = {"REDIS_TYPE": "cluster", "REDIS_URL": f"127.0.0.1:{port}"}
        client = redis_client(EnvoySettings.from_env(env).redis)
        await client.set("{k}a", "1")
        assert await client.get("{k}a") == b"1"
        await client.aclose()


def test_statsd_protocol_is_gostats_own() -> None:
    """gostats reads ``STATSD_PROTOCOL`` (default tcp) beside the service's variables."""
    assert EnvoySettings.from_env({}).statsd_protocol == "tcp"
    assert EnvoySettings.from_env({"STATSD_PROTOCOL": "udp"}).statsd_protocol == "udp"
    with pytest.raises(ConfigurationError, match="STATSD_PROTOCOL='quic': tcp or udp"):
        EnvoySettings.from_env({"STATSD_PROTOCOL": "quic"})


def test_a_client_certificate_san_is_refused_not_ignored() -> None:
    """Ignoring it would let in any client the CA signed: the service does not start."""
    with pytest.raises(ConfigurationError, match="GRPC_CLIENT_TLS_SAN='client.example'"):
        EnvoySettings.from_env({"GRPC_CLIENT_TLS_SAN": "client.example"})


def test_the_migration_guide_names_every_variable() -> None:
    """docs/migrating-from-envoy-ratelimit.md says of each variable whether it is honoured,
    ignored or refused."""
    guide = Path(__file__).resolve().parent.parent / "docs" / "migrating-from-envoy-ratelimit.md"
    text = guide.read_text()
    missing = [name for name in (*HONOURED, *IGNORED) if f"`{name}`" not in text]
    assert not missing, missing
