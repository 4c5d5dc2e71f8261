"""envoyproxy/ratelimit's configuration directories, read as it reads them
(:mod:`ratelimit.service.envoy_config`): the files are our own, written to the semantics of
its ``test/config/config_test.go`` (each fixture kind, each load error in its words) and of
its loader's YAML decoding (go-yaml v2)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2

from ratelimit.service.envoy_config import (
    UNITS,
    ConfigFileError,
    EnvoyConfig,
    check_directory,
    load_directory,
)
from ratelimit.service.envoy_config.descriptors import wildcard_match

pytestmark = pytest.mark.timeout(60)

BASIC = """\
# a domain of every kind of descriptor
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
  - key: key2
    value: value3
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: key4
    rate_limit:
      name: key4_rate_limit
      unit: Day
      requests_per_unit: 1
  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25
  - key: key6
    rate_limit:
      unlimited: true
  - key: key7
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 70
"""


def directory(tmp_path: Path, **files: str) -> Path:
    """A configuration directory of ``files`` (name without ``.yaml``: text)."""
    folder = tmp_path / "config"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / f"{name}.yaml").write_text(textwrap.dedent(text))
    return folder


def loaded(tmp_path: Path, text: str, **options: Any) -> EnvoyConfig:
    return load_directory(directory(tmp_path, only=text), **options)


def refused(tmp_path: Path, text: str) -> str:
    folder = directory(tmp_path, bad=text)
    with pytest.raises(ConfigFileError) as caught:
        load_directory(folder)
    prefix = f"{folder / 'bad.yaml'}: "
    assert str(caught.value).startswith(prefix)
    return str(caught.value)[len(prefix) :]


def limit(config: EnvoyConfig, *entries: tuple[str, str], domain: str = "test-domain") -> object:
    matched = config.limit_of(domain, entries)
    if matched is None:
        return None
    found = matched.limit
    return (found.requests_per_unit, found.unit, found.name) if not found.unlimited else "unlimited"


def test_basic_config_matches_as_get_limit(tmp_path: Path) -> None:
    config = loaded(tmp_path, BASIC)
    assert config.limit_of("foo_domain", [("key1", "value1")]) is None  # unknown domain
    assert limit(config, ("key1", "something")) is None
    assert limit(config, ("key1", "value1")) is None  # no limit at the first level
    assert limit(config, ("key2", "value2"), ("subkey", "subvalue")) is None  # deeper
    assert limit(config, ("key5", "value5"), ("subkey5", "subvalue")) is None
    assert limit(config, ("key1", "value1"), ("subkey1", "something")) == (5, "SECOND", "")
    assert limit(config, ("key1", "value1"), ("subkey1", "subvalue1")) == (10, "SECOND", "")
    assert limit(config, ("key2", "something")) == (20, "MINUTE", "")  # the key alone
    assert limit(config, ("key2", "value2")) == (30, "MINUTE", "")  # the exact value first
    assert limit(config, ("key2", "value3")) is None  # a value with nothing: a whitelist
    assert limit(config, ("key3", "foo")) == (1, "HOUR", "")
    assert limit(config, ("key4", "foo")) == (1, "DAY", "key4_rate_limit")  # any case
    assert limit(config, ("key5", "value5")) == (15, "DAY", "")
    assert limit(config, ("key5", "value5"), ("subkey5", "subvalue5")) == (25, "DAY", "")
    assert limit(config, ("key6", "foo")) == "unlimited"
    stats = config.limit_of("test-domain", [("key1", "value1"), ("subkey1", "x")])
    assert stats is not None
    assert stats.limit.full_key == stats.stats_key == "test-domain.key1_value1.subkey1"
    detailed = config.limit_of("test-domain", [("key7", "unique")])
    assert detailed is not None
    assert detailed.limit.full_key == "test-domain.key7"
    assert detailed.stats_key == "test-domain.key7_unique"  # detailed_metric: the value too
    assert config.limit_of("test-domain", [("key2", "v")]).stats_key == "test-domain.key2"  # type: ignore[union-attr]


def test_units_are_the_protocols_in_any_case(tmp_path: Path) -> None:
    units = "".join(
        f"  - key: k{n}\n    rate_limit:\n      unit: {unit.lower().capitalize()}\n"
        f"      requests_per_unit: {n + 1}\n"
        for n, unit in enumerate(UNITS)
    )
    config = loaded(tmp_path, f"domain: d\ndescriptors:\n{units}")
    for n, (unit, seconds) in enumerate(UNITS.items()):
        matched = config.limit_of("d", [(f"k{n}", "v")])
        assert matched is not None
        assert (matched.limit.unit, matched.limit.seconds) == (unit, seconds)
    assert UNITS["WEEK"] == 7 * 86_400
    assert UNITS["MONTH"] == 30 * 86_400
    assert UNITS["YEAR"] == 365 * 86_400


def test_shadow_quota_and_replaces_are_kept(tmp_path: Path) -> None:
    config = loaded(
        tmp_path,
        """\
        domain: test-domain
        descriptors:
          - key: key1
            value: value1
            descriptors:
              - key: subkey1
                rate_limit: {unit: second, requests_per_unit: 5}
              - key: subkey1
                value: subvalue1
                shadow_mode: true
                rate_limit: {unit: second, requests_per_unit: 10}
          - key: key2
            shadow_mode: true
            quota_mode: true
            rate_limit:
              unit: minute
              requests_per_unit: 20
              name: wide
          - key: key2
            value: value2
            rate_limit:
              unit: minute
              requests_per_unit: 30
              replaces: [{name: wide}]
        """,
    )
    shadowed = config.limit_of("test-domain", [("key1", "value1"), ("subkey1", "subvalue1")])
    plain = config.limit_of("test-domain", [("key1", "value1"), ("subkey1", "other")])
    wide = config.limit_of("test-domain", [("key2", "any")])
    narrow = config.limit_of("test-domain", [("key2", "value2")])
    assert shadowed is not None and shadowed.limit.shadow_mode  # noqa: PT018
    assert plain is not None and not plain.limit.shadow_mode  # noqa: PT018
    assert wide is not None and wide.limit.shadow_mode and wide.limit.quota_mode  # noqa: PT018
    assert narrow is not None and not narrow.limit.shadow_mode  # noqa: PT018
    assert narrow.limit.replaces == ("wide",)


WILDCARDS = """\
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: first
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: first
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: first
    value: abc
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


