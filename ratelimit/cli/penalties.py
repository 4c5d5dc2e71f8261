"""``ratelimit penalties list|lift``: the holds of ``penalty=`` from the command line
(:class:`~ratelimit.penalties.penalizer.Penalties`)::

    ratelimit penalties list [--key login]
    ratelimit penalties lift login [ip=203.0.113.9]

On a shared store only (Redis, PostgreSQL): memory:// holds live in one process, which
this command is not.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ratelimit.cli.common import (
    FAILED,
    INVALID,
    OK,
    REFUSED,
    SPREAD,
    SPREAD_HELP,
    STORAGE_HELP,
    default_namespace,
    default_spread,
    limiter_of,
    namespace_help,
    namespace_hint,
    storage_of,
    unshared,
    values_of,
    who,
)
from ratelimit.errors import BackendError, ConfigurationError


def add_parser(commands: Any) -> None:
    """The ``penalties`` command, on ``commands`` (the top parser's subparsers)."""
    penalties = commands.add_parser(
        "penalties", help="list the callers held back by a penalty, or lift their holds"
    )
    penalties.add_argument("action", choices=("list", "lift"))
    penalties.add_argument("--storage", help=STORAGE_HELP)
    penalties.add_argument("--namespace", default=default_namespace(), help=namespace_help())
    penalties.add_argument(
        "--spread", choices=tuple(SPREAD), default=default_spread(), help=SPREAD_HELP
    )
    penalties.add_argument("--key", help="list: only this limit's key")
    penalties.add_argument(
        "words", nargs="*", help="lift: the limit's key, then at most one selector=value"
    )


def _left(seconds: float) -> str:
    whole = int(seconds + 0.999)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


async def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.action == "list" and args.words:
        parser.error("penalties list takes --key at most")
    if args.action == "lift" and not 1 <= len(args.words) <= 2:
        parser.error("penalties lift takes the key, then at most one selector=value")
    if args.action == "lift" and args.key is not None:
        parser.error("penalties lift takes the key as its first word, not --key")
    values = values_of(args.words[1:], parser) if args.action == "lift" else {}
    args.algorithm = None
    storage = storage_of(args)
    if storage is None:
        return FAILED
    if unshared(storage, "penalties"):
        return INVALID
    try:
        async with limiter_of(args, storage) as rl:
            where = f"in namespace {args.namespace!r}"
            if args.action == "list":
                holds = await rl.penalties.list(args.key)
                of_key = "" if args.key is None else f" of key {args.key!r}"
                if not holds:
                    print(f"no holds{of_key} {where} ({namespace_hint(args.namespace)})")
                else:
                    print(f"{len(holds)} hold{'' if len(holds) == 1 else 's'}{of_key} {where}:")
                for hold in sorted(holds):
                    held = "(whole key)" if hold.selector is None else f"{hold.selector}="
                    value = "" if hold.selector is None else hold.value
                    print(f"{hold.key!r} {held}{value}: {_left(hold.left)} left")
                return OK
            key = args.words[0]
            lifted = await rl.penalties.lift(key, **values)
            whom = who(values) if values else "every value"
            print(f"lifted {lifted} hold{'' if lifted == 1 else 's'} of {key!r} for {whom} {where}")
            return OK if lifted else REFUSED
    except BackendError as exc:
        print(f"storage failed: {exc}", file=sys.stderr)
        return FAILED
    except (ConfigurationError, ValueError, TypeError) as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return INVALID
