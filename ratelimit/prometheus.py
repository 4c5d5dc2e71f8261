"""Prometheus metrics (``pip install "ratelimit-rules[prometheus]"``): kept so that
``from ratelimit.prometheus import PrometheusHook`` goes on working; the module is
:mod:`ratelimit.metrics.prometheus`."""

from ratelimit.metrics.prometheus import BUCKETS as BUCKETS
from ratelimit.metrics.prometheus import DecisionMetrics as DecisionMetrics
from ratelimit.metrics.prometheus import PrometheusHook as PrometheusHook
from ratelimit.metrics.prometheus import decision_metrics as decision_metrics
from ratelimit.metrics.prometheus import metric_names as metric_names
