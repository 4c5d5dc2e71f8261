"""What the decorators of ``limit()`` and ``concurrency()`` share: checking what they wrap,
binding a call's arguments for its selectors, and the key of a block without ``key=``."""

from __future__ import annotations

import asyncio
import difflib
import functools
import hashlib
import inspect
import itertools
import sys
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

from ratelimit.core.plan import CompiledTree
from ratelimit.core.selectors import CallSite, Parameters, SelectorSources, unannotated_first
from ratelimit.core.slots import SlotLimit
from ratelimit.errors import SelectorNotFoundError
from ratelimit.front.chosen import ChosenRules

_MARKED = getattr(asyncio.coroutines, "_is_coroutine", None)
"""What ``asgiref.sync.markcoroutinefunction`` sets before Python 3.12 (which has
``inspect.markcoroutinefunction``, seen by ``inspect.iscoroutinefunction``)."""


def function_name(func: Callable[..., Any]) -> str:
    """``module.qualname``: a decorated function's default key."""
    return f"{getattr(func, '__module__', None) or '?'}.{getattr(func, '__qualname__', func)}"


def wrappable(func: object, what: str, generators: str) -> Parameters:
    """The parameters of ``func``, which ``what()`` decorates; ``generators`` says why a
    generator function cannot be."""
    if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
        raise TypeError(f"cannot decorate generator function {function_name(func)}: {generators}")
    if not callable(func):
        raise TypeError(f"{what}() decorates functions, not {type(func).__name__}")
    return Parameters(inspect.signature(func))


def is_async(func: object) -> bool:
    """Whether calling ``func`` gives a coroutine, by its definition: an ``async def`` (or
    a method of one), a ``functools.partial``, ``staticmethod`` or ``classmethod`` of one,
    an object whose ``__call__`` is one, or a function marked as one
    (``inspect.markcoroutinefunction``)."""
    while isinstance(func, (functools.partial, staticmethod, classmethod)):
        func = func.func if isinstance(func, functools.partial) else func.__func__
    if inspect.iscoroutinefunction(func):
        return True
    if _MARKED is not None and getattr(func, "_is_coroutine", None) is _MARKED:
        return True
    if callable(func) and not inspect.isroutine(func) and not isinstance(func, type):
        return is_async(type(func).__call__)
    return False


def coroutine_only(func: object, what: str) -> None:
    """Refuse a plain function for the async ``what()``: its callers would get a coroutine
    that nobody awaits. Generators and what is not callable are :func:`wrappable`'s."""
    if not callable(func) or is_async(func):
        return
    wrapped = getattr(func, "__wrapped__", None)  # a functools.wraps'd def passing one on
    if inspect.isfunction(func) and wrapped is not None and is_async(wrapped):
        return
    if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
        return
    raise TypeError(
        f"ratelimit.RateLimit.{what}() decorates coroutine functions, not plain function "
        f"{function_name(func)}: use ratelimit.sync.RateLimit for plain functions (the same "
        "rules, on the same stores), or make it async def"
    )


def findable(
    rules: CompiledTree | ChosenRules | tuple[SlotLimit, ...],
    sources: SelectorSources,
    parameters: Parameters,
    func: Callable[..., Any],
    key: str,
    what: str = "limit",
) -> None:
    """Raise :class:`SelectorNotFoundError` now, when ``what()`` decorates ``func``, for a
    selector of ``rules`` that no call could find (:mod:`ratelimit.core.selectors`): no keyword
    of ``what()`` gives it, there is no ``selector=`` object, ``func`` has no parameter of
    that name nor ``**kwargs``, and its first argument is not an object that might hold it
    (:meth:`Parameters.may_give`). Otherwise a call looks, as it always has."""
    if sources.obj is not None:
        return
    for name, rule in _selector_rules(rules):
        if name in sources.keywords or parameters.may_give(name):
            continue
        kinds = inspect.Parameter
        own = [
            p.name
            for p in parameters.signature.parameters.values()
            if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        ]
        close = difflib.get_close_matches(name, [*own, *sources.keywords], n=1)
        if unannotated_first(parameters.signature) and not difflib.get_close_matches(
            name, own[:1]
        ):  # maybe an attribute of a first argument such as a request (request.user beside
            continue  # a parameter user_id): the call tells; usr on login(user) is a typo
        hint = f"did you mean {close[0]!r}?" if close else f"pass {name}= to {what}()"
        keywords = ", ".join(sources.keywords) or "none"
        function = f"{function_name(func)}{parameters.signature}"
        raise SelectorNotFoundError(
            name,
            key,
            [f"keyword arguments of {what}() ({keywords})", f"parameters of {function}"],
            f"selector {name!r} of rule '{rule}' can come from no call of {function}: it is "
            f"not one of its parameters, nor a keyword argument of {what}() ({keywords}), and "
            f"there is no selector= object; {hint}",
        )


