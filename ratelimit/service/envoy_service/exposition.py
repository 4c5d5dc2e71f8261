"""The Prometheus text (format 0.0.4) the Go service's ``USE_PROMETHEUS`` sink serves:
its stats as statsd_exporter registers them under its mapping (:mod:`.mapper`), written as
client_golang's ``expfmt`` writes them. Served by
:class:`~ratelimit.service.envoy_service.prometheus.PrometheusSink`.

What it copies, and where from:

- **Counters**: statsd_exporter registers a counter under the mapped name exactly as the
  mapping writes it, so the series is ``ratelimit_service_rate_limit_total_hits{...}``,
  with no ``_total`` added (``prometheus_client`` would add one: it renders every counter
  family as ``<name>_total``, so this module renders the text itself). Counters that map
  to the same name and labels are summed, as the exporter adds their increases to one
  series; a counter still at zero is not shown, as the exporter makes a series on its
  first increase.
- **Timers** (gostats hands each value to the sink as it is recorded): each value, times
  the rule's ``scale``, is observed into a histogram or a summary, as the mapping says
  (the default mapping: ``ratelimit_server.<Method>.response_time`` into the histogram
  ``ratelimit_service_response_time_seconds{grpc_method="<Method>"}``, milliseconds times
  0.001, client_golang's default buckets from 5 ms to 10 s). A histogram is its
  ``_bucket{le="..."}`` series (cumulative, ``le`` inclusive, ``+Inf`` last), then
  ``_sum`` and ``_count``; a summary its ``{quantile="..."}`` series, then ``_sum`` and
  ``_count``. A timer with no value yet is not shown.
- A name no rule maps is escaped (``escapeMetricName``); the mapping is :mod:`.mapper`.
  Families are sorted by name, series by their label values; values are written as Go's
  ``strconv.FormatFloat(v, 'g', -1, 64)`` writes them (:func:`go_float`).

Values are read when scraped, not when flushed. Not copied: a family name that two kinds of
stat map to keeps the counters (the exporter keeps whichever came first and refuses the
other); a summary's quantiles are exact, of the values since its head stream was reset,
where client_golang estimates them (within each quantile's allowed error) once more than
500 values are in that stream (below, its answer is the exact one, as here), and which
values that is is settled at each scrape, so a value recorded between the last scrape
before a reset and the reset itself still counts; a histogram's or summary's ``_sum`` is
the whole milliseconds' sum times the scale, where Go adds each scaled value (the last
digits may differ after many values).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Literal

from ratelimit.service.envoy_config.yaml_scalars import format_float
from ratelimit.service.envoy_service.mapper import (
    Histogram,
    Mapped,
    MetricType,
    StatsdMapper,
    Summary,
)
from ratelimit.service.envoy_service.stats import EnvoyStats, statsd_name

__all__ = ["Exposition", "go_float"]

Labels = tuple[tuple[str, str], ...]
_Kind = Literal["counter", "histogram", "summary"]


class Exposition:
    """Renders an :class:`EnvoyStats` as the Go service's Prometheus text, mapped by
    ``mapper`` with ``extra_tags`` on every name. ``clock`` (seconds, monotonic) moves a
    summary's window on.

    Example::

        stats = EnvoyStats()
        stats.rpc("ShouldRateLimit", 0.004)
        text = Exposition(StatsdMapper.default()).text(stats)
        # ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",
        # le="0.005"} 1, ..., ratelimit_service_total_requests{grpc_method=...} 1
    """

    def __init__(
        self,
        mapper: StatsdMapper,
        extra_tags: Mapping[str, str] = {},
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._mapper = mapper
        self._tags = dict(extra_tags)
        self._clock = clock
        self._mapped: dict[tuple[str, MetricType], Mapped | None] = {}
        self._windows: dict[tuple[str, Labels], _SummaryWindow] = {}

    def text(self, stats: EnvoyStats) -> str:
        """The text a scrape gets: families sorted by name, each ``# HELP``, ``# TYPE`` and
        its series sorted by label values."""
        families: dict[str, _Family] = {}
        for name, counter in list(stats.counters.items()):
            if counter.value == 0:
                continue  # gostats flushes no zero increase: the series does not exist yet
            mapped = self._map(name, "counter")
            if mapped is None:
                continue
            value = float(counter.value) * (1.0 if mapped.scale is None else mapped.scale)
            if value < 0:
                continue  # the exporter refuses a negative increase
            family = families.setdefault(mapped.name, _Family("counter", mapped.help))
            if family.kind == "counter":
                family.counted[mapped.labels] = family.counted.get(mapped.labels, 0.0) + value
        for name, timer in list(stats.timers.items()):
            counts = dict(timer.counts)
            if not counts:
                continue  # no value yet: the exporter has not made the series
            mapped = self._map(name, "observer")
            if mapped is None or mapped.observer is None:
                continue
            kind: _Kind = "histogram" if isinstance(mapped.observer, Histogram) else "summary"
            family = families.setdefault(mapped.name, _Family(kind, mapped.help, mapped.observer))
            if family.kind == kind:  # else the name is another kind's: the exporter refuses
                observed = family.observed.setdefault(mapped.labels, _Observed())
                observed.add(counts, mapped.scale)
        now = self._clock()
        lines: list[str] = []
        for name in sorted(families):
            family = families[name]
            lines.append(f"# HELP {name} {_escaped(family.help, quotes=False)}\n")
            lines.append(f"# TYPE {name} {family.kind}\n")
            if family.kind == "counter":
                for labels in _sorted(family.counted):
                    lines.append(_sample(name, labels, family.counted[labels]))
                continue
            for labels in _sorted(family.observed):
                observed = family.observed[labels]
                if isinstance(family.observer, Histogram):
                    lines.extend(_histogram(name, labels, observed, family.observer))
                elif isinstance(family.observer, Summary):
                    window = self._windows.get((name, labels))
                    if window is None:
                        window = self._windows[name, labels] = _SummaryWindow(now, family.observer)
                    recent = window.values_since_reset(now, observed.counts)
                    lines.extend(_summary(name, labels, observed, family.observer, recent))
        return "".join(lines)

    def _map(self, name: str, metric_type: MetricType) -> Mapped | None:
        key = (name, metric_type)
        if key in self._mapped:
            return self._mapped[key]
        mapped = self._mapped[key] = self._mapper.map(statsd_name(name, self._tags), metric_type)
        return mapped


class _Family:
    """One family's series: a counter's values, or a histogram's or summary's values."""

    __slots__ = ("counted", "help", "kind", "observed", "observer")

    def __init__(
        self, kind: _Kind, help_text: str, observer: Histogram | Summary | None = None
    ) -> None:
        self.kind = kind
        self.help = help_text
        self.observer = observer  # the first timer's: the exporter makes the family with it
        self.counted: dict[Labels, float] = {}
        self.observed: dict[Labels, _Observed] = {}


class _Observed:
    """The values observed into one histogram or summary series: how many times each
    (scaled) value was, since start, and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts: dict[float, int] = {}
        self.sum = 0.0

    def add(self, milliseconds: dict[int, int], scale: float | None) -> None:
        """A timer's values (``{milliseconds: times}``), times ``scale``."""
        total = sum(value * times for value, times in milliseconds.items())
        self.sum += float(total) if scale is None else float(total) * scale
        for value, times in milliseconds.items():
            scaled = float(value) if scale is None else float(value) * scale
            self.counts[scaled] = self.counts.get(scaled, 0) + times

    @property
    def count(self) -> int:
        return sum(self.counts.values())


