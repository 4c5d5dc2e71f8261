"""Reading a YAML file as envoyproxy/ratelimit reads it (Go, ``gopkg.in/yaml.v2``).

Its loader (``ConfigFileContentToYaml``) decodes a file twice: once into a generic map, whose
every key it checks against its list (:func:`checked_keys`), then into its structs
(:func:`root_of`). go-yaml differs from a Python YAML loader in what a config meets:

- its bytes are read as its reader reads them (:func:`text_of`), and its scalars resolved by
  its YAML 1.1 table (:mod:`~.yaml_scalars`): ``y``, ``on`` and ``off`` are booleans,
  ``1e3`` a float, ``0o17`` and ``1_000`` whole numbers;
- a string field takes any scalar's text as written (``value: 010`` is ``"010"``, not 8;
  ``value: 1.50`` is ``"1.50"``), and ``~`` is the empty string;
- a float is no leaf its key check allows (``requests_per_unit: 1e3`` is ``error checking
  config``), so go-yaml's truncation of a float into a whole-number field is never reached;
- a map or list as a map key, an alias inside the node it names, and aliases that expand a
  file past go-yaml's ratio are its own errors (``yaml: invalid map key: ...``);
- merge keys (``<<: *defaults``, ``<<: [*a, *b]``) are applied where they stand, in both
  decodings: a key written after ``<<`` wins over a merged one, a key written before it
  loses to it (go-yaml sets them in document order), and of a list of maps the first wins;
- of a key written twice in one mapping the last wins, as in PyYAML;
- an anchor may be defined again (an alias names the latest);
- only the first document of a file is read;
- a field of the wrong kind is an "unmarshal error" naming the line and the Go type.

So the file is composed into PyYAML nodes (each scalar's text and go-yaml's tag kept), and
both decodings are made from the nodes. Every error is a :class:`ConfigFileError` whose text
is the one its loader gives, after ``"<file>: "``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from ratelimit.errors import ConfigurationError
from ratelimit.service.envoy_config.yaml_scalars import (
    BINARY,
    INT64_MAX,
    MERGE,
    NULL,
    YamlFailure,
    decoded,
    go_syntax,
    go_text,
    interface_value,
    resolve,
    short_tag,
)

VALID_KEYS = frozenset(
    (
        "domain",
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "shadow_mode",
        "quota_mode",
        "name",
        "replaces",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    )
)
"""Every key its loader allows, at any depth (``validKeys``); what ``metadata`` holds is free."""
OURS = frozenset(("rule", "always_count"))
"""The keys a configuration for our algorithms may have besides (``RATELIMIT_ALGORITHM``):
``rule``, a descriptor's rules in this package's grammar."""

FLAGS = ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold")
"""A descriptor's boolean fields."""
UINT32 = 2**32 - 1
_ALIAS = "!ratelimit:alias"
_WANT_MAP = "map merge requires map or sequence of maps as the value"


class ConfigFileError(ConfigurationError):
    """A configuration file its loader refuses: ``"<file>: <message>"``, in its words."""


def error(name: str, message: str) -> ConfigFileError:
    """The error of file ``name`` (``newRateLimitConfigError``)."""
    return ConfigFileError(f"{name}: {message}")


def _failed(name: str, problem: str) -> ConfigFileError:
    """One of go-yaml's own failures, as its loader words it."""
    return error(name, f"error loading config file: yaml: {problem}")


def text_of(name: str, data: bytes) -> str:
    """File ``name``'s bytes as go-yaml reads them (UTF-8, or UTF-16 after a byte order
    mark); its reader's error (``error loading config file: yaml: invalid leading UTF-8
    octet``) for bytes it refuses."""
    try:
        return decoded(data)
    except YamlFailure as exc:
        raise _failed(name, str(exc)) from None


class _Alias(yaml.ScalarNode):
    """An alias go-yaml does not read as the node it names: one inside that node (``&a
    [*a]``: a value that contains itself), or the value of a merge key naming anything but
    a map."""

    def __init__(self, anchor: str, target: yaml.Node, mark: Any) -> None:
        super().__init__(_ALIAS, anchor, mark, mark)
        self.target = target


