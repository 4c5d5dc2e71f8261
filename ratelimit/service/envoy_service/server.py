"""``ratelimit serve --envoy``: envoyproxy/ratelimit's service, where its deployments
expect it.

- gRPC on ``GRPC_HOST:GRPC_PORT`` (or the Unix socket ``GRPC_UDS``; TLS with
  ``GRPC_SERVER_USE_TLS``): Envoy's ``ShouldRateLimit`` (:mod:`.answers`), gRPC health
  (``""`` and ``ratelimit``) and reflection;
- HTTP on ``HOST:PORT``: ``POST /json`` (a request in protobuf's JSON, its answer in JSON:
  ``429`` when ``OVER_LIMIT``, ``400`` for a request it cannot read or answer) and
  ``/healthcheck`` (``200 OK``, else ``500``);
- the debug listener on ``DEBUG_HOST:DEBUG_PORT``: ``/rlconfig`` (the limits loaded),
  ``/stats`` (every counter), ``/`` (what it serves);
- the configuration directory (``RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY``)
  looked at every second and reloaded when anything in it changed (a ``..data`` symlink
  swapped by Kubernetes included): a load that fails keeps the configuration in use, logs
  why and counts ``config_load_error``, as its service does;
- stats to statsd (``USE_STATSD``) every ``STATS_FLUSH_INTERVAL``, or on ``/metrics`` for
  Prometheus (``USE_PROMETHEUS``).

Health, as its service's (``ratelimit`` and ``/healthcheck``): ``SERVING`` once Redis
answered (asked again every second until it does) and, with
``HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED``, a configuration with a domain is loaded;
``NOT_SERVING`` from SIGTERM (or SIGHUP, as its runner) on, while calls in flight are
answered. ``""`` is always ``SERVING``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ratelimit.algorithms import named
from ratelimit.backends.memory import MemoryBackend
from ratelimit.backends.redis.envoy.connection import redis_client
from ratelimit.backends.redis.envoy.windows import RedisWindows
from ratelimit.core.extras import needs_extra
from ratelimit.errors import BackendError, ConfigurationError
from ratelimit.front.limiter import RateLimit
from ratelimit.service.config import address
from ratelimit.service.envoy_config import (
    ConfigFileError,
    EnvoyConfig,
    load_runtime,
    runtime_files,
)
from ratelimit.service.envoy_service.answers import (
    Answering,
    BadUnit,
    EnvoyAnswers,
    ServiceError,
)
from ratelimit.service.envoy_service.counting import Counts, MemoryCounts, OverLimitCache, Store
from ratelimit.service.envoy_service.http import Reply, serve_http, text
from ratelimit.service.envoy_service.our_answers import LimiterStore, OurAnswers
from ratelimit.service.envoy_service.settings import EnvoySettings
from ratelimit.service.envoy_service.stats import EnvoyStats
from ratelimit.service.tls import server_credentials

with needs_extra("server"):
    import grpc
    from google.protobuf import json_format
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc

logger = logging.getLogger("ratelimit.service")
WATCH_EVERY = 1.0
"""How often the configuration directory is looked at, and Redis asked while it fails."""
GRACE_SECONDS = 10.0
"""From SIGTERM to the server stopped, at most."""
HEALTH_NAME = "ratelimit"
ENVOY_SERVICE = "envoy.service.ratelimit.v3.RateLimitService"


def counts_of(settings: EnvoySettings) -> Counts:
    """Where the windows are counted: Redis as its settings say, or this process."""
    if settings.backend_type == "memory":
        return MemoryCounts()
    per_second = redis_client(settings.persecond) if settings.redis_persecond else None
    timeout = settings.redis.timeout if settings.redis.timeout > 0 else None
    return RedisWindows(redis_client(settings.redis), per_second, timeout)


def answers_of(
    settings: EnvoySettings, stats: EnvoyStats, counts: Counts | None
) -> tuple[EnvoyAnswers, Store]:
    """The answers as its service gives them, counted on its windows (``counts``, else
    :func:`counts_of`); or, with ``RATELIMIT_ALGORITHM``, decided by our algorithm on the
    same store (:mod:`.our_answers`), leased with ``RATELIMIT_LEASE``. And what to ask
    whether the store answers, and close."""
    timeout = settings.redis.timeout if settings.redis.timeout > 0 else None
    if settings.algorithm:
        memory = settings.backend_type == "memory"
        client = None if memory else redis_client(settings.redis)
        limiter = RateLimit(
            MemoryBackend() if client is None else client,
            settings.cache_key_prefix,
            algorithm=settings.algorithm,
            on_error="raise",
            lease=settings.lease,
        )
        ours = OurAnswers(None, limiter, stats, answering_of(settings), timeout)
        return ours, LimiterStore(limiter, client, timeout)
    cache = None
    if settings.local_cache_size_in_bytes > 0:  # freecache takes 512 KiB at least
        cache = OverLimitCache(max(settings.local_cache_size_in_bytes, 512 * 1024))
    counts = counts if counts is not None else counts_of(settings)
    answers = EnvoyAnswers(
        None, counts, stats, answering_of(settings), cache, jitter=random.randrange
    )
    return answers, counts


def answering_of(settings: EnvoySettings) -> Answering:
    headers = None
    if settings.response_headers_enabled:
        headers = (settings.header_limit, settings.header_remaining, settings.header_reset)
    return Answering(
        shadow_mode=settings.shadow_mode,
        quota_mode=settings.quota_mode,
        near_limit_ratio=settings.near_limit_ratio,
        cache_key_prefix=settings.cache_key_prefix,
        jitter_seconds=settings.expiration_jitter_max_seconds,
        stop_increment_when_over=settings.stop_cache_key_increment_when_overlimit,
        headers=headers,
        dynamic_metadata=settings.response_dynamic_metadata,
    )


def signature(settings: EnvoySettings) -> tuple[Any, ...]:
    """What changes when the configuration changes: where ``RUNTIME_ROOT`` resolves to (a
    swapped link), and each file its service would read (:func:`~ratelimit.service.
    envoy_config.runtime_files`) with its inode, size and modification time."""
    seen: list[tuple[Any, ...]] = [(os.path.realpath(settings.runtime_root),)]
    files = runtime_files(
        settings.runtime_root,
        settings.runtime_subdirectory,
        settings.runtime_appdirectory,
        settings.runtime_watch_root,
        settings.runtime_ignore_dotfiles,
    )
    for file in files:
        try:
            st = os.stat(file.path)
        except OSError:
            seen.append((file.path,))
            continue
        seen.append((file.path, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(seen)


class _Rls(rls_pb2_grpc.RateLimitServiceServicer):
    def __init__(self, service: EnvoyService) -> None:
        self.service = service

    async def ShouldRateLimit(  # the RPC's name
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> rls_pb2.RateLimitResponse:
        service = self.service
        started = time.monotonic()
        try:
            return await service.answers.should_rate_limit(request)
        except ServiceError as exc:
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        except BadUnit as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except BackendError as exc:
            service.stats.redis_error.add()
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        finally:
            service.stats.rpc("ShouldRateLimit", time.monotonic() - started)
        raise AssertionError("unreachable: abort raises")


class _Health(health.aio.HealthServicer):  # type: ignore[misc]  # untyped package
    """gRPC health, its ``Check`` counted and timed as its service's interceptor does."""

    def __init__(self, stats: EnvoyStats) -> None:
        super().__init__()
        self.stats = stats

    async def Check(  # the RPC's name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        started = time.monotonic()
        try:
            return await super().Check(request, context)
        finally:
            self.stats.rpc("Check", time.monotonic() - started)


class EnvoyService:
    """One running service (:meth:`start`, then :meth:`run` until SIGTERM or :meth:`stop`)."""

    def __init__(self, settings: EnvoySettings, counts: Counts | None = None) -> None:
        if settings.use_statsd and settings.use_prometheus and not settings.disable_stats:
            raise ConfigurationError(
                "unable to use more than one stats sink at the same time: set one of "
                "USE_STATSD (true by default) and USE_PROMETHEUS"
            )
        self.settings = settings
        self.stats = EnvoyStats()
        self.answers, self.store = answers_of(settings, self.stats, counts)
        self.server = grpc.aio.server()
        self.health = _Health(self.stats)
        self.healthy = {"redis": settings.backend_type == "memory", "sigterm": True}
        if settings.healthy_with_at_least_one_config_loaded:
            self.healthy["config"] = False
        self.grpc_port = 0
        self.http_port = 0
        self.debug_port = 0
        self.metrics_port: int | None = None
        self._listeners: list[asyncio.Server] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._seen: tuple[Any, ...] = ()
        self._closing: list[Callable[[], Awaitable[None]]] = []

    # the configuration

    def load(self) -> bool:
        """Load the configuration directory; on an error keep the one in use, log it and
        count ``config_load_error`` (``SetConfig``)."""
        settings = self.settings
        self._seen = signature(settings)
        try:
            config = load_runtime(
                settings.runtime_root,
                settings.runtime_subdirectory,
                settings.runtime_appdirectory,
                settings.runtime_watch_root,
                settings.merge_domain_config,
                settings.runtime_ignore_dotfiles,
                settings.algorithm,
            )
        except Exception as exc:  # whatever it was, the configuration in use stays
            self.stats.config_load_error.add()
            said = exc if isinstance(exc, (ConfigFileError, OSError)) else repr(exc)
            logger.error("Error loading new configuration: %s", said)
            return False
        if "config" in self.healthy:
            self.healthy["config"] = bool(config.domains)
        self.stats.config_load_success.add()
        self.answers.config = config
        logger.info("Successfully loaded new configuration")
        return True

    @property
    def config(self) -> EnvoyConfig | None:
        return self.answers.config

    # starting

    async def start(self) -> None:
        """Load the configuration, then listen (gRPC, HTTP, debug, metrics) and watch the
        configuration directory."""
        settings = self.settings
        self.load()
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(_Rls(self), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (
            ENVOY_SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, self.server)
        where = (
            f"unix:{settings.grpc_uds}"
            if settings.grpc_uds
            else address(settings.grpc_host, settings.grpc_port)
        )
        credentials = None
        if settings.grpc_server_use_tls:
            credentials = server_credentials(
                settings.grpc_server_tls_cert,
                settings.grpc_server_tls_key,
                settings.grpc_client_tls_cacert or None,
            )
        try:
            if credentials is None:
                self.grpc_port = self.server.add_insecure_port(where)
            else:
                self.grpc_port = self.server.add_secure_port(where, credentials)
        except RuntimeError as exc:
            raise ConfigurationError(f"cannot listen on {where}: {exc}") from None
        await self.server.start()
        http = await serve_http(
            settings.host, settings.port, {"/json": self._json, "/healthcheck": self._healthcheck}
        )
        debug = await serve_http(
            settings.debug_host,
            settings.debug_port,
            {"/rlconfig": self._rlconfig, "/stats": self._stats_page, "/": self._debug_root},
        )
        self._listeners += [http, debug]
        self.http_port = http.sockets[0].getsockname()[1]
        self.debug_port = debug.sockets[0].getsockname()[1]
        await self._start_sinks()
        await self._ask_redis()
        await self._tell_health()
        self._tasks.append(asyncio.create_task(self._watch()))

    async def _start_sinks(self) -> None:
        """Stats to Prometheus (``/metrics``, read at scrape time) or statsd (flushed every
        ``STATS_FLUSH_INTERVAL``), unless ``DISABLE_STATS``."""
        settings = self.settings
        if settings.disable_stats:
            return
        from ratelimit.service.envoy_service.mapper import StatsdMapper
        from ratelimit.service.envoy_service.sinks import PrometheusSink, StatsdSink

        if settings.use_prometheus:
            path = settings.prometheus_mapper_yaml
            milliseconds = settings.prometheus_response_time_as_milliseconds
            mapper = (
                StatsdMapper.from_file(path)
                if path
                else StatsdMapper.default(response_time_as_milliseconds=milliseconds)
            )
            prometheus = PrometheusSink(self.stats, mapper, settings.extra_tags)
            self.metrics_port = await prometheus.start(
                settings.prometheus_addr, settings.prometheus_path
            )
            self._closing.append(prometheus.aclose)
        elif settings.use_statsd:
            statsd = StatsdSink(
                self.stats,
                settings.statsd_host,
                settings.statsd_port,
                settings.extra_tags,
                protocol=settings.statsd_protocol,
            )
            self._tasks.append(asyncio.create_task(statsd.run(settings.stats_flush_interval)))
            self._closing.append(statsd.aclose)

    # health

    async def _ask_redis(self) -> None:
        """One ``PING`` through the counts' store (nothing counted): Redis is healthy once
        it answers."""
        if self.healthy["redis"]:
            return
        try:
            await self.store.ping()
        except BackendError as exc:
            logger.warning("ratelimit: Redis does not answer yet: %s", exc)
            return
        self.healthy["redis"] = True

    def is_healthy(self) -> bool:
        return all(self.healthy.values())

    async def _tell_health(self) -> None:
        """``ratelimit`` says the health; ``""`` is always ``SERVING``, as grpc-go's health
        server starts it and its service leaves it (a probe of ``""`` asks whether the
        process answers)."""
        status = health_pb2.HealthCheckResponse
        serving = status.SERVING if self.is_healthy() else status.NOT_SERVING
        await self.health.set("", status.SERVING)
        await self.health.set(HEALTH_NAME, serving)

    # the HTTP routes

    async def _json(self, method: str, body: bytes) -> Reply:
        request = rls_pb2.RateLimitRequest()
        try:
            json_format.Parse(body or b"{}", request)
        except json_format.ParseError as exc:
            logger.warning("error: %s", exc)
            return text(400)
        try:
            answer = await self.answers.should_rate_limit(request)
        except (ServiceError, BadUnit) as exc:
            logger.warning("error: %s", exc)
            return text(400)
        except BackendError as exc:
            self.stats.redis_error.add()
            logger.warning("error: %s", exc)
            return text(400)
        said = json_format.MessageToJson(answer, indent=None).encode()
        code = answer.overall_code
        status = 429 if code == rls_pb2.RateLimitResponse.OVER_LIMIT else 200
        if code == rls_pb2.RateLimitResponse.UNKNOWN:
            status = 500
        return status, "application/json", said

    async def _healthcheck(self, method: str, body: bytes) -> Reply:
        if self.is_healthy():
            return 200, "text/plain; charset=utf-8", b"OK"
        return 500, "", b""  # as its service answers: no body, no content type

    async def _rlconfig(self, method: str, body: bytes) -> Reply:
        config = self.config
        return 200, "text/plain; charset=utf-8", (config.dump() if config else "").encode()

    async def _stats_page(self, method: str, body: bytes) -> Reply:
        lines = [f"{name}: {c.value}\n" for name, c in sorted(self.stats.counters.items())]
        return 200, "text/plain; charset=utf-8", "".join(lines).encode()

    async def _debug_root(self, method: str, body: bytes) -> Reply:
        endpoints = {
            "/rlconfig": "print out the currently loaded configuration for debugging",
            "/stats": "print out stats",
        }
        said = "".join(f"{path}: {what}\n" for path, what in sorted(endpoints.items()))
        return 200, "text/plain; charset=utf-8", said.encode()

    # running

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Serve until SIGTERM, SIGINT, SIGHUP or :meth:`stop`, then stop gracefully."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # as its runner stops
            loop.add_signal_handler(sig, self.stop)
        try:
            await self._stop.wait()
        finally:
            await self.shutdown()

    async def _watch(self) -> None:
        """Every :data:`WATCH_EVERY`: reload the configuration if it changed, ask Redis while
        it has not answered, and say the health. A failure is logged and the next turn
        tries again: the watch never ends before the service."""
        settings = self.settings
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                seen = signature(settings)
                if seen != self._seen:
                    self.load()
                if not self.healthy["redis"]:
                    await self._ask_redis()
                await self._tell_health()
            except Exception:
                logger.exception("ratelimit: watching the configuration and Redis failed")

    async def shutdown(self) -> None:
        """Health says ``NOT_SERVING``; calls in flight are answered (at most
        :data:`GRACE_SECONDS`); then the listeners, the sinks and the store close."""
        self.healthy["sigterm"] = False
        await self._tell_health()
        await self.server.stop(GRACE_SECONDS)  # returns once the calls taken are answered
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        for listener in self._listeners:
            listener.close()
        for close in self._closing:
            await close()
        await self.store.aclose()

    def start_line(self) -> str:
        settings = self.settings
        where = settings.grpc_uds or address(settings.grpc_host, self.grpc_port)
        return (
            f"ratelimit: serving envoyproxy/ratelimit's API on {where} (gRPC), "
            f"{address(settings.host, self.http_port)} (HTTP: /json, /healthcheck), "
            f"{address(settings.debug_host, self.debug_port)} (debug: /rlconfig)"
            + (f", /metrics on port {self.metrics_port}" if self.metrics_port else "")
            + f"; configuration from {settings.config_directory}"
        )


def configure_logging(level: str, form: str) -> None:
    """``LOG_LEVEL`` (debug, info, warn, error, ...) and ``LOG_FORMAT`` (``text`` or
    ``json``) for the service's log."""
    levels = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO}
    levels |= {"WARN": logging.WARNING, "WARNING": logging.WARNING, "ERROR": logging.ERROR}
    levels |= {"FATAL": logging.CRITICAL, "PANIC": logging.CRITICAL}
    handler = logging.StreamHandler()
    if form.lower() == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter('time="%(asctime)s" level=%(levelname)s msg="%(message)s"')
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(levels.get(level.upper(), logging.WARNING))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        said = {
            "@timestamp": self.formatTime(record),
            "level": record.levelname.lower(),
            "@message": record.getMessage(),
        }
        return json.dumps(said)


async def serve_envoy(settings: EnvoySettings, unhonoured: list[str]) -> None:
    """Start the service, say where it listens, and serve until stopped."""
    if unhonoured:
        logger.warning(
            "ratelimit: these envoyproxy/ratelimit variables are set but not honoured here "
            "(see docs/migrating-from-envoy-ratelimit.md): %s",
            ", ".join(unhonoured),
        )
    if settings.lease and settings.algorithm and not named(settings.algorithm).leases:
        logger.warning(
            "ratelimit: RATELIMIT_LEASE=%g does nothing with RATELIMIT_ALGORITHM=%s, which "
            "decides every request at the store",
            settings.lease,
            settings.algorithm,
        )
    service = EnvoyService(settings)
    await service.start()
    print(service.start_line(), flush=True)
    await service.run()
    print("ratelimit: stopped", flush=True)
