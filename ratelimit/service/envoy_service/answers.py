"""``ShouldRateLimit`` answered as envoyproxy/ratelimit answers it (``src/service/
ratelimit.go``, ``src/limiter/base_limiter.go``, ``src/redis/fixed_cache_impl.go``).

For each descriptor of a request, its limit: the request's own ``limit`` when it has one
(counted under the descriptor's entries), else the configuration's (``GetLimit``). Then:

- a limit ``replaces`` the limits named so (by any descriptor of the request), and an
  ``unlimited`` one answers ``OK`` with ``limit_remaining`` 4294967295, counting nothing;
- every other limited descriptor adds its hits (its own ``hits_addend``, which may be 0 to
  only look; else the request's, at least 1) to its window, refused or not (a key the local
  cache knows is over its limit adds nothing: refused at once);
- a descriptor is ``OVER_LIMIT`` once its window's count passes ``requests_per_unit``
  (``OK`` in ``shadow_mode``), with ``limit_remaining`` what is left and
  ``duration_until_reset`` the time to the window's end;
- the request is ``OVER_LIMIT`` when a descriptor not in ``quota_mode`` is, or when every
  descriptor in ``quota_mode`` is (``QUOTA_MODE`` puts all in it), and ``OK`` whatever
  they say under ``SHADOW_MODE``;
- with ``LIMIT_RESPONSE_HEADERS_ENABLED``, the headers of the descriptor nearest its limit
  (a refusing one first); with ``RESPONSE_DYNAMIC_METADATA``, the request and the merged
  ``metadata`` of the descriptors that passed.

Stats as it keeps them (:mod:`.stats`): per limit ``total_hits``, ``over_limit``,
``near_limit`` (past ``NEAR_LIMIT_RATIO`` of the limit), ``over_limit_with_local_cache``,
``within_limit``, ``shadow_mode``; ``domain_not_found`` per descriptor of an unknown domain.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.struct_pb2 import Struct, Value

from ratelimit.backends.redis.envoy.windows import Count
from ratelimit.service.envoy_config import UNITS, EnvoyConfig, EnvoyLimit
from ratelimit.service.envoy_service.counting import Counts, OverLimitCache
from ratelimit.service.envoy_service.stats import EnvoyStats, LimitStats
from ratelimit.service.proto.envoy import rls_pb2
from ratelimit.service.proto.envoy.common_pb2 import RateLimitDescriptor
from ratelimit.service.proto.envoy.core_pb2 import HeaderValue

RLS = rls_pb2.RateLimitResponse
MAX_UINT32 = 4_294_967_295
WRAPPED = 1 << 64
"""A count before the hits that Go's unsigned arithmetic wraps: above every threshold."""
UNIT_NAMES: dict[int, str] = {int(v): k for k, v in RLS.RateLimit.Unit.items() if k != "UNKNOWN"}
"""The protocol's units by number (``SECOND`` is 1, ``WEEK`` 7)."""


class ServiceError(ValueError):
    """A request its service refuses with an error (``serviceError``: an empty domain, no
    descriptors); the text is its own."""


class BadUnit(ValueError):
    """A request's ``limit`` in a unit the protocol does not define."""


@dataclass(frozen=True, slots=True)
class Answering:
    """The settings an answer depends on (from the environment, kept across reloads)."""

    shadow_mode: bool = False
    quota_mode: bool = False
    near_limit_ratio: float = 0.8
    cache_key_prefix: str = ""
    jitter_seconds: int = 0
    stop_increment_when_over: bool = False
    headers: tuple[str, str, str] | None = None
    """``(limit, remaining, reset)`` header names when ``LIMIT_RESPONSE_HEADERS_ENABLED``."""
    dynamic_metadata: bool = False


@dataclass(frozen=True, slots=True)
class Found:
    """A descriptor's limit as the request finds it: the limit, the key its stats count
    under, the wildcard its counter is shared under per entry, its metadata."""

    limit: EnvoyLimit
    stats: LimitStats
    shared: tuple[str, ...] = ()
    metadata: dict[str, Any] | None = None