class _Loader(yaml.SafeLoader):
    """PyYAML's composer with go-yaml's resolution of plain scalars (:func:`resolve`; a plain
    ``<<`` is a merge key), its anchors (one may be defined again; an alias to none is its
    error) and :class:`_Alias` where it reads an alias differently."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.composed: set[int] = set()

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return MERGE if value == "<<" else resolve("", value)[0]
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()  # type: ignore[no-untyped-call]
            target = self.anchors.get(event.anchor)
            if target is None:
                raise YamlFailure(f"unknown anchor '{event.anchor}' referenced")
            merged = _is_merge(index) and not isinstance(target, yaml.MappingNode)
            if merged or id(target) not in self.composed:
                return _Alias(event.anchor, target, event.start_mark)
            return target
        anchor = self.peek_event().anchor  # type: ignore[no-untyped-call]
        if anchor is not None:
            self.anchors.pop(anchor, None)  # a later anchor of the same name replaces it
        node = super().compose_node(parent, index)
        self.composed.add(id(node))
        return node


def _is_merge(node: Any) -> bool:
    """``isMerge``: a plain ``<<`` key (or one tagged ``!!merge``)."""
    return isinstance(node, yaml.ScalarNode) and node.tag == MERGE and node.value == "<<"


def compose(name: str, text: str) -> yaml.Node | None:
    """The first document of ``text`` as nodes (``None``: empty); go-yaml's load error
    (``error loading config file: yaml: line N: ...``) for text that is not YAML."""
    loader = _Loader(text)
    try:
        return loader.get_node() if loader.check_node() else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"line {mark.line + 1}: " if mark is not None else ""
        raise error(name, f"error loading config file: yaml: {line}{exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise error(name, f"error loading config file: yaml: {exc}") from exc
    except YamlFailure as exc:
        raise _failed(name, str(exc)) from None
    finally:
        loader.dispose()


def scalar(node: yaml.Node) -> Any:
    """A scalar's value as go-yaml decodes it into ``interface{}``: ``None``, a bool, an
    int (above 2**63 - 1: a Go ``uint64``), a float or text (a timestamp stays text)."""
    return interface_value(node.tag, node.value)


def generic(node: yaml.Node) -> Any:
    """``node`` decoded into Go's ``interface{}`` (once :func:`checked_keys` applied its
    merge keys): maps (the last of a key written twice wins; keys ``1``, ``1.0`` and
    ``true``, apart in Go, are one in Python), lists and scalars."""
    return _Generic().value(node)


class _Generic:
    """go-yaml's decoding into ``interface{}``. ``first``: its loader's first decoding of a
    file, which applies the merge keys where they stand (the nodes are changed in place, so
    that what follows reads them applied) and fails as go-yaml fails, in document order:
    an alias inside what it names, a map or list as a map key, a merge of anything but maps,
    a tag its scalar does not fit, and aliases that expand a file past its ratio."""

    def __init__(self, first: bool = False) -> None:
        self.first = first
        self.seen: set[int] = set()
        self.decoded = 0
        self.aliased = 0

    def value(self, node: yaml.Node) -> Any:
        if self.first:
            self._count(node)
        if isinstance(node, _Alias):
            raise YamlFailure(f"anchor '{node.value}' value contains itself")
        if isinstance(node, yaml.SequenceNode):
            return [self.value(element) for element in node.value]
        if not isinstance(node, yaml.MappingNode):
            return interface_value(node.tag, node.value)
        found: dict[Any, Any] = {}
        pairs: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if self.first and _is_merge(key_node):
                self._merge(value_node, found, pairs)
                continue
            key = self.value(key_node)
            if isinstance(key, (dict, list)):
                raise YamlFailure(f"invalid map key: {go_syntax(key)}")
            found[key] = self.value(value_node)
            pairs.append((key_node, value_node))
        if self.first:
            node.value = pairs
        return found

    def _merge(
        self, node: yaml.Node, found: dict[Any, Any], pairs: list[tuple[yaml.Node, yaml.Node]]
    ) -> None:
        """``merge``: the map (or maps: the last first, so that the first wins) of a merge
        key set into the map it stands in."""
        maps = node.value[::-1] if isinstance(node, yaml.SequenceNode) else [node]
        for each in maps:
            target = each.target if isinstance(each, _Alias) else each
            if not isinstance(target, yaml.MappingNode):
                raise YamlFailure(_WANT_MAP)
            found.update(self.value(each))
            pairs.extend(each.value)

    def _count(self, node: yaml.Node) -> None:
        """go-yaml's guard against alias expansion (``allowedAliasRatio``): a node decoded
        again is one reached through an alias."""
        self.decoded += 1
        if id(node) in self.seen:
            self.aliased += 1
        else:
            self.seen.add(id(node))
        if self.aliased > 100 and self.decoded > 1000:
            low, high = 400_000, 4_000_000
            share = min(max(self.decoded - low, 0) / (high - low), 1.0)
            if self.aliased / self.decoded > 0.99 - 0.89 * share:
                raise YamlFailure("document contains excessive aliasing")


def checked_keys(name: str, node: yaml.Node | None, ours: bool = False) -> None:
    """Its loader's first decoding (``yaml.Unmarshal`` into a generic map: go-yaml's own
    failures, merge keys applied) and ``validateYamlKeys``: every key a string of
    :data:`VALID_KEYS` (and :data:`OURS` when ``ours``; what ``metadata`` holds is not
    looked at), every list's elements maps, every other leaf a string, whole number, bool
    or null. The file's first fault, in file order."""
    if node is None or _null(node):
        return
    if not isinstance(node, yaml.MappingNode):
        raise _unmarshal(name, node, "map[interface {}]interface {}")
    try:
        _Generic(first=True).value(node)
    except YamlFailure as exc:
        raise _failed(name, str(exc)) from None
    _check_map(name, node, VALID_KEYS | OURS if ours else VALID_KEYS)


