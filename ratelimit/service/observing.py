"""What the service's metrics go to (``RATELIMIT_METRICS``): Prometheus, OpenTelemetry's
global provider, OpenTelemetry printed to the console, or nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ratelimit.algorithms import named
from ratelimit.errors import ConfigurationError
from ratelimit.service.config import ServiceConfig, address, bare_host
from ratelimit.service.tls import described

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ratelimit.service.prometheus import MetricsServer, ServiceMetrics

WORKER = "RATELIMIT_WORKER"
"""Set by the supervisor of ``--workers N`` in each worker's environment (its number)."""


@dataclass
class Observing:
    limiter_hooks: list[Any]
    """The limiter's hooks."""
    flush: Callable[[], object] | None = None
    """What sends the last metrics when the service stops."""
    prometheus: ServiceMetrics | None = None
    """The service's own Prometheus metrics (descriptors, reloads, calls in flight)."""
    server: MetricsServer | None = None

    def serve(self, config: ServiceConfig) -> int | None:
        """Serve ``/metrics`` where ``config`` says, unless a supervisor of workers does;
        the port, or ``None``."""
        if self.prometheus is None or os.environ.get(WORKER):
            return None
        self.server = serve_metrics(self.prometheus.registry, config)
        return self.server.port

    def close(self) -> None:
        """Send the last metrics and stop serving them."""
        if self.flush is not None:
            self.flush()
        if self.server is not None:
            self.server.close()


def serve_metrics(registry: CollectorRegistry, config: ServiceConfig) -> MetricsServer:
    """``registry`` served at ``/metrics`` where ``config`` says; ``ConfigurationError``
    naming the variables when it cannot be."""
    from ratelimit.service.prometheus import MetricsServer

    host = bare_host(config.metrics_host or config.host)
    try:
        return MetricsServer(registry, host, config.metrics_port)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {address(host, config.metrics_port)} "
            f"(RATELIMIT_METRICS_HOST, RATELIMIT_METRICS_PORT): {exc.strerror or exc}"
        ) from None


def start_line(config: ServiceConfig, port: int, metrics_port: int | None, workers: int = 1) -> str:
    """What the service prints once it listens (tests and scripts read the address)."""
    parts = [f"{workers} workers"] if workers > 1 else []
    parts.append(f"storage {config.storage}")
    if config.rules_file:
        parts.append(f"rules file {Path(config.rules_file)}")
    if config.lease:
        leases = named(config.algorithm).leases
        parts.append(
            f"leases of {config.lease:g} s"
            if leases
            else f"no leases: {config.algorithm} decides every request at the store"
        )
    if metrics_port is not None:
        where = address(config.metrics_host or config.host, metrics_port)
        parts.append(f"metrics on http://{where}/metrics")
    tls = described(config.tls_cert, config.tls_client_ca)
    return f"ratelimit: serving on {address(config.host, port)} ({', '.join(parts)}{tls})"


def observing(metrics: str) -> Observing:
    """The service's metrics: ``prometheus`` (:mod:`ratelimit.service.prometheus`), or
    OpenTelemetry's ``ratelimit.decisions`` and ``ratelimit.decision.duration``
    (:mod:`ratelimit.metrics.opentelemetry`) when the ``otel`` extra is installed, on the global
    MeterProvider (``otel``: configure it as OpenTelemetry documents) or printed to
    standard output every minute and when the service stops (``console``); none with
    ``none``."""
    if metrics == "none":
        return Observing([])
    if metrics == "prometheus":
        try:
            from ratelimit.service.prometheus import ServiceMetrics
        except ImportError as exc:
            raise ConfigurationError(
                f"RATELIMIT_METRICS=prometheus needs prometheus-client (the server extra "
                f"brings it: pip install 'ratelimit-rules[server]'): {exc}"
            ) from None
        service = ServiceMetrics()
        return Observing([service.hook], prometheus=service)
    try:
        from ratelimit.metrics.opentelemetry import OpenTelemetryHook
    except ImportError:
        if metrics == "console":
            raise ConfigurationError(
                "RATELIMIT_METRICS=console needs the otel extra: "
                "pip install 'ratelimit-rules[otel]'"
            ) from None
        return Observing([])
    if metrics != "console":
        return Observing([OpenTelemetryHook()])
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=60_000)
    provider = MeterProvider(metric_readers=[reader])
    return Observing([OpenTelemetryHook(provider.get_meter("ratelimit"))], provider.shutdown)
