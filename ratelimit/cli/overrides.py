"""``ratelimit override set|get|delete|list``: overrides from the command line
(:class:`~ratelimit.overrides.handle.Overrides`)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time

from ratelimit.cli.common import (
    FAILED,
    INVALID,
    OK,
    REFUSED,
    limiter_of,
    namespace_hint,
    storage_of,
    unshared,
    values_of,
    who,
)
from ratelimit.errors import BackendError, ConfigurationError, RuleSyntaxError
from ratelimit.front.limiter import RateLimit
from ratelimit.overrides.cache import Override

PAIR = re.compile(r"[A-Za-z_]\w*=")
"""A word of the command line that is a selector value (``apikey=abc``), not rules."""


def until(override: Override) -> str:
    """When ``override`` expires, in words (``""``: never). An expiry past what a calendar
    shows (kept by an older version, which took any ``ttl``) is said in seconds."""
    if override.expires is None:
        return ""
    try:
        return f", until {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(override.expires))} UTC"
    except (OverflowError, OSError, ValueError):
        return f", until {override.expires:.0f} seconds after the epoch"


def _override_args(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[dict[str, str], str | None]:
    """The ``name=value`` pairs and the rules among an override command's words."""
    pairs = [word for word in args.words if PAIR.match(word)]
    rules = [word for word in args.words if not PAIR.match(word)]
    if args.action == "set" and len(rules) != 1:
        parser.error("override set takes the rules once, such as 'apikey:1000/h'")
    if args.action != "set" and rules:
        parser.error(f"override {args.action} takes name=value pairs only, not {rules[0]!r}")
    if args.action == "list" and pairs:
        parser.error("override list takes --key at most, no name=value pairs")
    if args.action != "list" and not args.key:
        parser.error(f"override {args.action} needs --key")
    if args.ttl is not None and args.action != "set":
        parser.error("--ttl goes with override set")
    return values_of(pairs, parser), rules[0] if rules else None


async def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    values, rules = _override_args(args, parser)
    if args.action != "set":  # reading and deleting records: no rules to suit an algorithm
        args.algorithm = None
    storage = storage_of(args)
    if storage is None:
        return FAILED
    if unshared(storage, "overrides"):
        return INVALID
    try:
        async with limiter_of(args, storage) as rl:
            return await _override_action(rl, args, values, rules)
    except BackendError as exc:
        print(f"storage failed: {exc}", file=sys.stderr)
        return FAILED
    except (RuleSyntaxError, ConfigurationError, ValueError, TypeError) as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return INVALID


async def _override_action(
    rl: RateLimit, args: argparse.Namespace, values: dict[str, str], rules: str | None
) -> int:
    overrides = rl.overrides
    if args.action == "set":
        assert rules is not None
        done = await overrides.set(args.key, rules, ttl=args.ttl, **values)
        print(f"set: {done}{until(done)}")
        if not await overrides.known(args.key):
            keys = await overrides.limited_keys()
            close = difflib.get_close_matches(args.key, keys, n=3, cutoff=0.6)
            hint = (
                f"; did you mean {' or '.join(map(repr, close))}?"
                if close
                else f"; the keys decided there: {', '.join(map(repr, keys[:10]))}"
                if keys
                else ""
            )
            print(
                f"warning: no process has decided a call of key {args.key!r} in namespace "
                f"{args.namespace!r} yet; the override is kept, and applies where a limit "
                f"has that key (check the key and --namespace){hint}",
                file=sys.stderr,
            )
        return OK
    where = f"in namespace {args.namespace!r}"
    if args.action == "list":
        found = await overrides.list(args.key)
        of_key = "" if args.key is None else f" of key {args.key!r}"
        if not found:
            print(f"no overrides{of_key} {where} ({namespace_hint(args.namespace)})")
        else:
            print(f"{len(found)} override{'' if len(found) == 1 else 's'}{of_key} {where}:")
        for override in found:
            print(f"{override}{until(override)}")
        return OK
    if args.action == "get":
        got = await overrides.get(args.key, **values)
        print(
            f"{got}{until(got)}"
            if got
            else f"no override of {args.key!r} for {who(values)} {where}"
        )
        return OK if got else REFUSED
    deleted = await overrides.delete(args.key, **values)
    print(f"{'deleted' if deleted else 'none was set'}: {args.key!r} for {who(values)} {where}")
    return OK if deleted else REFUSED
