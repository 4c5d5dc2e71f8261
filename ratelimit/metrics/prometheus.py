"""Prometheus metrics for every decision and for the storage's health
(``pip install "ratelimit-rules[prometheus]"``, which the ``server`` extra includes).

::

    from prometheus_client import start_http_server
    from ratelimit.metrics.prometheus import PrometheusHook

    rl = RateLimit(client, hooks=[PrometheusHook()])   # prometheus_client's default registry
    start_http_server(9464)                             # or mount make_asgi_app() in your app

The metrics (``prometheus_client`` writes the exposition):

- ``ratelimit_decisions_total`` (counter; labels ``key``, ``limit``, ``outcome``): one per
  decision. ``outcome`` is ``allowed``, ``near_limit`` (admitted with ``near_ratio`` or more
  of its tightest rule used), ``over_limit``, ``shadow`` (refused but let through) or
  ``degraded`` (answered by the failure policy); ``limit`` is the deciding rule's text
  (empty when the storage failed and no rule decided).
- ``ratelimit_decision_duration_seconds`` (histogram; label ``key``): the decision
  pipeline's time, storage included.
- ``ratelimit_store_failures_total`` (counter): calls of the storage that failed (each
  decision the failure policy answered, each settle lost).
- ``ratelimit_store_outages_total`` (counter): outages begun (a failure while the storage
  answered); ``ratelimit_store_outage_seconds_total`` (counter): how long ended outages
  lasted; ``ratelimit_store_up`` (gauge): 0 while an outage lasts, else 1.

Labels stay bounded: keys and rule texts come from the code (or the rules file, or
overrides), never from callers; selector values (user names, addresses) are never labels.
``keys=False`` drops the key too, for applications that make keys from requests.

Several hooks on one registry share its metrics (a registry holds each name once).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence

from ratelimit.core.decision import Decision
from ratelimit.core.extras import needs_extra
from ratelimit.metrics.outcomes import check_near_ratio, outcome

with needs_extra("prometheus"):
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""The latency histogram's buckets, in seconds: a decision takes a round trip to the
storage, a fraction of a millisecond on a LAN, up to the deadline (1 s by default)."""


CHILDREN = 10_000
"""How many (key, rule, outcome) a :class:`PrometheusHook` keeps its labelled children for."""
_Children = tuple[object, Callable[[], None], Callable[[float], None]]
"""The rule (kept: its ``id`` is the table's key), the decision counter's ``inc`` and the
latency histogram's ``observe`` for one (key, rule, outcome)."""


class DecisionMetrics:
    """The metric families of one registry (made once per registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "ratelimit_decisions",
            "Rate-limit decisions by outcome",
            ("key", "limit", "outcome"),
            registry=registry,
        )
        self.duration = Histogram(
            "ratelimit_decision_duration_seconds",
            "Time to decide, storage included",
            ("key",),
            buckets=BUCKETS,
            registry=registry,
        )
        self.store_failures = Counter(
            "ratelimit_store_failures",
            "Calls of the storage that failed (decisions answered by the failure policy, "
            "settles lost)",
            registry=registry,
        )
        self.outages = Counter(
            "ratelimit_store_outages", "Storage outages begun", registry=registry
        )
        self.outage_seconds = Counter(
            "ratelimit_store_outage_seconds",
            "How long ended storage outages lasted",
            registry=registry,
        )
        self.store_up = Gauge(
            "ratelimit_store_up",
            "0 while the storage fails (an outage), else 1",
            registry=registry,
            multiprocess_mode="livemin",
        )
        self.store_up.set(1)


_made: weakref.WeakKeyDictionary[CollectorRegistry, DecisionMetrics] = weakref.WeakKeyDictionary()
_making = threading.Lock()


def decision_metrics(registry: CollectorRegistry | None = None) -> DecisionMetrics:
    """The decision metrics of ``registry`` (default: ``prometheus_client``'s), made at
    the first call for it."""
    registry = REGISTRY if registry is None else registry
    with _making:
        made = _made.get(registry)
        if made is None:
            made = _made[registry] = DecisionMetrics(registry)
        return made


class PrometheusHook:
    """A hook counting decisions, their latency and the storage's failures on
    ``registry`` (default: ``prometheus_client``'s). ``near_ratio``: how much of its
    tightest rule an admitted call must have used to count as ``near_limit`` (default 0.8);
    ``keys``: label with the limit's key (default on); ``decisions``: count each decision
    (default on; off when a front end counts its own, as the service does per
    descriptor)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        near_ratio: float = 0.8,
        keys: bool = True,
        decisions: bool = True,
    ) -> None:
        self.near_ratio = check_near_ratio(near_ratio)
        self.keys = keys
        self.decisions = decisions
        self.metrics = decision_metrics(registry)
        self._counts_itself = type(self).count is not PrometheusHook.count
        self._children: dict[tuple[str, int, str], _Children] = {}
        """Per (key, ``id`` of the deciding rule, outcome): the labelled children that count
        it (:meth:`_labelled`), each rule held beside them, so that its ``id`` names it for
        as long as the entry lives. ``labels()`` costs more than the count itself."""

    def __call__(self, decision: Decision) -> None:
        self.timed(decision, None)

    def timed(self, decision: Decision, seconds: float | None) -> None:
        if not self.decisions:
            return
        what = outcome(decision, self.near_ratio)
        if self._counts_itself:  # a subclass's count() counts every decision
            key = decision.key if self.keys else ""
            self.count(key, "" if decision.rule is None else str(decision.rule), what)
            if seconds is not None:
                self.observe(decision.key, seconds)
            return
        children = self._children.get((decision.key, id(decision.rule), what))
        if children is None:
            children = self._labelled(decision, what)
        children[1]()
        if seconds is not None:
            children[2](seconds)

    def _labelled(self, decision: Decision, what: str) -> _Children:
        """The children counting ``decision``'s key, rule and outcome ``what``, and
        observing its key's latency: looked up once, then kept (up to :data:`CHILDREN`
        of them; past that, the table starts again)."""
        key = decision.key if self.keys else ""
        rule = decision.rule
        limit = "" if rule is None else str(rule)
        children = self._children
        if len(children) >= CHILDREN:
            children.clear()
        made = (
            rule,
            self.metrics.decisions.labels(key, limit, what).inc,
            self.metrics.duration.labels(key).observe,
        )
        children[(decision.key, id(rule), what)] = made
        return made

    def count(self, key: str, limit: str, what: str, n: int = 1) -> None:
        """Count ``n`` decisions of ``key`` and ``limit`` as outcome ``what``."""
        self.metrics.decisions.labels(key, limit, what).inc(n)

    def observe(self, key: str, seconds: float) -> None:
        """Record one decision's latency for ``key``."""
        self.metrics.duration.labels(key if self.keys else "").observe(seconds)

    # --- the storage (see ratelimit.pipeline.hooks) ---

    def store_failed(self) -> None:
        self.metrics.store_failures.inc()

    def outage_started(self) -> None:
        self.metrics.outages.inc()
        self.metrics.store_up.set(0)

    def outage_ended(self, seconds: float) -> None:
        self.metrics.outage_seconds.inc(seconds)
        self.metrics.store_up.set(1)


def metric_names(registry: CollectorRegistry) -> Sequence[str]:
    """The names of the samples ``registry`` exposes now (``_total``, ``_bucket`` ...
    included), for checks such as a dashboard's."""
    return sorted({s.name for family in registry.collect() for s in family.samples})