class _SummaryWindow:
    """Which of a summary's values its quantiles are of. client_golang keeps ``age_buckets``
    streams, each given every value, and answers from the head one; every ``max_age /
    age_buckets`` from the summary's start the head is emptied and the next becomes head.
    So the head holds the values since the boundary ``age_buckets`` steps before the next
    one (all of them in the first ``max_age``): between 8 and 10 minutes of values by
    default. The values as they were at each boundary are known from the last scrape
    before it."""

    __slots__ = ("_seen", "_start", "_step", "_steps")

    def __init__(self, start: float, summary: Summary) -> None:
        self._start = start
        self._step = summary.max_age / summary.age_buckets
        self._steps = summary.age_buckets
        self._seen: dict[int, dict[float, int]] = {}  # boundary: values at the last scrape

    def values_since_reset(self, now: float, counts: dict[float, int]) -> dict[float, int]:
        boundary = max(1, math.ceil((now - self._start) / self._step))  # the head's end
        self._seen[boundary] = dict(counts)
        reset = boundary - self._steps
        if reset < 1:
            return counts  # the head has never been emptied
        before = [seen for seen in self._seen if seen <= reset]
        if not before:
            return counts  # no scrape before the reset: every value counts
        at_reset = self._seen[max(before)]
        for seen in before:
            if seen != max(before):
                del self._seen[seen]  # a later reset has a later scrape to go by
        return {
            value: times - at_reset.get(value, 0)
            for value, times in counts.items()
            if times > at_reset.get(value, 0)
        }