def test_wildcards_anywhere_in_load_order_after_the_exact_value(tmp_path: Path) -> None:
    config = loaded(tmp_path, WILDCARDS)
    for value in ("foo1", "foo2", "foo"):
        matched = config.limit_of("test-domain", [("wild", value)])
        assert matched is not None
        assert matched.stats_key == "test-domain.wild_foo*"  # one stat for the pattern
        assert matched.shared == ()  # but a counter per value: no share_threshold
    nested = config.limit_of("test-domain", [("nestedWild", "val1"), ("wild", "goo2")])
    assert nested is not None
    assert nested.stats_key == "test-domain.nestedWild_val1.wild_goo*"
    assert limit(config, ("wild", "bar")) is None
    assert limit(config, ("noWild", "foo1")) is None
    for value, admitted in [("barab", True), ("bar123b", True), ("barb", True)]:
        assert (limit(config, ("midWild", value)) is not None) is admitted, value
    for value in ("bara", "xbarb"):
        assert limit(config, ("midWild", value)) is None, value
    assert limit(config, ("multiWild", "foobarbaz")) is not None
    assert limit(config, ("multiWild", "foo123bar456baz")) is not None
    for value in ("foo123baz", "bar456baz", "foobazbar"):
        assert limit(config, ("multiWild", value)) is None, value
    assert limit(config, ("first", "abc")) == (3, "MINUTE", "")  # exact first
    assert limit(config, ("first", "abd")) == (1, "MINUTE", "")  # then the first loaded


def test_wildcard_match_is_its_own() -> None:
    assert wildcard_match(("a", ""), "a")  # "*" matches nothing too
    assert wildcard_match(("", "b"), "xb")
    assert not wildcard_match(("ab", "ba"), "aba")  # the fixed parts cannot overlap
    assert wildcard_match(("k_", "x", ""), "k_yxz")


SHARED = """\
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: files
    value: files/special
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 3}
"""


