"""The service's rules file (TOML): which rules apply to which Envoy descriptors.

::

    [[limit]]
    domain = "envoy"                          # Envoy's rate limit domain
    descriptor = ["remote_address"]           # entry keys, in order: per value of each
    rule = "10/s | 500/h"                     # this package's grammar, without selectors

    [[limit]]
    domain = "envoy"
    descriptor = ["path=/login", "remote_address"]   # "key=value" pins a value
    rule = "5/m"
    shadow = true                             # decide and report, never refuse
    penalty = "5 refusals/10m for 1h"         # then hold the descriptor back (refused)

    [[limit]]
    domain = "ai-gateway"
    descriptor = ["api_key"]
    rule = "90000/m"                          # tokens: hits_addend counts them
    always_count = true                       # count every report, over the limit or not

``always_count`` limits count every request, refused or not, as Envoy's reference service
does: usage reported at stream end (``apply_on_stream_done``, Envoy AI Gateway's token
accounting) is never lost, and a ``hits_addend`` above the limit's count is counted (and
answered ``OVER_LIMIT``), never refused as invalid.

A request's descriptor matches a limit when it has the same keys in the same order and every
pinned value; of several, the one with the most pinned values wins (then the first in the
file). Each limit counts per distinct descriptor (its keys and values). A descriptor no
limit matches is not limited. Errors name the line.

A running service replaces its rules through a :class:`RulesWatcher`, which applies a file
only once it parsed whole and stayed the same for a moment, and never drops a domain on its
own.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import hashlib
import logging
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratelimit.algorithms import SLIDING_LOG
from ratelimit.core.checks import check_cost
from ratelimit.core.plan import compile_tree
from ratelimit.errors import ConfigurationError, RuleSyntaxError
from ratelimit.penalties.spec import unselected_penalty
from ratelimit.rules.tree import Node, map_rules, to_tree

logger = logging.getLogger("ratelimit.service")
_TOKENS = re.compile(
    r"""(?P<header>^[ \t]*\[\[[ \t]*(?:limit|"limit"|'limit')[ \t]*\]\])"""
    r"""|(?P<key>^[ \t]*(?:limit|"limit"|'limit')[ \t]*=)"""
    r'|"""(?:\\.|[^\\])*?"""|\'\'\'.*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'[^\'\n]*\''
    r"|#[^\n]*|(?P<open>[\[{])|(?P<close>[\]}])",
    re.MULTILINE | re.DOTALL,
)
_KEYS = {"domain", "descriptor", "rule", "shadow", "always_count", "penalty"}


@dataclass(frozen=True)
class DescriptorLimit:
    """One ``[[limit]]``: its ``rules`` as written, and ``tree``, the same counted per
    descriptor under ``selector``."""

    domain: str
    pattern: tuple[tuple[str, str | None], ...]
    rules: Node
    tree: Node
    selector: str
    shadow: bool
    line: int
    always: bool = False
    """``always_count``: counted whether or not it refuses (usage reports)."""
    override: bool = False
    """Its rules are an override's (kept in the store, or the request's own ``limit``)."""
    request: bool = False
    """Made from the request's own ``limit`` alone: no rules-file limit matches (``line``
    is 0)."""
    penalty: str | None = None
    """``penalty``: refusals that hold the descriptor back (:mod:`ratelimit.service.penalties`)."""

    @property
    def pinned(self) -> int:
        return sum(value is not None for _, value in self.pattern)

    def matches(self, entries: Sequence[tuple[str, str]]) -> bool:
        return len(entries) == len(self.pattern) and all(
            key == want_key and (want is None or value == want)
            for (key, value), (want_key, want) in zip(entries, self.pattern, strict=True)
        )

    @property
    def text(self) -> str:
        return ", ".join(key if value is None else f"{key}={value}" for key, value in self.pattern)


@dataclass(frozen=True)
class RulesFile:
    path: str
    limits: tuple[DescriptorLimit, ...]
    content: bytes = dataclasses.field(default=b"", compare=False, repr=False)
    """The file's bytes these limits were read from."""

    @property
    def domains(self) -> set[str]:
        return {limit.domain for limit in self.limits}

    def match(self, domain: str, entries: Sequence[tuple[str, str]]) -> DescriptorLimit | None:
        """The limit for one descriptor of ``domain`` (``None``: not limited)."""
        best: DescriptorLimit | None = None
        for limit in self.limits:
            better = best is None or limit.pinned > best.pinned
            if better and limit.domain == domain and limit.matches(entries):
                best = limit
        return best


def selector_of(domain: str, pattern: tuple[tuple[str, str | None], ...]) -> str:
    """The selector a limit counts under: stable for the same domain and descriptor pattern,
    so that counters survive a reload that leaves the limit in place."""
    digest = hashlib.sha1(repr((domain, pattern)).encode()).hexdigest()[:16]
    return f"d_{digest}"


def per_selector(node: Node, selector: str) -> Node:
    """``node`` with every rule counted per value of ``selector``."""
    return map_rules(node, lambda rule: dataclasses.replace(rule, selector=selector))