def _histogram(name: str, labels: Labels, observed: _Observed, histogram: Histogram) -> list[str]:
    values = sorted(observed.counts.items())
    lines = []
    cumulative = 0
    index = 0
    for bound in histogram.buckets:
        while index < len(values) and values[index][0] <= bound:
            cumulative += values[index][1]
            index += 1
        lines.append(_sample(f"{name}_bucket", labels, cumulative, ("le", bound)))
    count = observed.count
    lines.append(_sample(f"{name}_bucket", labels, count, ("le", math.inf)))
    lines.append(_sample(f"{name}_sum", labels, observed.sum))
    lines.append(_sample(f"{name}_count", labels, count))
    return lines


def _summary(
    name: str,
    labels: Labels,
    observed: _Observed,
    summary: Summary,
    recent: dict[float, int],
) -> list[str]:
    values = sorted(recent.items())
    total = sum(times for _, times in values)
    lines = []
    for quantile in sorted({quantile for quantile, _ in summary.quantiles}):
        lines.append(
            _sample(name, labels, _quantile(values, total, quantile), ("quantile", quantile))
        )
    lines.append(_sample(f"{name}_sum", labels, observed.sum))
    lines.append(_sample(f"{name}_count", labels, observed.count))
    return lines


def _quantile(values: list[tuple[float, int]], total: int, quantile: float) -> float:
    """perks' answer while its stream holds every value: the value at place
    ``ceil(total * quantile)`` (from 1) in sorted order; ``NaN`` with no values."""
    if total == 0:
        return math.nan
    place = max(math.ceil(total * quantile), 1)
    seen = 0
    for value, times in values:
        seen += times
        if seen >= place:
            return value
    return values[-1][0]


def _sorted(series: Mapping[Labels, object]) -> list[Labels]:
    return sorted(series, key=lambda labels: (len(labels), [value for _, value in labels]))


def _sample(name: str, labels: Labels, value: float, extra: tuple[str, float] | None = None) -> str:
    """One line: ``name{labels,extra} value``, the extra label (``le``, ``quantile``) last,
    its value a number as Go writes it."""
    pairs = [f'{key}="{_escaped(label, quotes=True)}"' for key, label in labels]
    if extra is not None:
        pairs.append(f'{extra[0]}="{go_float(extra[1])}"')
    if pairs:
        name = f"{name}{{{','.join(pairs)}}}"
    return f"{name} {go_float(value)}\n"


def _escaped(text: str, *, quotes: bool) -> str:
    """The text format's escaping: ``\\`` and newline, and ``"`` in a label value."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quotes else text


def go_float(value: float) -> str:
    """A value as Go's text format writes it (``strconv.FormatFloat(v, 'g', -1, 64)``):
    ``5``, ``0.25``, ``1.234567e+06`` (exponent form from 1e6 up and below 1e-4)."""
    return format_float(value)
