"""What the service's metrics go to (``RATELIMIT_METRICS``): Prometheus, OpenTelemetry's
global provider, OpenTelemetry printed to the console, or nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratelimit.errors import ConfigurationError
from ratelimit.service.config import ServiceConfig

if TYPE_CHECKING:
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
        from ratelimit.service.prometheus import MetricsServer

        host = config.metrics_host or config.host
        try:
            self.server = MetricsServer(self.prometheus.registry, host, config.metrics_port)
            return self.server.port
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{config.metrics_port} "
                f"(RATELIMIT_METRICS_PORT): {exc.strerror}"
            ) from None

    def close(self) -> None:
        """Send the last metrics and stop serving them."""
        if self.flush is not None:
            self.flush()
        if self.server is not None:
            self.server.close()


def observing(metrics: str) -> Observing:
    """The service's metrics: ``prometheus`` (:mod:`ratelimit.service.prometheus`), or
    OpenTelemetry's ``ratelimit.decisions`` and ``ratelimit.decision.duration``
    (:mod:`ratelimit.metrics`) when the ``otel`` extra is installed, on the global
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
        from ratelimit.metrics import OpenTelemetryHook
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
