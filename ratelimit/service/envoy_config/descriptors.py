"""envoyproxy/ratelimit's descriptor tree: loading its domains and finding a request's limit.

A domain holds descriptors, nested to any depth, each named by ``key`` or ``key_value``
(a value may hold ``*`` anywhere, several times). :class:`EnvoyConfig.limit_of` is its
``GetLimit``: for each entry of the request's descriptor, the exact ``key_value`` first,
then the wildcards of that level in load order, then the ``key`` alone; a limit counts only
on the node the request's **last** entry reaches (a request that stops above it, or goes
deeper than the config, gets none); a value with neither limit nor children is a whitelist.

The same load errors as its loader (``loadDescriptors``, ``loadConfig``), in its words.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ratelimit.service.envoy_config.ours import rules_of
from ratelimit.service.envoy_config.yaml_go import YamlDescriptor, YamlRoot, error

UNITS: dict[str, int] = {
    "SECOND": 1,
    "MINUTE": 60,
    "HOUR": 3600,
    "DAY": 86_400,
    "WEEK": 7 * 86_400,
    "MONTH": 30 * 86_400,
    "YEAR": 365 * 86_400,
}
"""The protocol's units, by name, and their seconds (``UnitToDivider``: a month is 30 days,
a year 365)."""


@dataclass(frozen=True)
class EnvoyLimit:
    """One ``rate_limit`` of the config, where its loader put it."""

    requests_per_unit: int
    unit: str
    """One of :data:`UNITS`; ``""`` when ``unlimited``."""
    full_key: str
    """Its stat key: ``domain.key_value.subkey`` (``FullKey``)."""
    unlimited: bool = False
    name: str = ""
    replaces: tuple[str, ...] = ()
    shadow_mode: bool = False
    quota_mode: bool = False
    detailed_metric: bool = False
    always_count: bool = False
    """Ours: counted whether or not refused (usage reported after the fact)."""
    rules: str = ""
    """For our algorithms: the limit as rules of this package's grammar (``"10/1s"``,
    ``"10/1s | 100/1m"`` for a ``rate_limit`` list, a ``rule`` as written); ``""`` when it
    admits nothing (0 requests) or is unlimited."""

    @property
    def seconds(self) -> int:
        """The unit's length (0: unlimited)."""
        return UNITS.get(self.unit, 0)


@dataclass
class Node:
    """A domain, or one descriptor of the tree (``rateLimitDescriptor``)."""

    children: dict[str, Node] = field(default_factory=dict)
    limit: EnvoyLimit | None = None
    wildcards: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    """The children whose name holds ``*``, in load order: name and its parts."""
    value_to_metric: bool = False
    share_threshold: bool = False
    pattern: str = ""
    """With ``share_threshold``: its own ``key_value*``."""
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class Matched:
    """What :meth:`EnvoyConfig.limit_of` found for a request's descriptor."""

    limit: EnvoyLimit
    stats_key: str
    """The key its stats count under (``FullKey`` once ``detailed_metric``,
    ``value_to_metric`` and ``share_threshold`` had their say)."""
    shared: tuple[str, ...] = ()
    """Per entry, the wildcard value its counter is shared under (``share_threshold``:
    ``"files*"``), else ``""``; empty when no entry shares one."""
    metadata: dict[str, Any] | None = None


def wildcard_match(parts: Sequence[str], value: str) -> bool:
    """``wildcardMatch``: ``value`` against a pattern split on ``*`` (each ``*`` any run
    of characters, none included)."""
    if len(parts) == 1:
        return parts[0] == value
    first, last = parts[0], parts[-1]
    if not value.startswith(first) or not value.endswith(last):
        return False
    if len(value) < sum(map(len, parts)):
        return False
    remaining = value[len(first) :]
    if last:
        remaining = remaining[: len(remaining) - len(last)]
    for part in parts[1:-1]:
        at = remaining.find(part)
        if at < 0:
            return False
        remaining = remaining[at + len(part) :]
    return True


class EnvoyConfig:
    """The domains of a set of files, loaded in the order given (:meth:`load`)."""

    def __init__(self, merge_domains: bool = False, algorithm: str | None = None) -> None:
        self.domains: dict[str, Node] = {}
        self.merge_domains = merge_domains
        self.algorithm = algorithm
        """Our algorithm the limits are checked for (``None``: its fixed windows)."""

    def load(self, name: str, root: YamlRoot) -> None:
        """``loadConfig``: file ``name``'s domain, added (or, with ``merge_domains``, merged
        into one of the same name)."""
        if root.domain == "":
            raise error(name, "config file cannot have empty domain")
        domain = self.domains.get(root.domain)
        if domain is not None and not self.merge_domains:
            raise error(name, f"duplicate domain '{root.domain}' in config file")
        if domain is None:
            domain = Node()
        _load(name, domain, f"{root.domain}.", root.descriptors, self.algorithm)
        self.domains[root.domain] = domain

    def dump(self) -> str:
        """The limits loaded, one line each, as its ``/rlconfig`` prints them
        (``domain.key_value: unit=MINUTE requests_per_unit=10, shadow_mode: false,
        quota_mode: false``), domains and descriptors in load order."""
        lines: list[str] = []
        for node in self.domains.values():
            _dump(node, lines)
        return "".join(lines)

    def limit_of(self, domain: str, entries: Sequence[tuple[str, str]]) -> Matched | None:
        """``GetLimit`` of a descriptor of ``(key, value)`` entries in ``domain`` (without a
        ``limit`` override of its own); ``None``: no limit applies (an unknown domain, a
        whitelisted value, a request above or below the limit's level)."""
        node = self.domains.get(domain)
        if node is None:
            return None
        found: EnvoyLimit | None = None
        metadata: dict[str, Any] | None = None
        children = node.children
        previous = node
        detailed = [domain]
        enhanced = [domain]
        shared: dict[int, str] = {}
        for i, (key, value) in enumerate(entries):
            final = f"{key}_{value}"
            detailed.append(final)
            following = children.get(final)
            wildcard = ""
            if following is None:
                for name, parts in previous.wildcards:
                    if wildcard_match(parts, final):
                        following, wildcard = children[name], name
                        break
            by_value = following is not None
            if following is None:
                following = children.get(key)
            if wildcard and following is not None and following.share_threshold:
                shared[i] = following.pattern.removeprefix(f"{key}_")
            enhanced.append(_metric_part(key, value, following, wildcard, by_value, shared.get(i)))
            if following is not None and following.limit is not None and i == len(entries) - 1:
                found, metadata = following.limit, following.metadata
            if following is None or not following.children:
                break
            children, previous = following.children, following
        if found is None:
            return None
        patterns = tuple(shared.get(i, "") for i in range(len(entries))) if shared else ()
        stats_key = found.full_key
        if found.detailed_metric:
            if patterns:
                levels = [
                    f"{key}_{patterns[i]}" if patterns[i] else (f"{key}_{value}" if value else key)
                    for i, (key, value) in enumerate(entries)
                ]
                stats_key = ".".join([domain, *levels])
            else:
                stats_key = ".".join(detailed)
        elif ".".join(enhanced) != found.full_key:
            stats_key = ".".join(enhanced)
        return Matched(found, stats_key, patterns, metadata)