def _check_map(name: str, node: yaml.MappingNode, valid: frozenset[str]) -> None:
    pairs = {}
    for key_node, value_node in node.value:  # the last of a key written twice wins
        pairs[generic(key_node)] = value_node
    for key, value in pairs.items():
        if not isinstance(key, str):
            raise error(name, f"config error, key is not of type string: {go_text(key)}")
        if key not in valid:
            raise error(name, f"config error, unknown key '{key}'")
        if key == "metadata":
            continue
        if isinstance(value, yaml.SequenceNode):
            for element in value.value:
                if not isinstance(element, yaml.MappingNode):
                    raise error(
                        name,
                        "config error, yaml file contains list of type other than map: "
                        f"{go_text(generic(element))}",
                    )
                _check_map(name, element, valid)
        elif isinstance(value, yaml.MappingNode):
            _check_map(name, value, valid)
        else:
            leaf = scalar(value)
            if leaf is not None and not isinstance(leaf, (str, int, bool)):
                raise error(name, "error checking config")
            if isinstance(leaf, int) and not isinstance(leaf, bool) and leaf > INT64_MAX:
                raise error(name, "error checking config")  # a uint64 in Go: no leaf kind


@dataclass
class YamlRateLimit:
    """``rate_limit``, as its loader reads it."""

    requests_per_unit: int = 0
    unit: str = ""
    unlimited: bool = False
    name: str = ""
    replaces: list[str] = field(default_factory=list)


@dataclass
class YamlDescriptor:
    """One entry of ``descriptors``, as its loader reads it (``YamlDescriptor``)."""

    key: str = ""
    value: str = ""
    rate_limit: YamlRateLimit | None = None
    more_limits: list[YamlRateLimit] = field(default_factory=list)
    """Ours only: the limits after the first of a ``rate_limit`` written as a list."""
    rule: str = ""
    """Ours only: the descriptor's rules in this package's grammar."""
    always_count: bool = False
    """Ours only: its hits are counted whether or not they are refused (usage reports)."""
    descriptors: list[YamlDescriptor] = field(default_factory=list)
    shadow_mode: bool = False
    quota_mode: bool = False
    detailed_metric: bool = False
    value_to_metric: bool = False
    share_threshold: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    line: int = 0
    """Where it starts in its file (1 on), for messages of our own."""


@dataclass
class YamlRoot:
    """A whole file: its ``domain`` and ``descriptors``."""

    domain: str = ""
    descriptors: list[YamlDescriptor] = field(default_factory=list)