def test_share_threshold_shares_one_pattern(tmp_path: Path) -> None:
    config = loaded(tmp_path, SHARED)
    for value in ("files/a.pdf", "files/b.csv"):
        matched = config.limit_of("test-domain", [("files", value)])
        assert matched is not None
        assert matched.shared == ("files/*",)
        assert matched.stats_key == matched.limit.full_key == "test-domain.files_files/*"
    special = config.limit_of("test-domain", [("files", "files/special")])
    assert special is not None
    assert (special.limit.requests_per_unit, special.shared) == (50, ())  # explicit first
    route = config.limit_of("test-domain", [("route", "api/v1"), ("method", "GET")])
    assert route is not None
    assert route.shared == ("api/*", "")
    assert route.stats_key == "test-domain.route_api/*.method"  # the pattern beats the value
    service = config.limit_of("test-domain", [("service", "svc/a"), ("endpoint", "/x")])
    assert service is not None
    assert service.stats_key == "test-domain.service_svc/*.endpoint_/x"
    deep = config.limit_of("test-domain", [("path", "path/1"), ("file", "file/2"), ("type", "t")])
    assert deep is not None
    assert deep.shared == ("path/*", "", "")
    assert deep.stats_key == "test-domain.path_path/*.file_file/*.type"


def test_value_to_metric_puts_values_in_the_stat_key(tmp_path: Path) -> None:
    config = loaded(
        tmp_path,
        """\
        domain: d
        descriptors:
          - key: route
            value_to_metric: true
            descriptors:
              - key: http_method
                value_to_metric: true
                rate_limit: {unit: minute, requests_per_unit: 60}
          - key: wild
            value: foo*
            value_to_metric: true
            rate_limit: {unit: minute, requests_per_unit: 1}
          - key: plain
            value: foo*
            rate_limit: {unit: minute, requests_per_unit: 1}
        """,
    )
    route = config.limit_of("d", [("route", "draw"), ("http_method", "GET")])
    assert route is not None
    assert route.limit.full_key == "d.route.http_method"
    assert route.stats_key == "d.route_draw.http_method_GET"
    assert config.limit_of("d", [("wild", "foo7")]).stats_key == "d.wild_foo7"  # type: ignore[union-attr]
    assert config.limit_of("d", [("plain", "foo7")]).stats_key == "d.plain_foo*"  # type: ignore[union-attr]


def test_metadata_is_kept(tmp_path: Path) -> None:
    config = loaded(
        tmp_path,
        """\
        domain: test-domain
        descriptors:
          - key: key1
            metadata:
              name: service_1
              weights: [1, 2]
              nested: {deep: true}
            rate_limit: {unit: minute, requests_per_unit: 1}
        """,
    )
    matched = config.limit_of("test-domain", [("key1", "x")])
    assert matched is not None
    assert matched.metadata == {"name": "service_1", "weights": [1, 2], "nested": {"deep": True}}


def test_domains_merge_when_asked_and_files_load_in_name_order(tmp_path: Path) -> None:
    folder = directory(
        tmp_path,
        b_second="""\
        domain: test-domain
        descriptors:
          - key: key2
            value: value2
            rate_limit: {unit: minute, requests_per_unit: 20}
        """,
        a_first="""\
        domain: test-domain
        descriptors:
          - key: key1
            value: value1
            rate_limit: {unit: minute, requests_per_unit: 10}
        """,
    )
    merged = load_directory(folder, merge_domains=True)
    assert limit(merged, ("key1", "value1")) == (10, "MINUTE", "")
    assert limit(merged, ("key2", "value2")) == (20, "MINUTE", "")
    with pytest.raises(ConfigFileError) as caught:
        load_directory(folder)
    assert str(caught.value) == (
        f"{folder / 'b_second.yaml'}: duplicate domain 'test-domain' in config file"
    )
    (folder / "c_again.yaml").write_text((folder / "a_first.yaml").read_text())
    with pytest.raises(ConfigFileError) as again:
        load_directory(folder, merge_domains=True)
    assert str(again.value) == (
        f"{folder / 'c_again.yaml'}: duplicate descriptor composite key 'test-domain.key1_value1'"
    )


