"""statsd_exporter's mapping (v0.26.1, which envoyproxy/ratelimit links) of a statsd name to a
Prometheus name and labels, for :class:`~ratelimit.service.envoy_service.prometheus.PrometheusSink`.

The Go service hands each counter's flushed increase, and each value of a timer, to
statsd_exporter's mapper, loaded from ``default_mapper.yaml`` (:data:`DEFAULT_MAPPER_YAML`)
or ``PROMETHEUS_MAPPER_YAML`` (:meth:`StatsdMapper.from_file`), and the exporter registers
the mapped name as it is, or the escaped statsd name (:func:`escape_metric_name`) when no
rule maps it. A timer's values are observed into a histogram or a summary (:class:`Histogram`,
:class:`Summary`): as its rule's ``observer_type`` (or the older ``timer_type``) says, else
as ``defaults`` says, else a summary; its buckets and quantiles are the rule's, else the
defaults', else client_golang's (:data:`DEFAULT_BUCKETS`, :data:`DEFAULT_QUANTILES`). The
service keeps no gauges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ratelimit.service.envoy_config.yaml_go import ConfigFileError
from ratelimit.service.envoy_service.mapper_file import (
    DEFAULT_BUCKETS,
    DEFAULT_HELP,
    DEFAULT_QUANTILES,
    GO_DEFAULTS,
    Histogram,
    MapperDefaults,
    MappingRule,
    Observer,
    Summary,
    read_mapper,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_HELP",
    "DEFAULT_MAPPER_YAML",
    "DEFAULT_QUANTILES",
    "Histogram",
    "Mapped",
    "MetricType",
    "StatsdMapper",
    "Summary",
    "escape_metric_name",
]

DEFAULT_MAPPER_YAML = r"""
# The mappings envoyproxy/ratelimit gives statsd_exporter (src/stats/prom/default_mapper.yaml)
mappings:
  # a limit of one descriptor: ratelimit.service.rate_limit.<domain>.<key_value>.<stat>
  - {match: "ratelimit.service.rate_limit.*.*.near_limit", timer_type: histogram,
     name: ratelimit_service_rate_limit_near_limit, labels: {domain: "$1", key1: "$2"}}
  - {match: "ratelimit.service.rate_limit.*.*.over_limit", timer_type: histogram,
     name: ratelimit_service_rate_limit_over_limit, labels: {domain: "$1", key1: "$2"}}
  - {match: "ratelimit.service.rate_limit.*.*.total_hits", timer_type: histogram,
     name: ratelimit_service_rate_limit_total_hits, labels: {domain: "$1", key1: "$2"}}
  - {match: "ratelimit.service.rate_limit.*.*.within_limit", timer_type: histogram,
     name: ratelimit_service_rate_limit_within_limit, labels: {domain: "$1", key1: "$2"}}
  - {match: "ratelimit.service.rate_limit.*.*.shadow_mode", timer_type: histogram,
     name: ratelimit_service_rate_limit_shadow_mode, labels: {domain: "$1", key1: "$2"}}

  # nested descriptors: the first two keys below the domain are labels, deeper ones are not
  - match: 'ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.near_limit'
    match_type: regex
    timer_type: histogram
    name: ratelimit_service_rate_limit_near_limit
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: 'ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.over_limit'
    match_type: regex
    timer_type: histogram
    name: ratelimit_service_rate_limit_over_limit
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: 'ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.total_hits'
    match_type: regex
    timer_type: histogram
    name: ratelimit_service_rate_limit_total_hits
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: 'ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.within_limit'
    match_type: regex
    timer_type: histogram
    name: ratelimit_service_rate_limit_within_limit
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: 'ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.shadow_mode'
    match_type: regex
    timer_type: histogram
    name: ratelimit_service_rate_limit_shadow_mode
    labels: {domain: "$1", key1: "$2", key2: "$3"}

  - {match: "ratelimit.service.call.should_rate_limit.*", match_metric_type: counter,
     name: ratelimit_service_should_rate_limit_error, labels: {err_type: "$1"}}

  - {match: "ratelimit_server.*.total_requests", match_metric_type: counter,
     name: ratelimit_service_total_requests, labels: {grpc_method: "$1"}}
  - {match: "ratelimit_server.*.response_time", timer_type: histogram, scale: 0.001,
     name: ratelimit_service_response_time_seconds, labels: {grpc_method: "$1"}}

  - {match: "ratelimit.service.config_load_success", match_metric_type: counter,
     name: ratelimit_service_config_load_success}
  - {match: "ratelimit.service.config_load_error", match_metric_type: counter,
     name: ratelimit_service_config_load_error}