def escaped(field: str) -> str:
    r"""``field`` with each backslash doubled and each separator (the control character
    U+001F) written as the four characters ``\x1f``, so that fields joined by :func:`joined`
    never read as other fields joined. A field with neither is unchanged."""
    if "\\" not in field and "\x1f" not in field:
        return field
    return field.replace("\\", "\\\\").replace("\x1f", "\\x1f")


def joined(fields: Iterable[str]) -> str:
    """One selector value of several fields: distinct fields give distinct values."""
    return "\x1f".join(escaped(field) for field in fields)


def load(path: str | Path, algorithm: str = SLIDING_LOG) -> RulesFile:
    """Read and check a rules file for ``algorithm``; ``ConfigurationError`` naming the
    line of what is wrong."""
    name = str(path)
    try:
        content = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"rules file {name}: cannot be read: {exc.strerror}") from None
    return parse(content, name, algorithm)


def parse(content: bytes, name: str, algorithm: str = SLIDING_LOG) -> RulesFile:
    """Check the ``content`` of rules file ``name`` for ``algorithm`` (as :func:`load`)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"rules file {name}: not UTF-8 text: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"rules file {name}: not valid TOML: {exc}") from None
    lines = table_lines(text)
    unknown = sorted(set(data) - {"limit"})
    if unknown:
        raise ConfigurationError(
            f"rules file {name}: unknown table or key {unknown[0]!r}; the file holds [[limit]] "
            "tables"
        )
    entries = data.get("limit", [])
    if not isinstance(entries, list):
        raise ConfigurationError(f"rules file {name}: 'limit' must be [[limit]] tables")
    limits: list[DescriptorLimit] = []
    seen: dict[tuple[str, tuple[tuple[str, str | None], ...]], int] = {}
    for n, entry in enumerate(entries):
        line = lines[n] if n < len(lines) else 0
        limit = _limit(entry, f"rules file {name}, line {line} ([[limit]] #{n + 1})", line)
        earlier = seen.setdefault((limit.domain, limit.pattern), n)
        if earlier != n:
            raise ConfigurationError(
                f"rules file {name}, line {line}: domain {limit.domain!r} descriptor "
                f"[{limit.text}] is already limited at line {lines[earlier]}"
            )
        try:
            check_cost(compile_tree(limit.rules), 1, algorithm)
        except ConfigurationError as exc:
            raise ConfigurationError(f"rules file {name}, line {line}: {exc}") from None
        limits.append(limit)
    return RulesFile(name, tuple(limits), content)


def table_lines(text: str) -> list[int]:
    """The line (from 1) where each table of the ``limit`` array starts, in order, however
    the (valid) TOML ``text`` spells it: ``[[limit]]`` headers, or inline tables
    (``limit = [{...}, {...}]``, several on a line or one over several lines). Strings and
    comments are skipped, so a brace or bracket inside them starts nothing."""
    breaks = [n for n, char in enumerate(text) if char == "\n"]
    lines: list[int] = []
    opened: list[str] = []  # the brackets and braces open around the value being read
    limit_key = in_limit = False
    for token in _TOKENS.finditer(text):
        kind = token.lastgroup
        if kind == "header" and not opened:
            lines.append(bisect.bisect_left(breaks, token.start()) + 1)
        elif kind == "key" and not opened:
            limit_key = True
        elif kind == "open":
            if not opened:
                in_limit, limit_key = limit_key and token.group() == "[", False
            elif in_limit and opened == ["["] and token.group() == "{":
                lines.append(bisect.bisect_left(breaks, token.start()) + 1)
            opened.append(token.group())
        elif kind == "close" and opened:
            opened.pop()
    return lines


def _limit(entry: Any, where: str, line: int) -> DescriptorLimit:
    if not isinstance(entry, dict):
        raise ConfigurationError(f"{where}: a limit is a table")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown key {unknown[0]!r}; a limit has domain, descriptor, rule, "
            "shadow, always_count, penalty"
        )
    domain = entry.get("domain")
    if not isinstance(domain, str) or not domain:
        raise ConfigurationError(f"{where}: domain must be non-empty text")
    descriptor = entry.get("descriptor")
    if not isinstance(descriptor, list) or not descriptor:
        raise ConfigurationError(
            f'{where}: descriptor must be a list of entry keys, such as ["remote_address"] '
            'or ["path=/login", "remote_address"]'
        )
    pattern: list[tuple[str, str | None]] = []
    for item in descriptor:
        if not isinstance(item, str) or not item or item.startswith("="):
            raise ConfigurationError(
                f"{where}: descriptor entry {item!r} must be 'key' or 'key=value'"
            )
        key, sep, value = item.partition("=")
        pattern.append((key, value if sep else None))
    text = entry.get("rule")
    if not isinstance(text, str):
        raise ConfigurationError(f"{where}: rule must be text such as '10/s' or '5/m | 100/h'")
    try:
        rules = to_tree(text)
    except RuleSyntaxError as exc:
        raise ConfigurationError(f"{where}: rule {text!r}: {exc}") from None
    if any(leaf.selector for leaf in compile_tree(rules).rules):
        raise ConfigurationError(
            f"{where}: rule {text!r} names a selector; the descriptor's values select here, "
            "so write the rule without one (such as '10/s')"
        )
    shadow = entry.get("shadow", False)
    if not isinstance(shadow, bool):
        raise ConfigurationError(f"{where}: shadow must be true or false")
    always = entry.get("always_count", False)
    if not isinstance(always, bool):
        raise ConfigurationError(f"{where}: always_count must be true or false")
    frozen = tuple(pattern)
    selector = selector_of(domain, frozen)
    tree = per_selector(rules, selector)
    penalty = unselected_penalty(entry.get("penalty"), where)
    if penalty and always:
        raise ConfigurationError(f"{where}: always_count reports are never refused: no penalty")
    return DescriptorLimit(
        domain, frozen, rules, tree, selector, shadow, line, always, penalty=penalty
    )


SETTLE = 0.25
"""A changed rules file is read twice this far apart, and applied only when both agree."""

_Signature = tuple[int, int, int, int]


def _signature(path: str) -> _Signature | None:
    """What changes when a file is written or replaced (``None``: it cannot be read)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size, status.st_ino, status.st_dev)