def _selector_rules(
    rules: CompiledTree | ChosenRules | tuple[SlotLimit, ...],
) -> Iterator[tuple[str, object]]:
    """Each selector of ``rules`` with the first rule naming it (none for rules that a
    callable chooses per call)."""
    if isinstance(rules, tuple):
        trees: list[tuple[object, ...]] = [rules]
    elif isinstance(rules, ChosenRules):
        trees = [c.rules for c in rules.entries.values()]
    else:
        trees = [rules.rules]
    seen = set()
    for tree in trees:
        for rule in tree:
            name = getattr(rule, "selector", None)
            if name is not None and name not in seen:
                seen.add(name)
                yield name, rule


_SITES: dict[tuple[int, int], tuple[CodeType, str]] = {}


def block_key(depth: int) -> str:
    """The key of a limit made without ``key=`` and used as a block or by its methods: where
    it was made, the caller ``depth`` frames up: ``module.qualname:line:column`` of the call
    of ``limit()`` (``module:line:column`` at a module's top level; the column counts from
    1, so that two limits made on one line count apart; comprehensions are left out of the
    qualname, as Python 3.12 runs them inline). Code typed in (a REPL, a notebook cell,
    ``exec``), whose lines all count from 1, adds a digest of what it says, so that two
    such statements count apart and the same one run again counts on. Worked out once
    per place."""
    frame = sys._getframe(depth + 1)
    code = frame.f_code
    where = (id(code), frame.f_lasti)  # a code object hashes its constants: slow
    found = _SITES.get(where)
    if found is not None and found[0] is code:  # kept alive by the cache: its own id
        return found[1]
    if len(_SITES) >= 4096:  # code made at run time (exec) must not pile up
        _SITES.clear()
    key = _place(frame.f_globals.get("__name__") or "?", code, frame)
    _SITES[where] = (code, key)
    return key


def _place(module: str, code: CodeType, frame: FrameType) -> str:
    parts = [part for part in code.co_qualname.split(".") if part not in _INLINED]
    if parts[-1:] == ["<locals>"]:
        del parts[-1]
    name = ".".join([module, *parts])
    line, _, column, _ = next(
        itertools.islice(code.co_positions(), frame.f_lasti // 2, None), (None, None, None, None)
    )
    place = f"{name}:{frame.f_lineno}"  # no positions (python -X no_debug_ranges)
    if line is not None and column is not None:
        place = f"{name}:{line}:{column + 1}"
    if code.co_filename.startswith("<") or "__file__" not in frame.f_globals:
        return f"{place}:{_digest(code)}"  # typed in (a REPL, a notebook, exec): all line 1
    return place


_INLINED = frozenset({"<module>", "<listcomp>", "<setcomp>", "<dictcomp>"})
"""What a ``qualname`` leaves out of a block's key: comprehensions run inline from Python
3.12 (PEP 709), so one block keeps one key on every version."""


def _digest(code: CodeType) -> str:
    """What ``code`` says (its bytecode, names and constants), alike in every process."""
    text = "\0".join(
        [code.co_qualname, code.co_code.hex(), *code.co_names, _stable(code.co_consts)]
    )
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:8]


def _stable(const: object) -> str:
    if isinstance(const, CodeType):
        return _digest(const)
    if isinstance(const, tuple):
        return "(" + ",".join(_stable(c) for c in const) + ")"
    if isinstance(const, frozenset):  # its order follows the process's string hashing
        return "{" + ",".join(sorted(_stable(c) for c in const)) + "}"
    return repr(const)


def call_site(
    func: Callable[..., Any], parameters: Parameters, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> CallSite:
    """One call's arguments, checked first: a call that cannot bind costs nothing."""
    try:
        parameters.check(args, kwargs)
    except TypeError as exc:
        raise TypeError(f"{function_name(func)}(): {exc}") from None
    return CallSite(parameters, args, kwargs)
