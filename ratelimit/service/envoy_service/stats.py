"""envoyproxy/ratelimit's stats, by its names (``src/stats/manager_impl.go``).

Every counter is kept under its whole statsd name: ``ratelimit.service.rate_limit.<key>.
total_hits`` and its siblings per limit (:class:`LimitStats`, ``<key>`` the limit's stat key
with ``:`` and ``|`` made ``_`` and the dots of an IPv4 address made ``_``, as its
``SanitizeStatName``), ``ratelimit.service.rate_limit.<domain>.domain_not_found``,
``ratelimit.service.config_load_success`` / ``config_load_error`` /
``global_shadow_mode``, ``ratelimit.service.call.should_rate_limit.redis_error`` /
``service_error``; and the gRPC interceptor's (``src/metrics/metrics.go``), for every unary
RPC (``ShouldRateLimit``, the health ``Check``): the counter
``ratelimit_server.<Method>.total_requests`` and the timer
``ratelimit_server.<Method>.response_time`` (:meth:`EnvoyStats.rpc`). The sinks (statsd,
Prometheus) read :attr:`EnvoyStats.counters` and :attr:`EnvoyStats.timers`, and write a
name with its tags as gostats does (:func:`statsd_name`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_IPV4 = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
_TAG_VALUE = str.maketrans(".:|", "___")
SERVICE = "ratelimit.service"
RATE_LIMIT = f"{SERVICE}.rate_limit"
CALL = f"{SERVICE}.call.should_rate_limit"
SERVER = "ratelimit_server"
"""The scope of the gRPC interceptor's stats (``NewServerReporter``)."""


def sanitized(name: str) -> str:
    """``SanitizeStatName``: ``:`` and ``|`` become ``_``, and so do an IPv4 address's dots."""
    name = name.replace(":", "_").replace("|", "_")
    return _IPV4.sub(lambda m: m.group(0).replace(".", "_"), name)


def statsd_name(name: str, tags: Mapping[str, str]) -> str:
    """``name`` with ``tags`` appended as gostats serializes them: ``.__<key>=<value>``
    sorted by key, a value's ``.``, ``:`` and ``|`` made ``_``, empty keys or values left
    out. ``statsd_name("a.b", {"env": "prod"}) == "a.b.__env=prod"``."""
    pairs = sorted(
        (key, value.translate(_TAG_VALUE)) for key, value in tags.items() if key and value
    )
    return name + "".join(f".__{key}={value}" for key, value in pairs)


class Counter:
    """One counter: its whole name and its value since start."""

    __slots__ = ("name", "value")

    def __init__(self, name: str) -> None:
        self.name = name
        self.value = 0

    def add(self, n: int = 1) -> None:
        self.value += n


class Timer:
    """One timer, as gostats' milli timer: each value recorded in whole milliseconds, cut
    toward zero as Go's ``Duration.Milliseconds()`` cuts them (``3.9`` ms is ``3``).

    gostats hands every value to its sink as it is recorded; here a timer keeps how many
    times it got each value since start (:attr:`counts`, ``{milliseconds: times}``), which
    is all its sinks need: statsd sends the values got since its last flush, Prometheus
    counts them into buckets or quantiles when scraped. Its size is bounded by the number
    of distinct durations (a few thousand for RPCs that take up to seconds), not by the
    number of values.

    Example::

        timer = EnvoyStats().timer("ratelimit_server.ShouldRateLimit.response_time")
        timer.record(0.0031)  # 3 ms
        timer.counts == {3: 1}
    """

    __slots__ = ("counts", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: dict[int, int] = {}

    def record(self, seconds: float) -> None:
        """Record a duration of ``seconds`` (a finite number, as a clock's difference)."""
        ns = round(seconds * 1e9)  # Go measures whole nanoseconds, then cuts toward zero
        milliseconds = ns // 1_000_000 if ns >= 0 else -(-ns // 1_000_000)
        counts = self.counts
        counts[milliseconds] = counts.get(milliseconds, 0) + 1

    @property
    def count(self) -> int:
        """How many values were recorded since start."""
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class LimitStats:
    """The counters of one limit's stat key (``RateLimitStats``)."""

    total_hits: Counter
    over_limit: Counter
    near_limit: Counter
    over_limit_with_local_cache: Counter
    within_limit: Counter
    shadow_mode: Counter


class EnvoyStats:
    """Every counter and timer the service has made, by whole name; made on first use, kept.

    Example::

        stats = EnvoyStats()
        stats.limit("mydomain.key_value").total_hits.add(1)
        stats.rpc("ShouldRateLimit", 0.004)  # the interceptor's two stats, in one call
    """

    def __init__(self) -> None:
        self.counters: dict[str, Counter] = {}
        self.timers: dict[str, Timer] = {}
        self._limits: dict[str, LimitStats] = {}
        self._rpcs: dict[str, tuple[Counter, Timer]] = {}
        self.config_load_success = self.counter(f"{SERVICE}.config_load_success")
        self.config_load_error = self.counter(f"{SERVICE}.config_load_error")
        self.global_shadow_mode = self.counter(f"{SERVICE}.global_shadow_mode")
        self.redis_error = self.counter(f"{CALL}.redis_error")
        self.service_error = self.counter(f"{CALL}.service_error")

    def counter(self, name: str) -> Counter:
        found = self.counters.get(name)
        if found is None:
            found = self.counters[name] = Counter(name)
        return found

    def timer(self, name: str) -> Timer:
        found = self.timers.get(name)
        if found is None:
            found = self.timers[name] = Timer(name)
        return found

    def rpc(self, method: str, seconds: float) -> None:
        """One unary RPC ``method`` (``"ShouldRateLimit"``, ``"Check"``: the last part of
        its full name) answered in ``seconds``, as Go's interceptor counts every unary RPC:
        ``ratelimit_server.<method>.total_requests`` counts it and
        ``ratelimit_server.<method>.response_time`` records its time. Streaming RPCs (the
        health ``Watch``) are not counted, as in Go."""
        found = self._rpcs.get(method)
        if found is None:
            found = self._rpcs[method] = (
                self.counter(f"{SERVER}.{method}.total_requests"),
                self.timer(f"{SERVER}.{method}.response_time"),
            )
        requests, response_time = found
        requests.value += 1
        response_time.record(seconds)

    def limit(self, key: str) -> LimitStats:
        """The counters of stat key ``key`` (``domain.key_value...``, as the config says)."""
        found = self._limits.get(key)
        if found is None:
            base = f"{RATE_LIMIT}.{sanitized(key)}"
            found = self._limits[key] = LimitStats(
                *(
                    self.counter(f"{base}.{stat}")
                    for stat in (
                        "total_hits",
                        "over_limit",
                        "near_limit",
                        "over_limit_with_local_cache",
                        "within_limit",
                        "shadow_mode",
                    )
                )
            )
        return found

    def domain_not_found(self, domain: str) -> Counter:
        return self.counter(f"{RATE_LIMIT}.{sanitized(domain)}.domain_not_found")
