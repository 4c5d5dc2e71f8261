"""The ``ratelimit`` command (also ``python -m ratelimit``).

::

    ratelimit check "apikey:100/h & (10/s | 15/m)"     # parse and explain rules
    ratelimit check rules.toml                          # validate a service rules file
    ratelimit peek  --storage redis://... --key search "user:5/m" user=alice
    ratelimit reset --storage redis://... --key search "user:5/m" user=alice
    ratelimit migrate --storage postgresql://...        # prepare the store (its schema)
    ratelimit serve                                     # the gRPC service (extra: server)

``--storage`` defaults to ``$RATELIMIT_STORAGE``, else ``memory://``.

Exit codes: 0 fine (``peek``: the call would be admitted; ``migrate``: the store is
prepared); 1 the rules or rules file are invalid, or (``peek``) the call would be refused;
2 the command line is wrong; 3 the storage URL is malformed, the storage failed, or the
service could not start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ratelimit.algorithms import ALGORITHMS, SLIDING_LOG, SLIDING_WINDOW
from ratelimit.backends.urls import redacted, storage_url_problem
from ratelimit.errors import BackendError, ConfigurationError, RuleSyntaxError
from ratelimit.limiter import RateLimit
from ratelimit.rules import And, Node, Rule, to_tree

OK, REFUSED, USAGE, FAILED = 0, 1, 2, 3
INVALID = REFUSED
STORAGE_HELP = "a storage URL (default: $RATELIMIT_STORAGE, else memory://)"


def explain(node: Node, depth: int = 0) -> list[str]:
    """Lines saying what a rule tree limits, one per rule and per combination."""
    pad = "  " * depth
    if isinstance(node, Rule):
        per = f", per value of {node.selector!r}" if node.selector else ", shared by every call"
        burst = "" if node.burst is None else f", up to {node.burst} at once (gcra)"
        what = "calls" if node.unit is None else node.unit
        return [f"{pad}{node}: {node.count} {what} per {_span(node.span_ms)}{burst}{per}"]
    how = "every one of these" if isinstance(node, And) else "any of these"
    lines = [f"{pad}limited when {how} is limited:"]
    for child in node.children:
        lines += explain(child, depth + 1)
    return lines


def _span(ms: int) -> str:
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000),
                       ("second", 1_000), ("ms", 1)):  # fmt: skip
        if ms % size == 0:
            n = ms // size
            return f"{n} {unit}{'s' if n != 1 and unit != 'ms' else ''}" if n != 1 else unit
    return f"{ms} ms"


def _check(args: argparse.Namespace) -> int:
    target: str = args.rules
    if target.endswith(".toml") or _is_file(target):
        from ratelimit.service import rules_file

        try:
            loaded = rules_file.load(target)
        except ConfigurationError as exc:
            print(f"invalid: {exc}", file=sys.stderr)
            return INVALID
        domains = sorted(loaded.domains)
        count = f"{_plural(len(loaded.limits), 'limit')} in {_plural(len(domains), 'domain')}"
        print(f"{target}: {count} ({', '.join(domains)})")
        for limit in loaded.limits:
            shadow = " (shadow)" if limit.shadow else ""
            print(f"  line {limit.line}: {limit.domain} [{limit.text}]: {limit.rules}{shadow}")
        return OK
    try:
        tree = to_tree(target)
    except RuleSyntaxError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return INVALID
    print(tree)
    print("\n".join(explain(tree, 1)))
    return OK


def _is_file(target: str) -> bool:
    """Whether ``target`` names a file; rules too long or odd for a file name are not one."""
    try:
        return Path(target).is_file()
    except (OSError, ValueError):  # ENAMETOOLONG, a NUL byte
        return False


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _values(pairs: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            parser.error(f"selector values are name=value, not {pair!r}")
        values[name] = value
    return values


def _storage(args: argparse.Namespace) -> str | None:
    """The storage URL ``--storage`` (or ``RATELIMIT_STORAGE``) gives, or ``None`` after
    saying on stderr what is wrong with it, naming where it came from."""
    url: str | None = args.storage
    named = "--storage"
    if url is None:
        url = os.environ.get("RATELIMIT_STORAGE", "").strip() or "memory://"
        named = "RATELIMIT_STORAGE"
    problem = storage_url_problem(url)
    if problem is None:
        return url
    print(f"bad storage URL: {named}={redacted(url)!r}: {problem}", file=sys.stderr)
    return None


async def _migrate(args: argparse.Namespace) -> int:
    url = _storage(args)
    if url is None:
        return FAILED
    try:
        async with RateLimit.from_url(url, algorithm=SLIDING_WINDOW, on_error="raise") as rl:
            done = await rl.setup()
    except (BackendError, ConfigurationError) as exc:
        print(f"storage failed: {exc}", file=sys.stderr)
        return FAILED
    print(f"{redacted(url)}: {done}")
    return OK


async def _peek_or_reset(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    values = _values(args.values, parser)
    try:
        tree = to_tree(args.rules)
    except RuleSyntaxError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return INVALID
    storage = _storage(args)
    if storage is None:
        return FAILED
    try:
        # on_error="raise": a storage that fails is reported (exit 3), never guessed at
        limiter = RateLimit.from_url(
            storage, namespace=args.namespace, on_error="raise", algorithm=args.algorithm
        )
        async with limiter as rl:
            limit = rl.limit(tree, args.key, values)  # values: the selector object
            if args.command == "reset":
                await limit.reset()
                print(f"reset: {args.key!r} for {_who(values)}")
                return OK
            decision = await limit.peek()
    except BackendError as exc:
        print(f"storage failed: {exc}", file=sys.stderr)
        return FAILED
    except (ConfigurationError, LookupError, TypeError) as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return INVALID
    if decision.allowed:
        print(f"would be admitted: {decision.remaining} left after it (rule {decision.rule})")
    else:
        print(f"would be refused by {decision.rule}: retry after {decision.retry_after:.3f} s")
    for state in decision.states:
        mark = "limited" if state.limited else f"{state.remaining} left"
        print(f"  {state.rule}: {mark}, for {state.reset_after:.3f} s")
    return OK if decision.allowed else REFUSED


def _who(values: dict[str, str]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "every caller"


def _serve(args: argparse.Namespace) -> int:
    try:
        from ratelimit.service.config import ServiceConfig
        from ratelimit.service.server import serve
    except ImportError as exc:
        print(
            f"ratelimit serve needs the server extra (pip install 'ratelimit-rules[server]'): "
            f"{exc}",
            file=sys.stderr,
        )
        return FAILED
    env = dict(os.environ)
    flags = {"port": "PORT", "storage": "STORAGE", "rules_file": "RULES_FILE", "host": "HOST"}
    flags["algorithm"] = "ALGORITHM"
    for flag, name in flags.items():
        variable = f"RATELIMIT_{name}"
        if getattr(args, flag) is not None:
            env[variable] = str(getattr(args, flag))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = ServiceConfig.from_env(env)
        asyncio.run(serve(config))
    except ConfigurationError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        pass
    return OK


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="ratelimit",
        description="Distributed rate limiting: check rules, peek at and reset counters, serve.",
        epilog="exit codes: 0 fine or admitted; 1 invalid, or refused (peek); 2 usage; "
        "3 storage URL malformed, storage failed, or the service could not start",
    )
    commands = top.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="parse and explain rules, or validate a rules file")
    check.add_argument("rules", help="rules such as 'user:10/m & 100/h', or a rules file (.toml)")
    helps = {
        "peek": "say whether a call would be admitted, counting nothing",
        "reset": "forget the hits counted for a key and selector values",
    }
    for name, what in helps.items():
        command = commands.add_parser(name, help=what)
        command.add_argument("--storage", help=STORAGE_HELP)
        command.add_argument(
            "--namespace", default=os.environ.get("RATELIMIT_NAMESPACE", "ratelimit")
        )
        command.add_argument(
            "--algorithm",
            choices=ALGORITHMS,
            default=os.environ.get("RATELIMIT_ALGORITHM", SLIDING_LOG),
            help="the algorithm the limit's counters were kept by (default sliding-log)",
        )
        command.add_argument("--key", required=True, help="the limit's key")
        command.add_argument("rules", help="the limit's rules, such as 'user:5/m'")
        command.add_argument("values", nargs="*", help="selector values: name=value ...")
    migrate = commands.add_parser(
        "migrate",
        help="prepare the store: on Postgres, create or update its table and functions "
        "(for deployments that forbid DDL at run time); nothing to do on Redis or memory",
    )
    migrate.add_argument("--storage", help=STORAGE_HELP)
    serve = commands.add_parser(
        "serve", help="run the gRPC service (ratio's API and Envoy's RLS); RATELIMIT_* configure it"
    )
    serve.add_argument("--port", type=int)
    serve.add_argument("--host")
    serve.add_argument("--storage")
    serve.add_argument("--rules-file", dest="rules_file")
    serve.add_argument(
        "--algorithm", choices=ALGORITHMS, help="as RATELIMIT_ALGORITHM (default sliding-log)"
    )
    return top


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    if args.command == "check":
        return _check(args)
    if args.command in ("peek", "reset"):
        return asyncio.run(_peek_or_reset(args, top))
    if args.command == "migrate":
        return asyncio.run(_migrate(args))
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
