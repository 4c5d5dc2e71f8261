"""The service's Prometheus metrics (``RATELIMIT_METRICS=prometheus``, the default when
``prometheus-client`` is installed, as the ``server`` extra does), served on
``http://RATELIMIT_METRICS_HOST:RATELIMIT_METRICS_PORT/metrics``.

Besides the library's (:mod:`ratelimit.metrics.prometheus`: decisions, latency, the storage):

- ``ratelimit_decisions_total{key, limit, outcome}`` counts each Envoy descriptor decided
  (``key`` ``envoy/<domain>``, ``limit`` the rules-file limit as ``[descriptor keys] rules``,
  ``[remote_address] 10/m``; ``[descriptor keys] (override)`` when an override or the
  request's own ``limit`` replaced its rules, and ``(request limit)`` for a descriptor only
  its own ``limit`` limits: never a value or a rate a request sent) and each call of ratio's
  API (``key`` ``ratio``, ``limit`` the deciding rule), as Envoy's own service counts per
  descriptor;
- ``ratelimit_calls_total{key, code}``: calls by the gRPC status they ended with (``OK``,
  also for an answer ``OVER_LIMIT``; ``INVALID_ARGUMENT``, ``NOT_FOUND`` for a domain the
  rules file lacks, whose ``key`` is ``envoy/(unknown)``; ``CANCELLED`` when the caller gave
  up, as past its deadline; ``UNAVAILABLE`` when refused undecided while stopping);
- ``ratelimit_decision_duration_seconds{key}``: each call's time, from its arrival to its
  answer or to the caller giving up (calls refused undecided while stopping excepted);
- ``ratelimit_rules_reloads_total{result}`` (``ok`` or ``failed``),
  ``ratelimit_rules_in_force`` (limits in the rules file now) and
  ``ratelimit_rules_loaded_timestamp_seconds`` (when they were read);
- ``ratelimit_calls_in_flight``: calls being decided now.

With ``--workers N`` each worker writes its metrics to files in a directory the
supervisor owns (``prometheus_client``'s multiprocess mode) and the supervisor serves
their sum on the one metrics port.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from ratelimit.core.decision import Decision, RuleState
from ratelimit.core.extras import needs_extra
from ratelimit.metrics.outcomes import (
    ALLOWED,
    DEGRADED,
    NEAR_LIMIT,
    OVER_LIMIT,
    SHADOW,
    near,
    outcome,
)
from ratelimit.metrics.prometheus import PrometheusHook
from ratelimit.service.rules_file import DescriptorLimit

with needs_extra("server"):
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Gauge,
        PlatformCollector,
        ProcessCollector,
        start_http_server,
    )
    from prometheus_client import multiprocess as multiprocess

    from ratelimit.service.proto.envoy import rls_pb2

RLS = rls_pb2.RateLimitResponse
NEAR_RATIO = 0.8
"""An admitted descriptor (or call of ratio's API) with this much of any of its rules used
counts as near the limit (Envoy's reference service counts 80 % too)."""


REQUEST_LIMIT = "(request limit)"
"""The ``limit`` label of a descriptor that no rules-file limit matches, limited by its own
``limit`` only (its keys and rate come from the request: never labels)."""


def limit_label(limit: DescriptorLimit | None) -> str:
    """How a descriptor's limit is named in metrics: the rules-file limit's descriptor keys
    (and pinned values, from the file) and its rules, ``(override)`` for rules replaced by an
    override or the request, never anything a request sent."""
    if limit is None or limit.request:  # made from the request's own limit
        return REQUEST_LIMIT
    if limit.override:
        return f"[{limit.text}] (override)"
    return f"[{limit.text}] {limit.rules}"


class ServiceMetrics:
    """The service's metrics on ``registry`` (default: one of its own, with the process's
    CPU, memory and file descriptors too)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
        self.registry = registry
        self.hook = PrometheusHook(registry, NEAR_RATIO, decisions=False)
        """The limiter's hook: the storage's failures and health (decisions are counted
        here, per descriptor)."""
        self.reloads = Counter(
            "ratelimit_rules_reloads",
            "Rules file reloads, by result",
            ("result",),
            registry=registry,
        )
        for result in ("ok", "failed"):
            self.reloads.labels(result)
        self.in_force = Gauge(
            "ratelimit_rules_in_force",
            "Limits in the rules file in force",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.loaded = Gauge(
            "ratelimit_rules_loaded_timestamp_seconds",
            "When the rules in force were read (Unix time)",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.calls = Counter(
            "ratelimit_calls",
            "Calls by the gRPC status they ended with",
            ("key", "code"),
            registry=registry,
        )
        self.in_flight = Gauge(
            "ratelimit_calls_in_flight",
            "Calls being decided",
            registry=registry,
            multiprocess_mode="livesum",
        )

    def rules(self, limits: int) -> None:
        """The rules file read at start, ``limits`` limits in it."""
        self.in_force.set(limits)
        self.loaded.set(time.time())

    def reloaded(self, ok: bool, limits: int) -> None:
        """A reload that applied a file of ``limits`` limits (``ok``), or kept the old ones."""
        self.reloads.labels("ok" if ok else "failed").inc()
        if ok:
            self.rules(limits)

    def called(self, key: str, code: str, seconds: float) -> None:
        """One call of ``key`` that ended with gRPC status ``code`` after ``seconds``."""
        self.calls.labels(key, code).inc()
        if code != "UNAVAILABLE":  # refused undecided while stopping
            self.hook.observe(key, seconds)

    def ratio(self, decision: Decision, internal: str) -> None:
        """One call of ratio's API; ``internal``: the selector the service counts a rule
        without one under, left out of the label. Near the limit with :data:`NEAR_RATIO` of
        *any* of its rules used, as an Envoy descriptor is (not only the one with least
        left, which labels it)."""
        rule = decision.rule
        if rule is not None and rule.selector == internal:
            rule = dataclasses.replace(rule, selector=None)
        what = outcome(decision, NEAR_RATIO)
        if what == ALLOWED and any(
            near(s.rule.count, s.remaining, NEAR_RATIO) for s in decision.states
        ):
            what = NEAR_LIMIT
        self.hook.count(decision.key, "" if rule is None else str(rule), what)

    def blocked(self, domain: str, limit: DescriptorLimit | None, *, shadow: bool = False) -> None:
        """A descriptor refused undecided: its own limit is 0 requests, or its override is
        below its ``hits_addend`` (``shadow``: a shadow limit's, let through); ``limit``:
        the limit it matches, if any."""
        self.hook.count(f"envoy/{domain}", limit_label(limit), SHADOW if shadow else OVER_LIMIT)

    def descriptors(
        self,
        domain: str,
        group: Sequence[tuple[int, DescriptorLimit, str, int]],
        decision: Decision,
        statuses: Sequence[RLS.DescriptorStatus],
        limited: Sequence[bool],
        states: Sequence[Sequence[RuleState]],
    ) -> None:
        """Each descriptor of one decided group, by what its status says (``limited``:
        whether its own rules refused, which a shadow limit's status does not show;
        ``states``: each descriptor's rule states, by its position in the request)."""
        key = f"envoy/{domain}"
        for (n, limit, _, _), refused in zip(group, limited, strict=True):
            status = statuses[n]
            if decision.degraded:
                what = DEGRADED
            elif status.code == RLS.OVER_LIMIT:
                what = OVER_LIMIT
            elif refused:
                what = SHADOW
            elif any(near(s.rule.count, s.remaining, NEAR_RATIO) for s in states[n]):
                what = NEAR_LIMIT  # any of its rules, not only the one with least left
            else:
                what = ALLOWED
            self.hook.count(key, limit_label(limit), what)


class MetricsServer:
    """``registry`` served at ``/metrics`` on ``host:port`` (0: any free port) by a thread
    of ``prometheus_client``'s, until :meth:`close`."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, host, registry)
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def multiprocess_registry(folder: str) -> CollectorRegistry:
    """A registry of the sums of the metrics the workers write to ``folder`` (their
    ``PROMETHEUS_MULTIPROC_DIR``)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, folder)  # type: ignore[no-untyped-call]
    return registry