def test_dot_files_are_skipped_when_asked(tmp_path: Path) -> None:
    folder = directory(tmp_path, only=BASIC)
    (folder / ".hidden.yaml").write_text("domain: test-domain\n")
    with pytest.raises(ConfigFileError, match="duplicate domain"):
        load_directory(folder)
    assert limit(load_directory(folder, ignore_dotfiles=True), ("key3", "x")) == (1, "HOUR", "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("descriptors: []\n", "config file cannot have empty domain"),
        ("", "config file cannot have empty domain"),
        ("domain: ~\n", "config file cannot have empty domain"),
        ("~\n", "config file cannot have empty domain"),  # a null document is an empty map
        (
            "domain: d\ndescriptors:\n  - value: v\n"
            "    rate_limit: {unit: day, requests_per_unit: 1}\n",
            "descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "duplicate descriptor composite key 'd.k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n"
            "    rate_limit: {unit: foo, requests_per_unit: 1}\n",
            "invalid rate limit unit 'foo'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
            "invalid rate limit unit ''",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: unknown\n",
            "invalid rate limit unit 'unknown'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n"
            "      requests_per_unit: 1\n      name: me\n      replaces: [{name: me}]\n",
            "replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n"
            "      requests_per_unit: 1\n      replaces: [{name: ''}]\n",
            "should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n"
            "      requestsperunit: 5\n",
            "config error, unknown key 'requestsperunit'",
        ),
        ("domain: d\nratelimit: 1\n", "config error, unknown key 'ratelimit'"),
        ("0.25: test-domain\ndescriptors: []\n", "config error, key is not of type string: 0.25"),
        ("1: test-domain\n", "config error, key is not of type string: 1"),
        (
            "domain: test-domain\ndescriptors:\n  - a\n  - b\n",
            "config error, yaml file contains list of type other than map: a",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n"
            "      unit: second\n",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "share_threshold can only be used with wildcard values (containing '*'), but found "
            "key 'k_v'",
        ),
        ("domain: d\ndescriptors:\n  - key: k\n    value: 1.5\n", "error checking config"),
    ],
)
def test_load_errors_in_its_words(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == message


def test_yaml_errors_are_its_loaders(tmp_path: Path) -> None:
    assert refused(tmp_path, "'''\n").startswith("error loading config file: yaml: line 2: ")
    assert refused(tmp_path, "- a\n") == (
        "error loading config file: yaml: unmarshal errors:\n"
        "  line 1: cannot unmarshal !!seq into map[interface {}]interface {}"
    )
    negative = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: -1\n"
    assert refused(tmp_path, negative) == (
        "error loading config file: yaml: unmarshal errors:\n"
        "  line 5: cannot unmarshal !!int `-1` into uint32"
    )
    words = "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: sometimes\n"
    assert refused(tmp_path, words).endswith("cannot unmarshal !!str `sometimes` into bool")
    assert refused(tmp_path, "domain: d\ndescriptors: {key: k}\n").endswith(
        "line 2: cannot unmarshal !!map into []config.YamlDescriptor"
    )


def test_scalars_are_read_as_go_yaml_reads_them(tmp_path: Path) -> None:
    config = loaded(
        tmp_path,
        """\
        domain: 42
        descriptors:
          - key: code
            value: 010
            rate_limit: {unit: minute, requests_per_unit: 7}
          - key: flag
            value: yes
            shadow_mode: on
            rate_limit: {unit: minute, requests_per_unit: 8}
          - key: same
            rate_limit: {unit: minute, requests_per_unit: 1}
            rate_limit: {unit: hour, requests_per_unit: 2}
        """,
    )
    assert limit(config, ("code", "010"), domain="42") == (7, "MINUTE", "")  # its text
    assert limit(config, ("code", "8"), domain="42") is None
    flag = config.limit_of("42", [("flag", "yes")])
    assert flag is not None
    assert flag.limit.shadow_mode
    assert limit(config, ("same", "x"), domain="42") == (2, "HOUR", "")  # the last one written


def test_check_directory_says_what_its_command_says(tmp_path: Path) -> None:
    good = directory(tmp_path, basic=BASIC)
    ok, lines = check_directory(good)
    assert ok
    assert lines == [
        "checking rate limit configs...",
        f"loading config directory: {good}",
        "all rate limit configs ok",
    ]
    (good / "zz.yaml").write_text("domain: test-domain\n")
    ok, lines = check_directory(good)
    assert not ok
    assert lines[-1] == (
        f"error loading rate limit configs: {good / 'zz.yaml'}: duplicate domain "
        "'test-domain' in config file"
    )
    assert check_directory(good, merge_domains=True)[0]
    ok, lines = check_directory(tmp_path / "missing")
    assert not ok
    assert lines[-1].startswith(f"error opening directory {tmp_path / 'missing'}: ")


def test_the_check_command(tmp_path: Path) -> None:
    folder = directory(tmp_path, a=BASIC, b="domain: test-domain\n")
    command = [sys.executable, "-m", "ratelimit", "check", "--envoy-config", str(folder)]
    refused_run = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert refused_run.returncode == 1
    assert refused_run.stdout.splitlines()[-1] == (
        f"error loading rate limit configs: {folder / 'b.yaml'}: duplicate domain "
        "'test-domain' in config file"
    )
    merged = subprocess.run(
        [*command, "--merge-domain-configs"], capture_output=True, text=True, timeout=30
    )
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.splitlines()[-1] == "all rate limit configs ok"


def test_the_check_command_for_our_algorithms(tmp_path: Path) -> None:
    """``--algorithm``: the directory read as ``serve --envoy`` reads it with
    ``RATELIMIT_ALGORITHM``: a ``rule`` of ours passes; one the algorithm cannot keep
    does not."""
    folder = directory(tmp_path, a='domain: d\ndescriptors:\n  - key: k\n    rule: "5/10s"\n')
    command = [sys.executable, "-m", "ratelimit", "check", "--envoy-config", str(folder)]
    theirs = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert theirs.returncode == 1
    assert theirs.stdout.splitlines()[-1].endswith("config error, unknown key 'rule'")
    ours = subprocess.run(
        [*command, "--algorithm", "gcra"], capture_output=True, text=True, timeout=30
    )
    assert ours.returncode == 0, ours.stdout
    (folder / "a.yaml").write_text(
        'domain: d\ndescriptors:\n  - key: k\n    rule: "5/10s burst 9"\n'
    )
    log = subprocess.run(
        [*command, "--algorithm", "sliding-log"], capture_output=True, text=True, timeout=30
    )
    assert log.returncode == 1
    assert "names a burst" in log.stdout


def test_merge_keys_apply_where_they_stand(tmp_path: Path) -> None:
    """``<<: *anchor`` (and ``<<: [*a, *b]``), in both of its loader's decodings, as go-yaml
    applies it: in document order, so a key after ``<<`` wins and one before it loses; of a
    list of maps the first wins."""
    config = loaded(
        tmp_path,
        """\
        domain: test-domain
        descriptors:
          - &base
            key: base
            rate_limit: &minute {unit: minute, requests_per_unit: 10}
          - <<: *base
            value: later
          - <<: *base
            key: other
            rate_limit: {unit: hour, requests_per_unit: 2}
          - key: before
            rate_limit: {unit: hour, requests_per_unit: 1}
            <<: {rate_limit: *minute}
          - <<: [{key: first, value: a}, {key: second, value: b, shadow_mode: y}]
            rate_limit: {unit: second, requests_per_unit: 3}
        """,
    )
    assert limit(config, ("base", "x")) == (10, "MINUTE", "")
    assert limit(config, ("base", "later")) == (10, "MINUTE", "")
    assert limit(config, ("other", "x")) == (2, "HOUR", "")  # written after <<: it wins
    assert limit(config, ("before", "x")) == (10, "MINUTE", "")  # written before <<: it loses
    first = config.limit_of("test-domain", [("first", "a")])
    assert first is not None
    assert first.limit.requests_per_unit == 3
    assert first.limit.shadow_mode  # merged from the second map, which names no key of its own
    assert limit(config, ("second", "b")) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("domain: d\n<<: 1\n", "map merge requires map or sequence of maps as the value"),
        ("domain: d\n<<: [{a: 1}, 2]\n", "map merge requires map or sequence of maps as the value"),
        (
            "l: &l [{domain: d}]\n<<: *l\n",
            "map merge requires map or sequence of maps as the value",
        ),
        ("domain: d\n<<: *nowhere\n", "unknown anchor 'nowhere' referenced"),
        ("domain: d\n<<: {ratelimit: 1}\n", None),  # merged keys are checked too
    ],
)
def test_merge_key_errors_are_go_yamls(tmp_path: Path, text: str, message: str | None) -> None:
    expected = (
        f"error loading config file: yaml: {message}"
        if message
        else "config error, unknown key 'ratelimit'"
    )
    assert refused(tmp_path, text) == expected


