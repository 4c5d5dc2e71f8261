"""Reading a YAML file as envoyproxy/ratelimit reads it (Go, ``gopkg.in/yaml.v2``).

Its loader (``ConfigFileContentToYaml``) decodes a file twice: once into a generic map, whose
every key it checks against its list (:func:`checked_keys`), then into its structs
(:func:`root_of`). go-yaml differs from a Python YAML loader in what a config meets:

- a string field takes any scalar's text as written (``value: 010`` is ``"010"``, not 8;
  ``value: 1.50`` is ``"1.50"``), and ``~`` is the empty string;
- of a key written twice in one mapping the last wins, as in PyYAML;
- only the first document of a file is read;
- a field of the wrong kind is an "unmarshal error" naming the line and the Go type.

So the file is composed into PyYAML nodes (each scalar's text and resolved tag kept), and
both decodings are made from the nodes. Every error is a :class:`ConfigFileError` whose text
is the one its loader gives, after ``"<file>: "``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from ratelimit.errors import ConfigurationError

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
OURS = frozenset(("rule",))
"""The keys a configuration for our algorithms may have besides (``RATELIMIT_ALGORITHM``):
``rule``, a descriptor's rules in this package's grammar."""

FLAGS = ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold")
"""A descriptor's boolean fields."""
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_SHORT = {
    _STR: "!!str",
    _INT: "!!int",
    _FLOAT: "!!float",
    _BOOL: "!!bool",
    _NULL: "!!null",
    "tag:yaml.org,2002:map": "!!map",
    "tag:yaml.org,2002:seq": "!!seq",
    "tag:yaml.org,2002:timestamp": "!!timestamp",
    "tag:yaml.org,2002:binary": "!!binary",
}
_CONSTRUCT = yaml.SafeLoader("")
UINT32 = 2**32 - 1


class ConfigFileError(ConfigurationError):
    """A configuration file its loader refuses: ``"<file>: <message>"``, in its words."""


def error(name: str, message: str) -> ConfigFileError:
    """The error of file ``name`` (``newRateLimitConfigError``)."""
    return ConfigFileError(f"{name}: {message}")


def compose(name: str, text: str) -> yaml.Node | None:
    """The first document of ``text`` as nodes (``None``: empty); go-yaml's load error
    (``error loading config file: yaml: line N: ...``) for text that is not YAML."""
    try:
        for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
            return document
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"line {mark.line + 1}: " if mark is not None else ""
        raise error(name, f"error loading config file: yaml: {line}{exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise error(name, f"error loading config file: yaml: {exc}") from exc
    return None


def scalar(node: yaml.Node) -> Any:
    """A scalar's value as go-yaml resolves it into ``interface{}`` (a timestamp stays
    text, as yaml.v2 keeps it)."""
    if node.tag in (_INT, _FLOAT, _BOOL, _NULL):
        return _CONSTRUCT.construct_object(node)
    return node.value


def go_text(value: Any) -> str:
    """``fmt.Sprintf("%v", value)`` of a value go-yaml decoded."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value == int(value) and abs(value) < 1e21:
            return str(int(value))
        return repr(value)
    if isinstance(value, list):
        return "[" + " ".join(go_text(v) for v in value) + "]"
    if isinstance(value, dict):
        items = " ".join(f"{go_text(k)}:{go_text(v)}" for k, v in value.items())
        return f"map[{items}]"
    return str(value)


def generic(node: yaml.Node) -> Any:
    """``node`` decoded into Go's ``interface{}``: maps (the last of a key written twice
    wins), lists and scalars."""
    if isinstance(node, yaml.MappingNode):
        return {_key(k): generic(v) for k, v in node.value}
    if isinstance(node, yaml.SequenceNode):
        return [generic(v) for v in node.value]
    return scalar(node)


def _key(node: yaml.Node) -> Any:
    value = generic(node)
    return tuple(value) if isinstance(value, list) else value  # hashable, as Go's keys


def checked_keys(name: str, node: yaml.Node | None, ours: bool = False) -> None:
    """``validateYamlKeys``: every key a string of :data:`VALID_KEYS` (and :data:`OURS`
    when ``ours``; what ``metadata`` holds is not looked at), every list's elements maps,
    every other leaf a string, whole number, bool or null. The file's first fault, in file
    order."""
    if node is None:
        return
    if not isinstance(node, yaml.MappingNode):
        raise _unmarshal(name, node, "map[interface {}]interface {}")
    _check_map(name, node, VALID_KEYS | OURS if ours else VALID_KEYS)


def _check_map(name: str, node: yaml.MappingNode, valid: frozenset[str]) -> None:
    pairs = {}
    for key_node, value_node in node.value:  # the last of a key written twice wins
        pairs[_key(key_node)] = value_node
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
            if isinstance(leaf, int) and not isinstance(leaf, bool) and leaf > 2**63 - 1:
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
        if node is None:
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
            metadata = generic(fields["metadata"])
            if not isinstance(metadata, dict):
                raise _unmarshal(self.name, fields["metadata"], "map[string]interface {}")
            found.metadata = {go_text(k): v for k, v in metadata.items()}
        return found

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
        return {go_text(_key(k)): v for k, v in node.value}

    def list(self, node: yaml.Node, go_type: str, each: Callable[[yaml.Node], Any]) -> list[Any]:
        if _null(node):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise _unmarshal(self.name, node, go_type)
        return [each(element) for element in node.value]

    def text(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.ScalarNode):
            return "" if node.tag == _NULL else str(node.value)
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
            if isinstance(value, float) and 0 <= value <= UINT32:
                return int(value)  # go-yaml truncates a float that fits
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= UINT32:
                return value
        raise _unmarshal(self.name, node, "uint32")


def _null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL


def _unmarshal(name: str, node: yaml.Node, go_type: str) -> ConfigFileError:
    """go-yaml's unmarshal error for ``node`` decoded into ``go_type``."""
    kind = _SHORT.get(node.tag, node.tag)
    shown = f"{kind} `{node.value}`" if isinstance(node, yaml.ScalarNode) else kind
    line = node.start_mark.line + 1
    return error(
        name,
        "error loading config file: yaml: unmarshal errors:\n"
        f"  line {line}: cannot unmarshal {shown} into {go_type}",
    )


def root_of(name: str, text: str, ours: bool = False) -> YamlRoot:
    """``ConfigFileContentToYaml``: file ``name``'s ``text``, its keys checked, decoded.
    ``ours``: for our algorithms, which read more (:data:`OURS`, ``rate_limit`` lists)."""
    node = compose(name, text)
    checked_keys(name, node, ours)
    return _Decoder(name, ours).root(node)