class _Decoder:
    """go-yaml's decoding into the loader's structs: the first wrong field of the file is
    an unmarshal error (go-yaml gathers them all; its loader prints the list, which starts
    with the first)."""

    def __init__(self, name: str, ours: bool = False) -> None:
        self.name = name
        self.ours = ours

    def root(self, node: yaml.Node | None) -> YamlRoot:
        root = YamlRoot()
        if node is None or _null(node):
            return root
        fields = self._fields(node, "config.YamlRoot")
        if "domain" in fields:
            root.domain = self.text(fields["domain"])
        if "descriptors" in fields:
            root.descriptors = self.list(
                fields["descriptors"], "[]config.YamlDescriptor", self.descriptor
            )
        return root

    def descriptor(self, node: yaml.Node) -> YamlDescriptor:
        fields = self._fields(node, "config.YamlDescriptor")
        found = YamlDescriptor(line=node.start_mark.line + 1)
        for name in ("key", "value"):
            if name in fields:
                setattr(found, name, self.text(fields[name]))
        limits = fields.get("rate_limit")
        if self.ours and isinstance(limits, yaml.SequenceNode) and limits.value:
            first, *more = self.list(limits, "[]config.YamlRateLimit", self.rate_limit)
            found.rate_limit, found.more_limits = first, more
        elif limits is not None and not _null(limits):
            found.rate_limit = self.rate_limit(limits)
        if self.ours and "rule" in fields:
            found.rule = self.text(fields["rule"])
        if self.ours and "always_count" in fields:
            found.always_count = self.flag(fields["always_count"])
        if "descriptors" in fields:
            found.descriptors = self.list(
                fields["descriptors"], "[]config.YamlDescriptor", self.descriptor
            )
        flags = (
            "shadow_mode",
            "quota_mode",
            "detailed_metric",
            "value_to_metric",
            "share_threshold",
        )
        for name in flags:
            if name in fields:
                setattr(found, name, self.flag(fields[name]))
        if "metadata" in fields and not _null(fields["metadata"]):
            found.metadata = self.metadata(fields["metadata"])
        return found

    def metadata(self, node: yaml.Node) -> dict[str, Any]:
        """``Metadata map[string]interface{}``, then ``parseMetadata``: each key as it is
        written (``1.50`` is ``"1.50"``, ``~`` is ``""``), each key below them as Go prints
        it (``fmt.Sprintf("%v", k)``: ``429``, ``true``, ``1.5``), in maps and lists at any
        depth; so that its values are JSON's (``Struct`` takes them)."""
        if not isinstance(node, yaml.MappingNode):
            raise _unmarshal(self.name, node, "map[string]interface {}")
        return {self.text(key): _json_like(generic(value)) for key, value in node.value}

    def rate_limit(self, node: yaml.Node) -> YamlRateLimit:
        fields = self._fields(node, "config.YamlRateLimit")
        found = YamlRateLimit()
        if "requests_per_unit" in fields:
            found.requests_per_unit = self.uint32(fields["requests_per_unit"])
        for name in ("unit", "name"):
            if name in fields:
                setattr(found, name, self.text(fields[name]))
        if "unlimited" in fields:
            found.unlimited = self.flag(fields["unlimited"])
        if "replaces" in fields:
            found.replaces = self.list(fields["replaces"], "[]config.yamlReplaces", self.replaced)
        return found

    def replaced(self, node: yaml.Node) -> str:
        fields = self._fields(node, "config.yamlReplaces")
        return self.text(fields["name"]) if "name" in fields else ""

    def _fields(self, node: yaml.Node, go_type: str) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise _unmarshal(self.name, node, go_type)
        return {self.text(key): value for key, value in node.value}

    def list(self, node: yaml.Node, go_type: str, each: Callable[[yaml.Node], Any]) -> list[Any]:
        if _null(node):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise _unmarshal(self.name, node, go_type)
        return [each(element) for element in node.value]

    def text(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.ScalarNode):
            if node.tag == BINARY:
                return str(scalar(node))
            return "" if node.tag == NULL else str(node.value)
        raise _unmarshal(self.name, node, "string")

    def flag(self, node: yaml.Node) -> bool:
        if isinstance(node, yaml.ScalarNode):
            value = scalar(node)
            if value is None or isinstance(value, bool):
                return bool(value)
        raise _unmarshal(self.name, node, "bool")

    def uint32(self, node: yaml.Node) -> int:
        if isinstance(node, yaml.ScalarNode):
            value = scalar(node)
            if value is None:
                return 0
            if isinstance(value, float) and math.isfinite(value):
                value = math.trunc(value)  # as Go on amd64; unmet: the key check refuses floats
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= UINT32:
                return value
        raise _unmarshal(self.name, node, "uint32")


def _json_like(value: Any) -> Any:
    """``convertMap``/``convertSlice``: the keys of every map in ``value`` as text."""
    if isinstance(value, dict):
        return {go_text(key): _json_like(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_like(item) for item in value]
    return value


def _null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == NULL


def _unmarshal(name: str, node: yaml.Node, go_type: str) -> ConfigFileError:
    """go-yaml's unmarshal error (``terror``) for ``node`` decoded into ``go_type``: a
    scalar's text cut to 7 bytes and ``...`` past 10."""
    kind = short_tag(node.tag)
    if isinstance(node, yaml.ScalarNode):
        text = node.value.encode()
        if len(text) > 10:
            text = text[:7] + b"..."
        kind += f" `{text.decode(errors='replace')}`"
    shown = kind
    line = node.start_mark.line + 1
    return error(
        name,
        "error loading config file: yaml: unmarshal errors:\n"
        f"  line {line}: cannot unmarshal {shown} into {go_type}",
    )


def root_of(name: str, text: str, ours: bool = False) -> YamlRoot:
    """``ConfigFileContentToYaml``: file ``name``'s ``text``, its keys checked, decoded.
    ``ours``: for our algorithms, which read more (:data:`OURS`, ``rate_limit`` lists)."""
    try:
        node = compose(name, text)
        checked_keys(name, node, ours)
        return _Decoder(name, ours).root(node)
    except RecursionError:
        raise too_deep(name) from None


def too_deep(name: str) -> ConfigFileError:
    """File ``name`` nests deeper than Python can follow (go-yaml reads up to 10000
    levels; Python's stack stops a few hundred levels down)."""
    return error(name, "error loading config file: nested too deeply to be read")