def _dump(node: Node, lines: list[str]) -> None:
    limit = node.limit
    if limit is not None:
        unit = limit.unit or "UNKNOWN"
        lines.append(
            f"{limit.full_key}: unit={unit} requests_per_unit={limit.requests_per_unit}, "
            f"shadow_mode: {str(limit.shadow_mode).lower()}, "
            f"quota_mode: {str(limit.quota_mode).lower()}\n"
        )
    for child in node.children.values():
        _dump(child, lines)


def _metric_part(
    key: str, value: str, node: Node | None, wildcard: str, by_value: bool, shared: str | None
) -> str:
    """One level of the ``value_to_metric`` stat key (``valueToMetricFullKey``)."""
    if node is None:
        return key
    used = ""
    if wildcard:
        if shared:
            used = shared
        elif node.value_to_metric:
            used = value
        else:
            used = wildcard.removeprefix(f"{key}_")
    elif by_value or node.value_to_metric:
        used = value
    return f"{key}_{used}" if used else key


def _load(
    name: str,
    parent: Node,
    parent_key: str,
    descriptors: list[YamlDescriptor],
    algorithm: str | None,
) -> None:
    """``loadDescriptors``: ``descriptors`` under ``parent``, checked as its loader checks
    (and, for ``algorithm``, as ours check rules)."""
    for descriptor in descriptors:
        if descriptor.key == "":
            raise error(name, "descriptor has empty key")
        final = descriptor.key if descriptor.value == "" else f"{descriptor.key}_{descriptor.value}"
        full = parent_key + final
        if final in parent.children:
            raise error(name, f"duplicate descriptor composite key '{full}'")
        limit = None
        if descriptor.rate_limit is not None or descriptor.rule:
            limit = _limit(name, descriptor, full)
            if algorithm:
                rules = rules_of(name, descriptor, full, limit.unit, algorithm)
                always = descriptor.always_count
                limit = dataclasses.replace(limit, rules=rules, always_count=always)
        if descriptor.share_threshold and "*" not in final:
            raise error(
                name,
                "share_threshold can only be used with wildcard values (containing '*'), but "
                f"found key '{final}'",
            )
        if "*" in final:
            parent.wildcards.append((final, tuple(final.split("*"))))
        node = Node(
            limit=limit,
            value_to_metric=descriptor.value_to_metric,
            share_threshold=descriptor.share_threshold,
            pattern=final if descriptor.share_threshold else "",
            metadata=descriptor.metadata or None,
        )
        _load(name, node, f"{full}.", descriptor.descriptors, algorithm)
        parent.children[final] = node


def _limit(name: str, descriptor: YamlDescriptor, full: str) -> EnvoyLimit:
    rate = descriptor.rate_limit
    if rate is None:  # ours: a rule alone
        flags = (descriptor.shadow_mode, descriptor.quota_mode, descriptor.detailed_metric)
        return EnvoyLimit(0, "", full, False, "", (), *flags)
    if descriptor.rule and not rate.unit and not rate.requests_per_unit and not rate.unlimited:
        unit = ""  # ours: a rule, named (or replacing) by its rate_limit
    else:
        unit = _unit(name, rate.unit, rate.unlimited)
    for replaced in rate.replaces:
        if replaced == "":
            raise error(name, "should not have an empty replaces entry")
        if replaced == rate.name:
            raise error(name, "replaces should not contain name of same descriptor")
    return EnvoyLimit(
        rate.requests_per_unit,
        unit,
        full,
        rate.unlimited,
        rate.name,
        tuple(rate.replaces),
        descriptor.shadow_mode,
        descriptor.quota_mode,
        descriptor.detailed_metric,
    )


def _unit(name: str, unit: str, unlimited: bool) -> str:
    """A ``rate_limit``'s unit, checked as its loader checks it (``""``: unlimited)."""
    upper = unit.upper()
    valid = upper in UNITS
    if unlimited:
        if valid:
            raise error(name, "should not specify rate limit unit when unlimited")
        return ""
    if not valid:
        raise error(name, f"invalid rate limit unit '{unit}'")
    return upper