def _read(path: str) -> tuple[_Signature | None, bytes | None]:
    try:
        return _signature(path), Path(path).read_bytes()
    except OSError:
        return None, None


class RulesWatcher:
    """The rules in force (``rules``), replaced when their file changes, so that a file
    caught while a writer rewrites it never drops a domain:

    - a file is applied only once it parsed whole and read the same twice (its bytes,
      size, modification time and inode), :data:`SETTLE` apart; else it is looked at
      again later;
    - a reload asked by a change of the file never removes a limit: when the new file
      lacks a limit (a domain and descriptor) the rules in force have (as an empty or
      half-written file does: a writer that paused after its first tables), the old rules
      stay, all of them, and a warning names what is missing; changed rules of a limit
      that stays, and new limits, are applied;
    - a reload the operator asks for (``explicit``: SIGHUP) applies the file as written,
      removed limits and domains included; so does a restart.
    """

    def __init__(
        self,
        rules: RulesFile,
        algorithm: str = SLIDING_LOG,
        reloaded: Callable[[bool, int], object] | None = None,
    ) -> None:
        self.rules = rules
        self.algorithm = algorithm
        self.reloaded = reloaded
        """Told of each reload: whether it applied, and the limits in force after it."""
        self._seen = _signature(rules.path)

    def look_again(self) -> None:
        """Take the file as changed, whatever it is: rules not read from it (a worker's
        snapshot, :mod:`ratelimit.service.rules_snapshot`) are replaced as a change of
        the file replaces them."""
        self._seen = None

    def changed(self) -> bool:
        """Whether the file differs from the one last looked at."""
        return _signature(self.rules.path) != self._seen

    async def reload(self, explicit: bool = False) -> bool:
        """Read the file and replace ``rules`` if it may (logging what it did, or why not);
        ``False`` when the file was still changing, to be looked at again."""
        path = self.rules.path
        first = _read(path)
        await asyncio.sleep(SETTLE)
        signature, content = _read(path)
        if (signature, content) != first:
            logger.info("ratelimit: rules file %s is being written; looked at again soon", path)
            return False
        self._seen = signature
        try:
            if content is None:
                raise ConfigurationError(f"rules file {path}: cannot be read")
            new = parse(content, path, self.algorithm)
        except ConfigurationError as exc:
            logger.error("ratelimit: rules file not reloaded, the old rules stay: %s", exc)
            self._tell(False)
            return True
        dropped = ", ".join(repr(domain) for domain in sorted(self.rules.domains - new.domains))
        kept = {(limit.domain, limit.pattern) for limit in new.limits}
        missing = [
            limit for limit in self.rules.limits if (limit.domain, limit.pattern) not in kept
        ]
        if missing and not explicit:
            what = (
                f"has no limit left for domain {dropped}, which had some"
                if dropped
                else "lacks "
                + ", ".join(f"domain {m.domain!r} [{m.text}] (line {m.line})" for m in missing)
            )
            logger.warning(
                "ratelimit: rules file not reloaded, the old rules stay: %s %s (as a file "
                "caught mid-rewrite looks); to remove limits, send SIGHUP once the file is "
                "written, or restart",
                path,
                what,
            )
            self._tell(False)
            return True
        self.rules = new
        self._tell(True)
        removed = f"; {len(missing)} limits removed" if missing else ""
        removed += f"; domain {dropped} removed" if dropped else ""
        logger.warning("ratelimit: rules file reloaded: %d limits%s", len(new.limits), removed)
        return True

    def _tell(self, applied: bool) -> None:
        if self.reloaded is not None:
            self.reloaded(applied, len(self.rules.limits))