def test_an_anchor_may_be_defined_again(tmp_path: Path) -> None:
    config = loaded(
        tmp_path,
        """\
        domain: d
        descriptors:
          - key: a
            rate_limit: &r {unit: second, requests_per_unit: 1}
          - key: b
            rate_limit: &r {unit: hour, requests_per_unit: 2}
          - key: c
            rate_limit: *r
        """,
    )
    assert limit(config, ("c", "x"), domain="d") == (2, "HOUR", "")  # the latest of the name


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("y", True),
        ("Y", True),
        ("yes", True),
        ("On", True),
        ("TRUE", True),
        ("n", False),
        ("N", False),
        ("NO", False),
        ("off", False),
        ("oN", "oN"),
        ("1e3", 1000.0),
        ("-1E-2", -0.01),
        ("1.", 1.0),
        (".5", 0.5),
        ("08", 8.0),  # not octal: a float
        ("010", 8),
        ("0x1F", 31),
        ("-0x10", -16),
        ("0o17", 15),
        ("0b101", 5),
        ("0b-101", -5),
        ("1_000", 1000),
        ("+1", 1),
        ("9223372036854775808", 2**63),  # a uint64
        ("18446744073709551616", 2.0**64),  # past uint64: a float
        ("1e400", "1e400"),  # out of range: text
        (".inf", math.inf),
        ("-.Inf", -math.inf),
        ("+.INF", math.inf),
        ("~", None),
        ("", None),
        ("Null", None),
        ("1:30", "1:30"),  # no base 60
        ("2001-12-14", "2001-12-14"),  # a timestamp, kept as text
        ("<<", "<<"),
        ("=", "="),
    ],
)
def test_plain_scalars_resolve_as_go_yaml_resolves_them(text: str, value: Any) -> None:
    from ratelimit.service.envoy_config.yaml_scalars import resolve

    resolved = resolve("", text)[1]
    assert resolved == value
    assert type(resolved) is type(value)