def float32(x: float) -> float:
    """``x`` as Go's ``float32`` holds it."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


class EnvoyAnswers:
    """``ShouldRateLimit`` on a configuration (``config``, swapped whole on a reload; ``None``
    before one loaded), counted on ``counts``."""

    def __init__(
        self,
        config: EnvoyConfig | None,
        counts: Counts,
        stats: EnvoyStats,
        answering: Answering = Answering(),
        local_cache: OverLimitCache | None = None,
        clock: Callable[[], float] = time.time,
        jitter: Callable[[int], int] | None = None,
    ) -> None:
        self.config = config
        self.counts = counts
        self.stats = stats
        self.answering = answering
        self.local_cache = local_cache
        self.clock = clock
        self.jitter = jitter
        self.near_ratio = float32(answering.near_limit_ratio)

    async def should_rate_limit(self, request: rls_pb2.RateLimitRequest) -> RLS:
        try:
            return await self._answer(request)
        except ServiceError:
            self.stats.service_error.add()
            raise

    async def _answer(self, request: rls_pb2.RateLimitRequest) -> RLS:
        if not request.domain:
            raise ServiceError("rate limit domain must not be empty")
        if not request.descriptors:
            raise ServiceError("rate limit descriptor list must not be empty")
        config = self.config
        if config is None:
            raise ServiceError("no rate limit configuration loaded")
        found, unlimited = self._limits(config, request)
        statuses = await self._counted(request, found)
        return self._answered(request, found, unlimited, statuses)

    def _limits(
        self, config: EnvoyConfig, request: rls_pb2.RateLimitRequest
    ) -> tuple[list[Found | None], list[bool]]:
        """``constructLimitsToCheck``: each descriptor's limit (``None``: none, replaced
        or unlimited) and whether it is unlimited."""
        found: list[Found | None] = []
        unlimited: list[bool] = []
        replacing: set[str] = set()
        known = request.domain in config.domains
        for n, descriptor in enumerate(request.descriptors):
            one = self._limit_of(config, request.domain, known, descriptor, n)
            if one is not None:
                replacing.update(one.limit.replaces)
                if one.limit.unlimited:
                    unlimited.append(True)
                    found.append(None)
                    continue
            unlimited.append(False)
            found.append(one)
        if replacing:
            found = [
                None if f is not None and f.limit.name and f.limit.name in replacing else f
                for f in found
            ]
        return found, unlimited

    def _limit_of(
        self,
        config: EnvoyConfig,
        domain: str,
        known: bool,
        descriptor: RateLimitDescriptor,
        n: int,
    ) -> Found | None:
        """``GetLimit``: a request's own ``limit`` (in a domain the config knows) replaces
        the config's, with no shadow or quota mode."""
        if not known:
            self.stats.domain_not_found(domain).add()
            return None
        entries = [(e.key, e.value) for e in descriptor.entries]
        if descriptor.HasField("limit"):
            unit = UNIT_NAMES.get(descriptor.limit.unit)
            if unit is None:
                raise BadUnit(
                    f"descriptor {n}: limit.unit {descriptor.limit.unit} is not a unit of the "
                    "protocol (SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR)"
                )
            parts = (key if not value else f"{key}_{value}" for key, value in entries)
            key = f"{domain}.{'.'.join(parts)}"
            limit = EnvoyLimit(descriptor.limit.requests_per_unit, unit, key)
            return Found(limit, self.stats.limit(key))
        matched = config.limit_of(domain, entries)
        if matched is None:
            return None
        return Found(
            matched.limit, self.stats.limit(matched.stats_key), matched.shared, matched.metadata
        )

    async def _counted(
        self, request: rls_pb2.RateLimitRequest, found: Sequence[Found | None]
    ) -> list[RLS.DescriptorStatus]:
        """``DoLimit``: each limited descriptor's window counted, and its status."""
        answering = self.answering
        now = int(self.clock())
        hits = [hits_of(request, d) for d in request.descriptors]
        keys: list[str] = []
        for n, one in enumerate(found):
            if one is None:
                keys.append("")
                continue
            keys.append(self._key(request.domain, request.descriptors[n], one, now))
            one.stats.total_hits.add(hits[n])
        cache = self.local_cache
        cached = [bool(key) and cache is not None and key in cache for key in keys]
        limited = [(n, one) for n, one in enumerate(found) if one is not None and not cached[n]]
        adding = hits
        if answering.stop_increment_when_over and any(cached):
            adding = [0] * len(hits)  # a key over its limit: the others only look
        elif answering.stop_increment_when_over and limited:
            adding = await self._stopping(limited, keys, hits)
        counts = [
            Count(keys[n], adding[n], self._seconds(one.limit), one.limit.unit == "SECOND")
            for n, one in limited
        ]
        values = await self.counts.add(counts) if counts else []
        after = {n: value for (n, _), value in zip(limited, values, strict=True)}
        statuses = []
        for n, one in enumerate(found):
            if one is None:
                statuses.append(RLS.DescriptorStatus(code=RLS.OK))
            else:
                statuses.append(
                    self._status(one, keys[n], cached[n], after.get(n, 0), hits[n], now)
                )
        return statuses

    async def _stopping(
        self, limited: Sequence[tuple[int, Found]], keys: list[str], hits: list[int]
    ) -> list[int]:
        """``STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT``: the hits each key adds, once the
        counts were read: all when no key would pass its limit, else only those of the keys
        that would (``getHitsAddend``)."""
        asked = [Count(keys[n], 0, 0, one.limit.unit == "SECOND") for n, one in limited]
        now = await self.counts.read(asked)
        passing = {
            n
            for (n, one), value in zip(limited, now, strict=True)
            if value + hits[n] > one.limit.requests_per_unit
        }
        if not passing:
            return hits
        return [hits[n] if n in passing else 0 for n in range(len(hits))]

    def _key(self, domain: str, descriptor: RateLimitDescriptor, one: Found, now: int) -> str:
        """``GenerateCacheKey``."""
        parts = [self.answering.cache_key_prefix, domain, "_"]
        shared = one.shared
        for i, entry in enumerate(descriptor.entries):
            value = shared[i] if i < len(shared) and shared[i] else entry.value
            parts += [entry.key, "_", value, "_"]
        divider = one.limit.seconds
        parts.append(str(now // divider * divider))
        return "".join(parts)

    def _seconds(self, limit: EnvoyLimit) -> int:
        """A window key's lifetime: its unit, and up to ``EXPIRATION_JITTER_MAX_SECONDS``
        more."""
        seconds = limit.seconds
        if self.jitter is not None and self.answering.jitter_seconds > 0:
            seconds += self.jitter(self.answering.jitter_seconds)
        return seconds

    def _status(
        self, one: Found, key: str, cached: bool, after: int, hits: int, now: int
    ) -> RLS.DescriptorStatus:
        """``GetResponseDescriptorStatus``."""
        limit, stats = one.limit, one.stats
        allowed = limit.requests_per_unit
        status = RLS.DescriptorStatus(code=RLS.OK)
        status.current_limit.CopyFrom(
            RLS.RateLimit(
                name=limit.name,
                requests_per_unit=allowed,
                unit=RLS.RateLimit.Unit.Value(limit.unit),
            )
        )
        status.duration_until_reset.seconds = limit.seconds - now % limit.seconds
        # Go's uint64: a count read below the hits (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
        # added none) wraps above every threshold
        before = after - hits if after >= hits else WRAPPED
        over = cached or after > allowed
        if cached:
            stats.over_limit.add(hits)
            stats.over_limit_with_local_cache.add(hits)
        else:
            near = math.floor(float32(float32(allowed) * self.near_ratio))
            if after > allowed:
                if before >= allowed:
                    stats.over_limit.add(hits)
                else:
                    stats.over_limit.add(after - allowed)
                    stats.near_limit.add(allowed - max(near, before))
                if self.local_cache is not None:
                    self.local_cache.add(key, limit.seconds)
            else:
                status.limit_remaining = allowed - after
                if after > near:
                    stats.near_limit.add(hits if before >= near else after - near)
                stats.within_limit.add(hits)
        if over:
            status.code = RLS.OVER_LIMIT
            if limit.shadow_mode:
                status.code = RLS.OK
                shadowed = hits if cached or before >= allowed else after - allowed
                stats.shadow_mode.add(shadowed)
        return status

    def _answered(
        self,
        request: rls_pb2.RateLimitRequest,
        found: Sequence[Found | None],
        unlimited: Sequence[bool],
        statuses: list[RLS.DescriptorStatus],
    ) -> RLS:
        """``shouldRateLimitWorker``'s answer from the statuses."""
        answering = self.answering
        answer = RLS()
        least = MAX_UINT32
        nearest: RLS.DescriptorStatus | None = None
        passed: list[int] = []
        refused = quota_refused = quota = 0
        for n, status in enumerate(statuses):
            if (
                answering.headers is not None
                and status.HasField("current_limit")
                and status.limit_remaining < least
            ):
                nearest, least = status, status.limit_remaining
            if unlimited[n]:
                answer.statuses.add(code=RLS.OK, limit_remaining=MAX_UINT32)
                continue
            answer.statuses.append(status)
            one = found[n]
            in_quota = answering.quota_mode or (one is not None and one.limit.quota_mode)
            if status.code == RLS.OVER_LIMIT:
                if in_quota:
                    quota_refused += 1
                else:
                    refused += 1
                    nearest, least = status, 0
            else:
                passed.append(n)
            quota += in_quota
        over = refused > 0 or (quota > 0 and quota == quota_refused)
        if answering.headers is not None and nearest is not None:
            answer.response_headers_to_add.extend(self._headers(nearest))
        if over and answering.shadow_mode:
            over = False
            self.stats.global_shadow_mode.add()
        if answering.dynamic_metadata:
            answer.dynamic_metadata.CopyFrom(_metadata(request, passed, found))
        answer.overall_code = RLS.OVER_LIMIT if over else RLS.OK
        return answer

    def _headers(self, status: RLS.DescriptorStatus) -> list[HeaderValue]:
        assert self.answering.headers is not None
        limit_name, remaining_name, reset_name = self.answering.headers
        seconds = UNITS[UNIT_NAMES[status.current_limit.unit]]
        reset = seconds - int(self.clock()) % seconds
        return [
            HeaderValue(key=limit_name, value=str(status.current_limit.requests_per_unit)),
            HeaderValue(key=remaining_name, value=str(status.limit_remaining)),
            HeaderValue(key=reset_name, value=str(reset)),
        ]


def hits_of(request: rls_pb2.RateLimitRequest, descriptor: RateLimitDescriptor) -> int:
    """``GetHitsAddends``: the descriptor's own ``hits_addend`` (0 only looks), else the
    request's, at least 1."""
    if descriptor.HasField("hits_addend"):
        return descriptor.hits_addend.value
    return max(1, request.hits_addend)


def _metadata(
    request: rls_pb2.RateLimitRequest, passed: Sequence[int], found: Sequence[Found | None]
) -> Struct:
    """``ratelimitToMetadata``: the domain, each descriptor (entries as ``key=value``, its
    ``limit`` and ``hitsAddend``), the request's ``hitsAddend``, and the ``metadata`` of
    the descriptors that passed, merged (the first to give a field keeps it, structs merged
    field by field)."""
    out = Struct()
    out.fields["domain"].string_value = request.domain
    described = out.fields["descriptors"].list_value
    for descriptor in request.descriptors:
        one = described.values.add().struct_value
        entries = one.fields["entries"].list_value
        entries.SetInParent()  # [] for none, as its service writes it
        for entry in descriptor.entries:
            entries.values.add().string_value = f"{entry.key}={entry.value}"
        if descriptor.HasField("limit"):
            one.fields["limit"].string_value = _override_text(descriptor)
        if descriptor.HasField("hits_addend"):
            one.fields["hitsAddend"].number_value = descriptor.hits_addend.value
    if request.hits_addend:
        out.fields["hitsAddend"].number_value = request.hits_addend
    merged = Struct()
    for n in passed:
        limit = found[n]
        if limit is not None and limit.metadata:
            source = Struct()
            source.update(limit.metadata)
            _merge(merged, source)
    if merged.fields:
        out.fields["metadata"].struct_value.CopyFrom(merged)
    return out


def _override_text(descriptor: RateLimitDescriptor) -> str:
    """A descriptor's ``limit`` as Go's prototext writes it (fields at zero left out)."""
    parts = []
    if descriptor.limit.requests_per_unit:
        parts.append(f"requests_per_unit:{descriptor.limit.requests_per_unit}")
    if descriptor.limit.unit:
        unit = UNIT_NAMES.get(descriptor.limit.unit, str(descriptor.limit.unit))
        parts.append(f"unit:{unit}")
    return " ".join(parts)


def _merge(into: Struct, source: Struct) -> None:
    """``mergeMetadata``: fields ``into`` lacks are added; two structs merge."""
    for name, value in source.fields.items():
        if name not in into.fields:
            into.fields[name].CopyFrom(value)
            continue
        have: Value = into.fields[name]
        if have.HasField("struct_value") and value.HasField("struct_value"):
            _merge(have.struct_value, value.struct_value)
