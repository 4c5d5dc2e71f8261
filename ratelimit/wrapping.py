"""What the decorators of ``limit()`` and ``concurrency()`` share: checking what they wrap,
binding a call's arguments for its selectors, and running the wrapped body."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ratelimit.selectors import CallSite, Parameters


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


def call_site(
    func: Callable[..., Any], parameters: Parameters, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> CallSite:
    """One call's arguments, checked first: a call that cannot bind costs nothing."""
    try:
        parameters.check(args, kwargs)
    except TypeError as exc:
        raise TypeError(f"{function_name(func)}(): {exc}") from None
    return CallSite(parameters, args, kwargs)


async def run_body(
    func: Callable[..., Any], is_coroutine: bool, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run the wrapped function; a plain ``def`` returning an awaitable is awaited too."""
    if is_coroutine:
        return await func(*args, **kwargs)
    result = func(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result