def test_go_yamls_tags_of_plain_scalars(tmp_path: Path) -> None:
    from ratelimit.service.envoy_config.yaml_scalars import NULL, TIMESTAMP, resolve

    assert resolve("", "2001-12-14T21:59:43.10-05:00")[0] == TIMESTAMP
    assert resolve("", "2001-12-14 21:59:43.10")[0] == TIMESTAMP
    assert resolve("", "2001-02-30")[1] == "2001-02-30"  # no such day: a string
    assert math.isnan(resolve("", ".NaN")[1])
    assert resolve("tag:yaml.org,2002:float", "1") == ("tag:yaml.org,2002:float", 1.0)
    assert resolve("tag:yaml.org,2002:str", "~") == ("tag:yaml.org,2002:str", "~")
    assert resolve("", "null")[0] == NULL


def test_flags_and_counts_are_read_as_go_yaml_reads_them(tmp_path: Path) -> None:
    config = loaded(
        tmp_path,
        """\
        domain: d
        descriptors:
          - key: a
            shadow_mode: Y
            quota_mode: n
            rate_limit: {unit: minute, requests_per_unit: 0o17}
          - key: b
            shadow_mode: off
            rate_limit: {unit: minute, requests_per_unit: 1_000, unlimited: N}
          - key: c
            rate_limit: {unit: minute, requests_per_unit: +0x10}
        """,
    )
    a = config.limit_of("d", [("a", "x")])
    assert a is not None
    assert (a.limit.requests_per_unit, a.limit.shadow_mode, a.limit.quota_mode) == (15, True, False)
    b = config.limit_of("d", [("b", "x")])
    assert b is not None
    assert (b.limit.requests_per_unit, b.limit.shadow_mode) == (1000, False)
    assert limit(config, ("c", "x"), domain="d") == (16, "MINUTE", "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rate_limit: {unit: minute, requests_per_unit: 1e3}", "error checking config"),
        ("rate_limit: {unit: minute, requests_per_unit: 08}", "error checking config"),
        ("rate_limit: {unit: minute, requests_per_unit: .inf}", "error checking config"),
        ("value: 9223372036854775808", "error checking config"),
        ("y: 1", "config error, key is not of type string: true"),
        ("1e6: 1", "config error, key is not of type string: 1e+06"),
        ("1234567.0: 1", "config error, key is not of type string: 1.234567e+06"),
        (
            "shadow_mode: 2001-12-14 21:59:43",
            "error loading config file: yaml: unmarshal errors:\n"
            "  line 4: cannot unmarshal !!timestamp `2001-12...` into bool",
        ),
        (
            "shadow_mode: !!int abc",
            "error loading config file: yaml: cannot decode !!str `abc` as a !!int",
        ),
    ],
)
def test_scalars_go_yaml_reads_otherwise_are_its_errors(
    tmp_path: Path, text: str, message: str
) -> None:
    """A float is no leaf its loader's key check allows, so ``requests_per_unit: 1e3`` is
    refused before go-yaml could truncate it into a ``uint32``."""
    assert refused(tmp_path, f"domain: d\ndescriptors:\n  - key: k\n    {text}\n") == message