"""
"""statsd_exporter's mappings for the service's stats, as the Go service ships them."""
_RESPONSE_TIME_SCALE = " scale: 0.001,"  # what PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS removes


_GLOB_REFERENCE = re.compile(r"\$\{?([a-zA-Z0-9_$]+)\}?")
_GO_REFERENCE = re.compile(r"\{(\w+)\}|(\w+)")
_VALID_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def escape_metric_name(name: str) -> str:
    """statsd_exporter's ``EscapeMetricName``, for a name no rule maps (and for a mapped
    one): every character but ``[a-zA-Z0-9_]`` becomes ``_``, a dash right after a dash is
    left out, and a leading digit gets a ``_`` before it.
    ``escape_metric_name("ratelimit.a-b") == "ratelimit_a_b"``."""
    escaped = ["_"] if name[:1].isascii() and name[:1].isdigit() else []
    previous = ""
    for char in name:
        if char in _VALID_NAME_CHARS:
            escaped.append(char)
        elif char == "-" and previous == "-":
            continue
        else:
            escaped.append("_")
        previous = char
    return "".join(escaped)


MetricType = Literal["counter", "observer"]


@dataclass(frozen=True, slots=True)
class Mapped:
    """Where a statsd name goes in Prometheus: a family name and its labels (sorted by
    label name), the family's help, the ``scale`` a value is multiplied by, and for a
    timer's values what they are observed into (``None`` for a counter)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    help: str = DEFAULT_HELP
    scale: float | None = None
    observer: Observer | None = None


