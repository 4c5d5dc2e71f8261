"""Names a module gives only when first asked for (PEP 562), so that importing it does not
import what they need: the Redis engines (redis-py), the metrics hooks (their clients).

Example::

    __getattr__ = lazily(__name__, {"RedisScriptBackend": "ratelimit.backends.redis.script.engine"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazily(module: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``module`` that imports each name of ``where`` from the module
    named beside it when first asked for, and keeps it in ``module`` (asked once)."""

    def __getattr__(name: str) -> Any:
        source = where.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__