def test_metadata_keys_below_the_first_level_are_text(tmp_path: Path) -> None:
    """Its loader's ``convertMap``: every key below the first level printed by ``%v``; the
    first level's as written. What is kept goes into a protobuf ``Struct``."""
    config = loaded(
        tmp_path,
        """\
        domain: d
        descriptors:
          - key: k
            metadata:
              codes: {429: limited, true: t, 1.50: f, ~: nothing, 1e6: big}
              rows: [{1: a}, [{2: b}], 3]
              1.50: as written
              ~: an empty key
              flags: {on: yes}
            rate_limit: {unit: minute, requests_per_unit: 1}
        """,
    )
    matched = config.limit_of("d", [("k", "x")])
    assert matched is not None
    metadata = matched.metadata
    assert metadata is not None
    struct = struct_pb2.Struct()
    struct.update(metadata)  # TypeError for a key that is not text
    assert struct.fields["codes"].struct_value.fields["429"].string_value == "limited"
    assert metadata == {
        "codes": {"429": "limited", "true": "t", "1.5": "f", "<nil>": "nothing", "1e+06": "big"},
        "rows": [{"1": "a"}, [{"2": "b"}], 3],
        "1.50": "as written",
        "": "an empty key",
        "flags": {"true": True},
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"domain: d\xff\n", "invalid leading UTF-8 octet"),
        (b"domain: caf\xc3(\n", "invalid trailing UTF-8 octet"),
        (b"domain: \xe2\x82", "incomplete UTF-8 octet sequence"),
        (b"domain: \xc0\x80\n", "invalid length of a UTF-8 sequence"),
        (b"domain: \xed\xa0\x80\n", "invalid Unicode character"),
        (b"domain: d\x01\n", "control characters are not allowed"),
        (b"domain: d\x01\xff\n", "control characters are not allowed"),  # the first problem
    ],
)
def test_bytes_go_yaml_cannot_read_are_its_errors(
    tmp_path: Path, data: bytes, message: str
) -> None:
    folder = directory(tmp_path)
    (folder / "bad.yaml").write_bytes(data)
    with pytest.raises(ConfigFileError) as caught:
        load_directory(folder)
    assert str(caught.value) == f"{folder / 'bad.yaml'}: error loading config file: yaml: {message}"