class StatsdMapper:
    """statsd_exporter's mapping (v0.26, which the Go service links) of a counter's or a
    timer's statsd name to a Prometheus name and labels, from its YAML (``mappings``;
    ``defaults``' ``match_type``, ``observer_type``, buckets and quantiles).

    A rule's ``match`` is a glob (``*`` stands for one whole dot-separated part) or, with
    ``match_type: regex``, a regular expression searched for anywhere in the name. Globs
    are tried first: of those that match, the first in the file wins (a glob ending where
    an earlier, longer glob passes never matches, as in its state machine); then the
    regexes, in order. A rule with ``match_metric_type`` (``counter``; ``observer`` or
    ``timer``) maps only that kind. ``name`` and ``labels`` take ``$1``, ``${1}`` from the
    captures; ``action: drop`` drops the stat. A name no rule maps is escaped
    (:func:`escape_metric_name`).

    Example::

        StatsdMapper.default().map("ratelimit.service.rate_limit.d.k_v.total_hits")
        # Mapped("ratelimit_service_rate_limit_total_hits", (("domain", "d"), ("key1", "k_v")))
        StatsdMapper.default().map("ratelimit_server.Check.response_time", "observer")
        # Mapped("ratelimit_service_response_time_seconds", (("grpc_method", "Check"),),
        #        scale=0.001, observer=Histogram(DEFAULT_BUCKETS))
    """

    def __init__(self, rules: list[MappingRule], defaults: MapperDefaults | None = None) -> None:
        self._regexes = [rule for rule in rules if rule.regex is not None]
        globs = [rule for rule in rules if rule.regex is None]
        self._globs = {kind: _glob_states(globs, kind) for kind in ("counter", "observer")}
        self._unmapped = (defaults or GO_DEFAULTS).observer()

    @classmethod
    def default(cls, *, response_time_as_milliseconds: bool = False) -> StatsdMapper:
        """The Go service's own mappings (:data:`DEFAULT_MAPPER_YAML`); with
        ``response_time_as_milliseconds`` (``PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS``),
        without the response time's ``scale: 0.001``, as the Go service takes it out: its
        histogram ``ratelimit_service_response_time_seconds`` then counts milliseconds,
        into the same buckets."""
        text = DEFAULT_MAPPER_YAML
        if response_time_as_milliseconds:
            text = text.replace(_RESPONSE_TIME_SCALE, "", 1)
        return cls.from_yaml(text, "default_mapper.yaml")

    @classmethod
    def from_file(cls, path: str | Path) -> StatsdMapper:
        """The mappings of a file (``PROMETHEUS_MAPPER_YAML``)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigFileError(f"{path}: {exc.strerror or exc}") from exc
        return cls.from_yaml(text, str(path))

    @classmethod
    def from_yaml(cls, text: str, source: str = "<mapper>") -> StatsdMapper:
        """The mappings of a YAML text; :class:`ConfigFileError` (``"<source>: ..."``, in
        statsd_exporter's words) for one it refuses (:func:`.mapper_file.read_mapper`)."""
        return cls(*read_mapper(text, source))

    def map(self, name: str, metric_type: MetricType = "counter") -> Mapped | None:
        """Where the counter (or, with ``"observer"``, the timer) ``name`` goes; ``None``:
        dropped (``action: drop``, or a mapping whose name came out empty)."""
        rule, name_, labels = self._rule_for(name, metric_type)
        if rule is None:
            if not name:
                return None
            observer = self._unmapped if metric_type == "observer" else None
            return Mapped(escape_metric_name(name), observer=observer)
        if rule.drop or not name_:
            return None
        return Mapped(
            escape_metric_name(name_),
            tuple(sorted(labels)),
            rule.help,
            rule.scale,
            rule.observer if metric_type == "observer" else None,
        )

    def _rule_for(
        self, name: str, metric_type: MetricType
    ) -> tuple[MappingRule | None, str, list[tuple[str, str]]]:
        fields = name.split(".")
        for pattern, rule in self._globs[metric_type]:
            if len(pattern) == len(fields) and all(
                part in ("*", field) for part, field in zip(pattern, fields, strict=True)
            ):
                captures = [f for p, f in zip(pattern, fields, strict=True) if p == "*"]
                return (
                    rule,
                    _glob_format(rule.name, captures),
                    [(key, _glob_format(value, captures)) for key, value in rule.labels],
                )
        for rule in self._regexes:
            assert rule.regex is not None
            found = rule.regex.search(name)
            if found is None or rule.metric_type not in ("", metric_type):
                continue
            labels = [(key, _go_expand(value, found)) for key, value in rule.labels]
            return rule, _go_expand(rule.name, found), labels
        return None, "", []


def _glob_states(
    globs: list[MappingRule], metric_type: str
) -> list[tuple[tuple[str, ...], MappingRule]]:
    """The glob state machine's final states for one metric type, by the parts leading to
    them, in the order they win: the rule that made each (a state an earlier, longer glob
    made on its way keeps no rule), ranked by the place in the file of the last glob that
    ended there (every glob counts, whatever its type)."""
    made_by: dict[tuple[str, ...], MappingRule | None] = {}
    priority: dict[tuple[str, ...], int] = {}
    for place, rule in enumerate(globs):
        if rule.metric_type not in ("", metric_type):
            continue
        parts = tuple(rule.match.split("."))
        for end in range(1, len(parts) + 1):
            made_by.setdefault(parts[:end], rule if end == len(parts) else None)
        priority[parts] = place
    return [
        (parts, rule)
        for parts, rule in sorted(made_by.items(), key=lambda item: priority.get(item[0], 0))
        if rule is not None
    ]


def _glob_format(template: str, captures: list[str]) -> str:
    """A glob rule's template (``TemplateFormatter``): ``$n``/``${n}`` is the n-th ``*``'s
    part; a reference that is no capture's number is left out."""

    def capture(reference: re.Match[str]) -> str:
        number = reference.group(1)
        if number.isdigit() and 1 <= int(number) <= len(captures):
            return captures[int(number) - 1]
        return ""

    return _GLOB_REFERENCE.sub(capture, template)


def _go_expand(template: str, found: re.Match[str]) -> str:
    """Go's ``Regexp.ExpandString``: ``$n``, ``${n}``, ``$name``, ``${name}`` (the longest
    run of letters, digits and ``_``; no such group: empty), ``$$`` a dollar; any other
    ``$`` is kept."""
    out: list[str] = []
    rest = template
    while True:
        before, dollar, rest = rest.partition("$")
        out.append(before)
        if not dollar:
            return "".join(out)
        if rest.startswith("$"):
            out.append("$")
            rest = rest[1:]
            continue
        reference = _GO_REFERENCE.match(rest)
        if reference is None:
            out.append("$")
            continue
        rest = rest[reference.end() :]
        name = reference.group(1) or reference.group(2)
        number = int(name) if name.isascii() and name.isdigit() and len(name) < 9 else -1
        if name[0] == "0" and len(name) > 1:
            number = -1  # Go refuses leading zeros
        if 0 <= number <= found.re.groups:
            out.append(found.group(number) or "")
        elif number < 0 and name in found.re.groupindex:
            out.append(found.group(name) or "")
