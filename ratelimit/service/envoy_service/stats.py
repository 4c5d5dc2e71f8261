"""envoyproxy/ratelimit's stats, by its names (``src/stats/manager_impl.go``).

Every counter is kept under its whole statsd name: ``ratelimit.service.rate_limit.<key>.
total_hits`` and its siblings per limit (:class:`LimitStats`, ``<key>`` the limit's stat key
with ``:`` and ``|`` made ``_`` and the dots of an IPv4 address made ``_``, as its
``SanitizeStatName``), ``ratelimit.service.rate_limit.<domain>.domain_not_found``,
``ratelimit.service.config_load_success`` / ``config_load_error`` /
``global_shadow_mode``, ``ratelimit.service.call.should_rate_limit.redis_error`` /
``service_error``. The sinks (statsd, Prometheus) read :attr:`EnvoyStats.counters`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IPV4 = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
SERVICE = "ratelimit.service"
RATE_LIMIT = f"{SERVICE}.rate_limit"
CALL = f"{SERVICE}.call.should_rate_limit"


def sanitized(name: str) -> str:
    """``SanitizeStatName``: ``:`` and ``|`` become ``_``, and so do an IPv4 address's dots."""
    name = name.replace(":", "_").replace("|", "_")
    return _IPV4.sub(lambda m: m.group(0).replace(".", "_"), name)


class Counter:
    """One counter: its whole name and its value since start."""

    __slots__ = ("name", "value")

    def __init__(self, name: str) -> None:
        self.name = name
        self.value = 0

    def add(self, n: int = 1) -> None:
        self.value += n


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
    """Every counter the service has made, by whole name; made on first use, kept."""

    def __init__(self) -> None:
        self.counters: dict[str, Counter] = {}
        self._limits: dict[str, LimitStats] = {}
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