def test_byte_order_marks_are_read(tmp_path: Path) -> None:
    folder = directory(tmp_path)
    (folder / "a.yaml").write_bytes(b"\xef\xbb\xbfdomain: a\n")
    (folder / "b.yaml").write_bytes("\ufeffdomain: b\n".encode("utf-16-le"))
    (folder / "c.yaml").write_bytes("\ufeffdomain: c\n".encode("utf-16-be"))
    assert sorted(load_directory(folder).domains) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("? {a: 1}\n: x\n", 'invalid map key: map[interface {}]interface {}{"a":1}'),
        (
            "domain: d\n? [a, 1.5, ~]\n: x\n",
            'invalid map key: []interface {}{"a", 1.5, interface {}(nil)}',
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {? {b: 2, a: 1} : x}\n",
            'invalid map key: map[interface {}]interface {}{"a":1, "b":2}',
        ),
        (
            "domain: d\ndescriptors: &a [{key: k, descriptors: *a}]\n",
            "anchor 'a' value contains itself",
        ),
        ("domain: d\nx: &a {<<: *a}\n", "anchor 'a' value contains itself"),
    ],
)
def test_keys_and_aliases_go_yaml_refuses(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == f"error loading config file: yaml: {message}"


def test_alias_expansion_and_depth_have_their_limits(tmp_path: Path) -> None:
    laughs = "".join(
        f"      l{n}: &l{n} [" + ", ".join([f"*l{n - 1}" if n else "lol"] * 9) + "]\n"
        for n in range(6)
    )
    expanding = f"domain: d\ndescriptors:\n  - key: k\n    metadata:\n{laughs}"
    assert refused(tmp_path, expanding) == (
        "error loading config file: yaml: document contains excessive aliasing"
    )
    deep = "domain: d\ndescriptors: " + "[" * 3000 + "]" * 3000 + "\n"
    assert refused(tmp_path, deep) == "error loading config file: nested too deeply to be read"


def _runtime_tree(tmp_path: Path) -> Path:
    """``root/ratelimit``: ``config/edge.yaml``, ``config/team/api.yaml``, ``config.yaml``
    beside them; files of other applications; a dangling Emacs lock; a Kubernetes copy."""
    sub = tmp_path / "root" / "ratelimit"
    (sub / "config" / "team").mkdir(parents=True)
    (sub / "other").mkdir()
    (sub / "config" / "..2026_01_01").mkdir()
    (sub / "config" / "edge.yaml").write_text("domain: edge\n")
    (sub / "config" / "team" / "api.yaml").write_text("domain: api\n")
    (sub / "config.yaml").write_text("domain: beside\n")
    (sub / "configx.yaml").write_text("domain: not-ours\n")
    (sub / "other" / "x.yaml").write_text("domain: not-ours\n")
    (sub / "config" / "..2026_01_01" / "edge.yaml").write_text("domain: edge\n")
    (sub / "config" / ".#edge.yaml").symlink_to("root@host.1234:1700000000")
    return tmp_path / "root"


def test_load_runtime_watching_the_root_reads_what_goruntime_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``RUNTIME_WATCH_ROOT=true``: every file under ``ROOT/SUB`` whose key (its path there,
    ``/`` made ``.``) starts with ``APPDIR.``; what cannot be read is skipped, and said."""
    from ratelimit.service.envoy_config import load_runtime, runtime_files

    root = str(_runtime_tree(tmp_path))
    sub = Path(root) / "ratelimit"
    files = runtime_files(root, "ratelimit", "config", True, True)
    assert [(f.key, f.path) for f in files] == [
        ("config.edge.yaml", str(sub / "config" / "edge.yaml")),
        ("config.team.api.yaml", str(sub / "config" / "team" / "api.yaml")),
        ("config.yaml", str(sub / "config.yaml")),
    ]
    config = load_runtime(root, "ratelimit", "config", True, False, True)
    assert list(config.domains) == ["edge", "api", "beside"]
    with (
        caplog.at_level("WARNING", logger="ratelimit.service"),
        pytest.raises(ConfigFileError) as caught,
    ):
        load_runtime(root, "ratelimit", "config", True, False, False)
    assert str(caught.value) == "config.edge.yaml: duplicate domain 'edge' in config file"
    lock = sub / "config" / ".#edge.yaml"
    assert f"runtime: error reading {lock}: open {lock}: no such file or directory" in (
        caplog.messages
    )
    (sub / "config" / "..2026_01_01" / "edge.yaml").unlink()
    keys = [f.key for f in runtime_files(root, "ratelimit", "config", True, False)]
    assert keys == [
        "config..#edge.yaml",
        "config.edge.yaml",
        "config.team.api.yaml",
        "config.yaml",
    ]
    assert list(load_runtime(root, "ratelimit", "config", True, False, False).domains) == [
        "edge",
        "api",
        "beside",
    ]


def test_load_runtime_without_watching_the_root_reads_the_app_directory(tmp_path: Path) -> None:
    from ratelimit.service.envoy_config import load_runtime, runtime_files

    root = str(_runtime_tree(tmp_path))
    keys = [f.key for f in runtime_files(root, "ratelimit", "config", False, True)]
    assert keys == ["edge.yaml", "team.api.yaml"]
    (Path(root) / "ratelimit" / "config" / "team" / "api.yaml").write_text("domain: edge\n")
    with pytest.raises(ConfigFileError) as caught:
        load_runtime(root, "ratelimit", "config", False, False, True)
    assert str(caught.value) == "team.api.yaml: duplicate domain 'edge' in config file"
    (Path(root) / "ratelimit" / "config" / "team" / "api.yaml").write_text("domain: api\n")
    config = load_runtime(root, "ratelimit", "config", False, False, True)
    assert list(config.domains) == ["edge", "api"]
    assert runtime_files(root + "/ratelimit", "", "config", False, True)[0].key == "edge.yaml"


def test_load_runtime_reads_nothing_where_goruntime_reads_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No ``RUNTIME_SUBDIRECTORY`` (its default) with ``RUNTIME_WATCH_ROOT``, or no
    ``RUNTIME_APPDIRECTORY`` without: its nil loader, an empty configuration; a directory
    that is missing: an empty one too, with a warning."""
    from ratelimit.service.envoy_config import load_runtime, runtime_files

    root = str(_runtime_tree(tmp_path))
    assert runtime_files(root, "", "ratelimit", True, True) == []
    assert load_runtime(root, "", "ratelimit", True, False, True).domains == {}
    assert load_runtime(root, "ratelimit", "", False, False, True).domains == {}
    missing = Path(root) / "missing"
    with caplog.at_level("WARNING", logger="ratelimit.service"):
        assert load_runtime(root, "missing", "config", True, False, True).domains == {}
    assert (
        f"runtime: error processing {missing}: lstat {missing}: no such file or directory"
        in caplog.messages
    )
