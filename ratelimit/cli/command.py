"""The ``ratelimit`` command (also ``python -m ratelimit``).

::

    ratelimit check "apikey:100/h & (10/s | 15/m)"     # parse rules, say what they mean
    ratelimit check rules.toml                          # validate a service rules file
    ratelimit peek  --storage redis://... --key search "user:5/m" user=alice
    ratelimit reset --storage redis://... --key search "user:5/m" user=alice
    ratelimit migrate --storage postgresql://...        # prepare the store (its schema)
    ratelimit override set --key search apikey=abc "apikey:1000/h" --ttl 86400
    ratelimit override get|delete --key search apikey=abc
    ratelimit override list [--key search]
    ratelimit serve                                     # the gRPC service (extra: server)

``--storage`` defaults to ``$RATELIMIT_STORAGE``, else ``memory://``; ``--namespace`` to
``$RATELIMIT_NAMESPACE``, else ``""``, the library's default (as ``RateLimit(...)`` and the
service). ``peek``, ``reset`` and ``override`` print the namespace they read, and say when
they found nothing there. ``check`` says in words what each tree means
(:mod:`ratelimit.cli.explain`): ``&`` refuses only when every side would; and where its
counters live on a Redis Cluster (spread by its one selector, or one slot for the key).
``peek``, ``reset``, ``override`` and ``serve`` take ``--spread auto|on|off`` (default
``$RATELIMIT_SPREAD``, else ``auto``): the ``spread`` setting of a Redis store, so that they
read the keys an application with that setting writes. ``redis+cluster://host:port`` opens a
Redis Cluster.

Exit codes: 0 fine (``peek``: the call would be admitted; ``migrate``: the store is
prepared; ``override get|delete``: there was one); 1 the rules or rules file are invalid,
or (``peek``) the call would be refused, or (``override get|delete``) there was none;
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

from ratelimit.algorithms import ALGORITHMS, SLIDING_WINDOW
from ratelimit.backends.urls import redacted
from ratelimit.cli import overrides as cli_overrides
from ratelimit.cli import penalties as cli_penalties
from ratelimit.cli.common import (
    ALGORITHM_HELP,
    FAILED,
    INVALID,
    OK,
    REFUSED,
    SPREAD,
    SPREAD_HELP,
    STORAGE_HELP,
    USAGE,
    default_algorithm,
    default_namespace,
    default_spread,
    limiter_of,
    namespace_help,
    nothing_counted,
    storage_of,
    unshared,
    values_of,
    who,
)
from ratelimit.cli.explain import describe, placement
from ratelimit.core.decision import Decision
from ratelimit.errors import BackendError, ConfigurationError, RuleSyntaxError
from ratelimit.front.limiter import RateLimit
from ratelimit.rules.tree import to_tree


def _check(args: argparse.Namespace) -> int:
    if args.envoy_config is not None:  # as envoyproxy/ratelimit's config_check_cmd
        from ratelimit.service.envoy_config import check_directory

        ok, lines = check_directory(args.envoy_config, args.merge_domain_configs, args.algorithm)
        print("\n".join(lines))
        return OK if ok else INVALID
    if args.rules is None:
        print("check: give rules, a rules file, or --envoy-config DIR", file=sys.stderr)
        return USAGE
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
            print(f"    {describe(limit.rules, per=f'descriptor [{limit.text}]')}")
        print(RULES_FILE_PLACEMENT)
        return OK
    try:
        tree = to_tree(target)
    except RuleSyntaxError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return INVALID
    print(tree)
    print(f"  {describe(tree)}")
    print(f"  {placement(tree)}")
    return OK


RULES_FILE_PLACEMENT = (
    "on a Redis Cluster: one slot per domain (pinned: the service decides a request's "
    "descriptors together, atomically)"
)


def _is_file(target: str) -> bool:
    """Whether ``target`` names a file; rules too long or odd for a file name are not one."""
    try:
        return Path(target).is_file()
    except (OSError, ValueError):  # ENAMETOOLONG, a NUL byte
        return False


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


async def _migrate(args: argparse.Namespace) -> int:
    url = storage_of(args)
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
    values = values_of(args.values, parser)
    try:
        tree = to_tree(args.rules)
    except RuleSyntaxError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return INVALID
    storage = storage_of(args)
    if storage is None:
        return FAILED
    if unshared(storage, "counters"):
        return INVALID
    try:
        async with limiter_of(args, storage) as rl:  # a failing storage: exit 3
            limit = rl.limit(tree, args.key, values)  # values: the selector object
            decision = await limit.peek()
            if args.command == "reset":
                await limit.reset()
                if _counted(decision):
                    print(f"reset: {args.key!r} for {who(values)} in namespace {args.namespace!r}")
                else:
                    print(f"reset: {nothing_counted(args, values)}")
                return OK
            found = await rl.overrides.in_force(args.key, **values) if decision.override else None
    except BackendError as exc:
        print(f"storage failed: {exc}", file=sys.stderr)
        return FAILED
    except (ConfigurationError, LookupError, TypeError) as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return INVALID
    print(f"namespace {args.namespace!r}, key {args.key!r}, {who(values)}")
    if decision.states and not _counted(decision):
        print(nothing_counted(args, values))
    if found is not None:
        whose = f"override of {who(found.selectors)}{cli_overrides.until(found)}"
        print(f"rules in force: {found.rules} ({whose})")
    else:
        print(f"rules in force: {tree} (the limit's own)")
    if decision.allowed and decision.rule is None:  # a rule's selector had no value
        print(
            "would be admitted, and no rule can refuse these values (a selector without a "
            "value counts nothing, and & refuses only when every side would)"
        )
    elif decision.allowed:
        print(f"would be admitted: {decision.remaining} left after it (rule {decision.rule})")
    else:
        print(f"would be refused by {decision.rule}: retry after {decision.retry_after:.3f} s")
    for state in decision.states:
        mark = "limited" if state.limited else f"{state.remaining} left"
        print(f"  {state.rule}: {mark}, for {state.reset_after:.3f} s")
    return OK if decision.allowed else REFUSED


def _counted(peeked: Decision) -> bool:
    """Whether a peek found any hit counted: a rule that has fewer calls left after the
    peeked call than it would with nothing counted."""
    return any(
        state.limited or state.remaining < (state.rule.burst or state.rule.count) - 1
        for state in peeked.states
    )


def _serve_envoy(args: argparse.Namespace) -> int:
    """``ratelimit serve --envoy``: envoyproxy/ratelimit's service, configured as it is
    (its environment variables)."""
    given = [f"--{flag.replace('_', '-')}" for flag in SERVE_FLAGS if getattr(args, flag)]
    if given:
        print(
            f"cannot start: {', '.join(given)} with --envoy: the service reads "
            "envoyproxy/ratelimit's variables (GRPC_PORT, PORT, REDIS_URL, RUNTIME_ROOT, ...)",
            file=sys.stderr,
        )
        return FAILED
    try:
        from ratelimit.service.envoy_service.server import configure_logging, serve_envoy
        from ratelimit.service.envoy_service.settings import EnvoySettings, unhonoured
    except ImportError as exc:
        advice = "ratelimit serve needs the server extra: pip install 'ratelimit-rules[server]'"
        said = "pip install 'ratelimit-rules[" in str(exc)
        print(str(exc) if said else f"{advice} ({exc})", file=sys.stderr)
        return FAILED
    try:
        settings = EnvoySettings.from_env(os.environ)
        configure_logging(settings.log_level, settings.log_format)
        asyncio.run(serve_envoy(settings, unhonoured(os.environ)))
    except ConfigurationError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        pass
    return OK


SERVE_FLAGS: tuple[str, ...] = ("port", "host", "storage", "rules_file", "algorithm", "workers")
SERVE_FLAGS += ("metrics_port", "tls_cert", "tls_key", "tls_client_ca")


def _serve(args: argparse.Namespace) -> int:
    if args.envoy:
        return _serve_envoy(args)
    try:
        from ratelimit.service.config import ServiceConfig
        from ratelimit.service.server import serve
    except ImportError as exc:
        advice = "ratelimit serve needs the server extra: pip install 'ratelimit-rules[server]'"
        # an import under needs_extra() says the same already, naming the missing module
        said = "pip install 'ratelimit-rules[" in str(exc)
        print(str(exc) if said else f"{advice} ({exc})", file=sys.stderr)
        return FAILED
    env = dict(os.environ)
    flags = {"port": "PORT", "storage": "STORAGE", "rules_file": "RULES_FILE", "host": "HOST"}
    flags |= {"spread": "SPREAD"}
    flags |= {"algorithm": "ALGORITHM", "workers": "WORKERS", "metrics_port": "METRICS_PORT"}
    flags |= {"tls_cert": "TLS_CERT", "tls_key": "TLS_KEY", "tls_client_ca": "TLS_CLIENT_CA"}
    for flag, name in flags.items():
        variable = f"RATELIMIT_{name}"
        if getattr(args, flag) is not None:
            env[variable] = str(getattr(args, flag))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = ServiceConfig.from_env(env)
        if config.workers > 1:
            from ratelimit.service.workers import supervise

            return supervise(config, env)
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
        description="Distributed rate limiting: check rules, peek at and reset counters, "
        "override rules at run time, serve.",
        epilog="exit codes: 0 fine or admitted; 1 invalid, or refused (peek); 2 usage; "
        "3 storage URL malformed, storage failed, or the service could not start",
    )
    commands = top.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="parse and explain rules, or validate a rules file")
    check.add_argument(
        "rules", nargs="?", help="rules such as 'user:10/m & 100/h', or a rules file (.toml)"
    )
    check.add_argument(
        "--envoy-config",
        metavar="DIR",
        help="validate a directory of envoyproxy/ratelimit YAML files as its config_check_cmd "
        "does (exit 0, or 1 with the file and its fault)",
    )
    check.add_argument(
        "--merge-domain-configs",
        action="store_true",
        help="with --envoy-config: merge files of one domain (MERGE_DOMAIN_CONFIG)",
    )
    check.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        help="with --envoy-config: its limits for our algorithm, as serve --envoy reads them "
        "with RATELIMIT_ALGORITHM (rate_limit lists and rule: allowed)",
    )
    helps = {
        "peek": "say whether a call would be admitted, counting nothing",
        "reset": "forget the hits counted for a key and selector values",
    }
    for name, what in helps.items():
        command = commands.add_parser(name, help=what)
        command.add_argument("--storage", help=STORAGE_HELP)
        command.add_argument("--namespace", default=default_namespace(), help=namespace_help())
        command.add_argument(
            "--algorithm",
            choices=ALGORITHMS,
            default=default_algorithm(),
            help=ALGORITHM_HELP,
        )
        command.add_argument(
            "--spread", choices=tuple(SPREAD), default=default_spread(), help=SPREAD_HELP
        )
        command.add_argument("--key", required=True, help="the limit's key")
        command.add_argument("rules", help="the limit's rules, such as 'user:5/m'")
        command.add_argument("values", nargs="*", help="selector values: name=value ...")
    override = commands.add_parser(
        "override",
        help="set, read or delete the rules a key runs under for some callers, at run time",
    )
    override.add_argument("action", choices=("set", "get", "delete", "list"))
    override.add_argument("--storage", help=STORAGE_HELP)
    override.add_argument("--namespace", default=default_namespace(), help=namespace_help())
    override.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=default_algorithm(),
        help=ALGORITHM_HELP + "; the rules set must suit it",
    )
    override.add_argument(
        "--spread", choices=tuple(SPREAD), default=default_spread(), help=SPREAD_HELP
    )
    override.add_argument("--key", help="the limit's key (list: all keys without it)")
    override.add_argument("--ttl", type=float, help="seconds until it expires (set)")
    override.add_argument(
        "words", nargs="*", help="selector values name=value ..., and (set) the rules"
    )
    cli_penalties.add_parser(commands)
    _add_serving(commands)
    return top


def _add_serving(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``ratelimit migrate`` and ``ratelimit serve``: preparing the store, running the service."""
    migrate = commands.add_parser(
        "migrate",
        help="prepare the store: on Postgres, create or update its table and functions "
        "(for deployments that forbid DDL at run time); nothing to do on Redis or memory",
    )
    migrate.add_argument("--storage", help=STORAGE_HELP)
    serve = commands.add_parser(
        "serve", help="run the gRPC service (ratio's API and Envoy's RLS); RATELIMIT_* configure it"
    )
    serve.add_argument(
        "--envoy",
        action="store_true",
        help="be envoyproxy/ratelimit's service: its YAML directory (RUNTIME_ROOT...), its "
        "environment variables, its answers and stats (docs/migrating-from-envoy-ratelimit.md)",
    )
    serve.add_argument("--port", type=int)
    serve.add_argument("--host")
    serve.add_argument("--storage")
    serve.add_argument("--rules-file", dest="rules_file")
    serve.add_argument(
        "--spread",
        choices=tuple(SPREAD),
        help="as RATELIMIT_SPREAD (default auto): the spread setting of the service's "
        "limiter; its own limits are always kept one slot per key",
    )
    serve.add_argument(
        "--algorithm", choices=ALGORITHMS, help="as RATELIMIT_ALGORITHM (default sliding-log)"
    )
    serve.add_argument(
        "--workers", type=int, help="processes answering on the port, as RATELIMIT_WORKERS"
    )
    serve.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        help="where /metrics is served, as RATELIMIT_METRICS_PORT (default 9464)",
    )
    serve.add_argument(
        "--tls-cert", dest="tls_cert", help="the server's certificate chain, PEM: serve over TLS"
    )
    serve.add_argument("--tls-key", dest="tls_key", help="its private key, PEM (unencrypted)")
    serve.add_argument(
        "--tls-client-ca",
        dest="tls_client_ca",
        help="CA certificates, PEM: only clients with a certificate they signed (mutual TLS)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args, extra = top.parse_known_args(argv)
    if extra:  # an override's words after its options: argparse took the first ones only
        if args.command != "override" or any(word.startswith("-") for word in extra):
            top.error(f"unrecognized arguments: {' '.join(extra)}")
        args.words += extra
    spread = getattr(args, "spread", None)
    if spread is not None and spread.lower() not in SPREAD:  # from $RATELIMIT_SPREAD
        top.error(f"RATELIMIT_SPREAD={spread!r}: use auto, on or off")
    if args.command == "check":
        return _check(args)
    if args.command in ("peek", "reset"):
        return asyncio.run(_peek_or_reset(args, top))
    if args.command == "migrate":
        return asyncio.run(_migrate(args))
    if args.command == "override":
        return asyncio.run(cli_overrides.run(args, top))
    if args.command == "penalties":
        return asyncio.run(cli_penalties.run(args, top))
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
